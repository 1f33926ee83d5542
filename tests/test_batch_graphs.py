"""The bookkeeping of beamflow.ptycho.graphs, on a stand-in for CuPy's streams and graphs
(the card itself: tests/test_ptycho_engine_gpu.py::test_cuda_graphs_replay_the_batches_...).

A batch is run as it is the first time (plans, kernels and pools made outside a capture),
captured and launched the second, replayed after without running its Python; its outputs
are copies; a capture that fails turns graphs off and the batch runs without one."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

from beamflow.ptycho.graphs import MAX_GRAPHS, BatchGraphs


class _Graph:
    def __init__(self, stream: _Stream) -> None:
        self.launches = 0
        self.stream = stream

    def launch(self, stream: Any = None) -> None:
        self.launches += 1


class _Stream:
    def __init__(self, non_blocking: bool = False) -> None:
        self.capturing = False
        self.fail = False

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def begin_capture(self) -> None:
        self.capturing = True

    def end_capture(self) -> _Graph:
        self.capturing = False
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return _Graph(self)


class _Pool:
    def __init__(self) -> None:
        self.freed: list[Any] = []

    def free_all_blocks(self, stream: Any = None) -> None:
        self.freed.append(stream)


def _cupy() -> Any:
    current = types.SimpleNamespace(synchronize=lambda: None)
    cuda = types.SimpleNamespace(Stream=_Stream, get_current_stream=lambda: current)
    pool = _Pool()
    return types.SimpleNamespace(cuda=cuda, get_default_memory_pool=lambda: pool)


class _Batch:
    """A batch's body: counts its runs, says whether it ran under a capture."""

    def __init__(self, graphs: BatchGraphs) -> None:
        self.graphs = graphs
        self.runs: list[bool] = []

    def __call__(self) -> list[Any]:
        self.runs.append(self.graphs._stream.capturing)
        return [np.float32(len(self.runs))]


@pytest.fixture
def graphs() -> tuple[BatchGraphs, list[int]]:
    forgotten: list[int] = []
    return BatchGraphs(_cupy(), lambda: forgotten.append(1)), forgotten


def test_a_batch_runs_then_is_captured_then_replays(graphs):
    g, forgotten = graphs
    body = _Batch(g)
    first = g.run("k", body)
    assert body.runs == [False] and g.captures == 0 and first == [np.float32(1)]
    second = g.run("k", body)
    assert body.runs == [False, True] and g.captures == 1 and forgotten == [1]
    graph, outputs = g._graphs["k"]
    assert graph.launches == 1
    assert second == outputs and second[0] is not outputs[0]  # a copy of the output
    for _ in range(5):
        g.run("k", body)
    assert body.runs == [False, True] and g.replays == 5 and graph.launches == 6


def test_each_key_has_its_own_graph_and_the_oldest_go(graphs):
    g, _ = graphs
    bodies = {k: _Batch(g) for k in range(MAX_GRAPHS + 2)}
    for k, body in bodies.items():
        g.run(k, body)
        g.run(k, body)
    assert len(g._graphs) == MAX_GRAPHS and 0 not in g._graphs and 1 not in g._graphs
    g.run(MAX_GRAPHS + 1, bodies[MAX_GRAPHS + 1])
    assert bodies[MAX_GRAPHS + 1].runs == [False, True]  # replayed, not run


def test_a_failed_capture_turns_graphs_off_and_the_batch_runs_without(graphs, caplog):
    g, forgotten = graphs
    body = _Batch(g)
    g.run("k", body)
    g._stream.fail = True
    out = g.run("k", body)
    assert not g.enabled and g._graphs == {} and len(forgotten) == 2
    assert body.runs == [False, True, False] and out == [np.float32(3)]
    assert "running without graphs" in caplog.text
    g.run("k", body)
    assert body.runs[-1] is False and g.captures == 0


def test_a_batch_that_raises_raises_without_graphs_too(graphs):
    g, _ = graphs

    def broken() -> list[Any]:
        raise ValueError("bad shape")

    with pytest.raises(ValueError, match="bad shape"):
        g.run("k", broken)
    with pytest.raises(ValueError, match="bad shape"):
        g.run("k", broken)  # the capture fails, the rerun raises the batch's own error


def test_closing_drops_the_graphs_and_frees_the_capture_streams_memory(graphs):
    g, _ = graphs
    body = _Batch(g)
    g.run("k", body)
    g.run("k", body)
    g.close()
    assert g._graphs == {} and not g.enabled
    assert g._cp.get_default_memory_pool().freed == [g._stream]  # that stream's only
    g.run("k", body)
    assert body.runs[-1] is False  # after closing: run as launched from Python
