"""The job never waits for a snapshot's copy to the host: checkpoints and live previews go on
while it lands, on a stand-in backend whose copies land only when the test lets them (as a
GPU's device→host copies on a side stream land while the device goes on). A SIGTERM while a
copy is pending still saves the newest state and exits 143."""

from __future__ import annotations

import itertools
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
from job_kit import scan_with_its_probe

from beamflow.checkpoint import list_checkpoints, load_latest, read_checkpoint
from beamflow.job import iterate as iterate_step
from beamflow.job.live_previews import LivePreviews
from beamflow.job.models import ReconstructJob
from beamflow.job.run import run_reconstruction
from beamflow.ptycho.arrays import ArrayBackend, HostCopy

HANG_GUARD_S = 60.0  # only so that a loop that waits for the copy fails instead of hanging


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("detector")
    return scan_with_its_probe(root, "s", positions=40, probe_size=32, photons=2e5, seed=3,
                               frames_per_file=20)


def job(scan: Path, out: Path, **kw) -> ReconstructJob:
    # No CPU budget for the writer: which iterations are saved must not depend on timing.
    base = dict(scan=scan, out=out, device="cpu", threads=2, iterations=8, batch=8,
                checkpoint_every=2, checkpoint_max_overhead=None, checkpoint_keep=100,
                preview_every=0, preview_min_seconds=0, handle_sigterm=False,
                probe=scan.parent.parent / "probe.npy")
    base.update(kw)
    return ReconstructJob(**base)


def object_at(scan: Path, out: Path, iteration: int) -> np.ndarray:
    """The object after `iteration` iterations of an undisturbed run (its final checkpoint)."""
    run_reconstruction(job(scan, out, iterations=iteration, checkpoint_every=0))
    ck = load_latest(out / "checkpoints")
    assert ck.iteration == iteration
    return ck.arrays["object"]


class Timeline:
    """What happened, in order: iterations done, copies started and landed."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def done_while_pending(self) -> list[int]:
        """The iterations completed after the first held copy started, before it landed."""
        kinds = [k for k, _ in self.events]
        start, end = kinds.index("copy started"), kinds.index("copy landed")
        return [it for k, it in self.events[start:end] if k == "iteration"]


class HeldCopy(HostCopy):
    """A device→host copy that lands only once the gate opens."""

    def __init__(self, copy: HostCopy, gate: threading.Event, timeline: Timeline) -> None:
        super().__init__(copy.result())
        self.gate, self.timeline = gate, timeline
        timeline.events.append(("copy started", 0))

    def result(self) -> np.ndarray:
        assert self.gate.wait(HANG_GUARD_S), "the copy was never let through"
        self.timeline.events.append(("copy landed", 0))
        return super().result()


def slow_copies(monkeypatch: pytest.MonkeyPatch, held: int, gate: threading.Event,
                timeline: Timeline) -> None:
    """The job's backend holds its first `held` host copies until `gate` opens."""
    real = iterate_step.array_backend

    def backend(*args, **kwargs) -> ArrayBackend:
        be = real(*args, **kwargs)
        host_copy, count = be.host_copy_async, itertools.count()

        def held_copy(a):
            copy = host_copy(a)
            return HeldCopy(copy, gate, timeline) if next(count) < held else copy

        be.host_copy_async = held_copy
        return be

    monkeypatch.setattr(iterate_step, "array_backend", backend)


def test_iterations_go_on_while_a_checkpoint_and_a_preview_copy_is_pending(
        scan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy for the checkpoint and preview due at iteration 2 is held until iteration 5
    is done: the loop runs on meanwhile, starts no second copy, and the held state, once it
    lands, is the one saved and drawn (iteration 2's, bit for bit)."""
    expected = object_at(scan, tmp_path / "reference", 2)
    gate, timeline = threading.Event(), Timeline()
    slow_copies(monkeypatch, held=2, gate=gate, timeline=timeline)  # object and probe
    handed: list[tuple[str, np.ndarray]] = []
    submit = LivePreviews.submit

    def recorded(self, obj, probe, losses, title, *args, **kwargs):
        handed.append((title, obj.copy()))
        return submit(self, obj, probe, losses, title, *args, **kwargs)

    monkeypatch.setattr(LivePreviews, "submit", recorded)

    def progress(done: int, total: int, loss: float | None) -> None:
        timeline.events.append(("iteration", done))
        if done == 5:
            gate.set()

    out = tmp_path / "out"
    s = run_reconstruction(job(scan, out, preview_every=2), progress=progress)

    assert s.iterations == 8 and s.checkpoint_errors == []
    assert timeline.done_while_pending()[:4] == [2, 3, 4, 5]  # 3, 4, 5 ran on meanwhile
    # nothing started while the copy was in flight (the preview due at 4 stayed due)
    saved = sorted(it for it, _ in list_checkpoints(out / "checkpoints"))
    assert saved[0] == 2 and saved[-1] == 8 and not any(2 < it <= 5 for it in saved), saved
    titles = [title for title, _ in handed]
    assert titles[0].endswith("iteration 2"), titles
    assert not any(t.endswith(f"iteration {it}") for t in titles for it in (3, 4, 5)), titles
    # what landed late is iteration 2's state, in the checkpoint and in the preview
    (path,) = [p for it, p in list_checkpoints(out / "checkpoints") if it == 2]
    np.testing.assert_array_equal(read_checkpoint(path).arrays["object"], expected)
    np.testing.assert_array_equal(handed[0][1], expected)
    assert load_latest(out / "checkpoints").iteration == 8  # the final one is the newest


def test_sigterm_while_a_copy_is_pending_saves_the_newest_state_and_exits_143(
        scan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM after iteration 3, while iteration 2's copy is still held: the job saves
    iteration 4 itself, never the older held state, and exits 143; a resume starts at 4."""
    expected = object_at(scan, tmp_path / "reference", 4)
    gate, timeline = threading.Event(), Timeline()
    slow_copies(monkeypatch, held=2, gate=gate, timeline=timeline)

    def progress(done: int, total: int, loss: float | None) -> None:
        if done == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    out = tmp_path / "out"
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as stopped:
            run_reconstruction(job(scan, out, handle_sigterm=True), progress=progress)
    finally:
        gate.set()  # the abandoned copy lands now; its state must go nowhere
        for thread in threading.enumerate():
            if thread.name == "snapshot-consumer":
                thread.join(HANG_GUARD_S)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler is uninstalled
    assert [it for it, _ in list_checkpoints(out / "checkpoints")] == [4]
    ck = load_latest(out / "checkpoints")
    assert ck.meta["state"]["iteration"] == 4
    np.testing.assert_array_equal(ck.arrays["object"], expected)
    s = run_reconstruction(job(scan, out, iterations=6))
    assert s.resumed_from_iteration == 4
