"""The bookkeeping of beamflow.ptycho.gpu.graphs, on a stand-in for CuPy's streams and graphs
(the card itself: tests/ptycho/gpu/test_ptycho_engine_gpu.py::
test_cuda_graphs_replay_the_batches_...).

A batch is run as it is the first time (plans, kernels and pools made outside a capture),
captured and launched the second, replayed after without running its Python; its outputs
are copies; a capture that fails turns graphs off and the batch runs without one."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

from beamflow.ptycho.gpu.graphs import MAX_GRAPHS, BatchGraphs


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
    """CuPy's MemoryPool as the graphs use it: blocks from its allocator, cached when freed,
    and the cache dropped when memory runs short (``short``) before it allocates."""

    def __init__(self, allocator: Any) -> None:
        self.allocator = allocator
        self.short = False
        self.freed = 0

    def malloc(self, size: int) -> Any:
        if self.short:
            self.free_all_blocks()
        return self.allocator(size)

    def free_all_blocks(self) -> None:
        self.freed += 1


class _Allocator:
    """cupy.cuda.using_allocator: the allocator the body's arrays come from."""

    current: Any = None

    def __init__(self, malloc: Any) -> None:
        self.malloc = malloc

    def __enter__(self) -> None:
        _Allocator.current = self.malloc

    def __exit__(self, *exc: Any) -> None:
        _Allocator.current = None


def _cupy() -> Any:
    current = types.SimpleNamespace(synchronize=lambda: None)
    cuda = types.SimpleNamespace(Stream=_Stream, get_current_stream=lambda: current,
                                 MemoryPool=_Pool, using_allocator=_Allocator,
                                 Memory=lambda size: ["device memory", size],
                                 MemoryPointer=lambda memory, offset: memory)
    return types.SimpleNamespace(cuda=cuda)


class _Batch:
    """A batch's body: counts its runs, says whether it ran under a capture."""

    def __init__(self, graphs: BatchGraphs) -> None:
        self.graphs = graphs
        self.runs: list[bool] = []

    def __call__(self) -> list[Any]:
        self.runs.append(self.graphs._stream.capturing)
        if _Allocator.current is not None:  # a temporary of the batch, during a capture
            _Allocator.current(1024)
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
    assert not g.enabled and g._graphs == {} and len(forgotten) >= 2
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


def test_closing_drops_the_graphs_and_frees_their_memory(graphs):
    g, _ = graphs
    body = _Batch(g)
    g.run("k", body)
    g.run("k", body)
    assert g._blocks == [["device memory", 1024]]  # the capture's, from the graphs' pool
    g.close()
    assert g._graphs == {} and not g.enabled and g._pool.freed == 1 and g._blocks == []
    g.run("k", body)
    assert body.runs[-1] is False  # after closing: run as launched from Python


def test_memory_short_during_a_capture_frees_no_block_a_graph_writes(graphs):
    """A pool short of memory drops its cached blocks before it allocates; the blocks of
    the graphs' pool stay allocated all the same, so the earlier graph keeps its memory."""
    g, _ = graphs
    first, second = _Batch(g), _Batch(g)
    for _ in range(2):
        g.run("a", first)
    g._pool.short = True
    for _ in range(2):
        g.run("b", second)
    assert g.enabled and set(g._graphs) == {"a", "b"} and g._pool.freed == 1
    assert len(g._blocks) == 2  # the first capture's block is still held
    g.run("a", first)
    assert first.runs == [False, True] and g.replays == 1
