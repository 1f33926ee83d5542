"""Step 4 of the job, iterate: the engine's loop (:func:`iterate`) with its checkpoints,
live previews and progress, and when a live preview is due (:class:`_PreviewCadence`)."""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from beamflow.checkpoint import Checkpointer, TerminationGuard
from beamflow.job.checkpoints import job_meta
from beamflow.job.engine_input import EngineInput, release_freed_memory
from beamflow.job.live_previews import LivePreviews
from beamflow.job.load import Inputs
from beamflow.job.models import ProgressCallback, ReconstructJob
from beamflow.job.snapshots import SnapshotConsumer
from beamflow.job.start import Start
from beamflow.ptycho.arrays import array_backend
from beamflow.ptycho.engine import Reconstructor
from beamflow.ptycho.state import ReconState

log = logging.getLogger(__name__)


@dataclass
class Iterated:
    """The engine's final state and what the iterations left behind."""

    final: ReconState
    start_iteration: int
    device: str
    fft: str
    times: list[float] = field(default_factory=list)
    checkpoint_file: str | None = None
    checkpoint_errors: list[str] = field(default_factory=list)
    live_previews: dict[str, Path] = field(default_factory=dict)


def iterate(job: ReconstructJob, inputs: Inputs, start: Start, given: EngineInput,
            progress: ProgressCallback | None, live: LivePreviews) -> Iterated:
    """Run the engine to the iteration to stop at: checkpoints as the policy says them (and one
    on SIGTERM, then exit 143), live previews, progress; a final checkpoint at the end.

    A due checkpoint or preview starts a copy of the state to the host and goes on; the
    snapshot consumer (:mod:`beamflow.job.snapshots`) waits for the copy and hands the
    state to the checkpointer and the preview helper. With a snapshot still in flight, what
    is due stays due: the iterations never wait for a copy."""
    backend = array_backend(job.device, threads=job.threads)
    log.info("device %s, %d thread(s), FFTs: %s", backend.name, backend.threads, backend.fft)
    job.out.mkdir(parents=True, exist_ok=True)
    scan, frame, stop_iteration = inputs.scan, start.frame, start.stop_iteration

    def meta_of(state: ReconState) -> dict[str, Any]:
        return {"state": state.meta(),
                "job": job_meta(frame, start.since, scan, start.initial_probe)}

    assert given.state is not None
    start_iteration = given.state.iteration
    ck = Checkpointer(job.policy(), fingerprint=given.fingerprint,
                      start_iteration=start_iteration, protect=start.protect)
    guard: TerminationGuard | None = None
    if job.handle_sigterm and threading.current_thread() is threading.main_thread():
        guard = TerminationGuard(ck, defer=True).install()
    snapshots: SnapshotConsumer[ReconState] = SnapshotConsumer()
    previews = _PreviewCadence(job, start_iteration, stop_iteration)
    times: list[float] = []

    def hand_over(state: ReconState, levels: set[str], preview: bool) -> None:
        """On the consumer's thread, once the state is on the host."""
        if levels:
            ck.save(state.iteration, state.to_host_arrays(), meta_of(state), levels=levels)
        if preview:
            live.submit(state.object, state.probe, state.loss_history,
                        inputs.title(state.iteration), frame.pixel_size_m,
                        scan_extent_px=given.extent, positions_px=state.positions_px,
                        noise_floor=given.regime.noise_floor,
                        opr_weights=state.extras.get("opr_weights"),
                        spacings_m=inputs.params.slice_spacings)

    try:
        # The engine turns the frames into amplitudes in place (on the GPU it copies them
        # to the device): the frames are never held twice, and `data` is spent.
        with Reconstructor(given.data, given.state, backend, consume_data=True) as rec:
            # The engine holds its own copy of the state: drop ours (the initial object, a
            # resumed checkpoint's arrays) with the spent data before the iterations start.
            last_loss = given.state.loss_history[-1] if given.state.loss_history else None
            given.data = given.state = None
            release_freed_memory()

            def callback(view: Any, info: dict[str, Any]) -> None:
                # wall time between callbacks: the iteration plus what we do here
                now = time.perf_counter()
                times.append(now - t_iter[0])
                t_iter[0] = now
                it = int(info["iteration"])
                if guard is not None and guard.requested:
                    # A copy in flight holds an older state: drop it, save this one, here.
                    snapshots.abandon()
                    state = rec.snapshot()
                    ck.save(it, state.to_host_arrays(), meta_of(state))
                    guard.exit()  # flush, exit 143
                if not snapshots.in_flight():  # else what is due stays due
                    levels, preview = ck.ready_levels(it), previews.due(it)
                    if levels or preview:  # one copy serves both
                        snapshots.submit(rec.snapshot_async(),
                                         lambda state: hand_over(state, levels, preview))
                if progress is not None:
                    progress(it, stop_iteration, float(info["loss"]))

            if progress is not None:
                progress(start_iteration, stop_iteration, last_loss)
            t_iter = [time.perf_counter()]
            final = rec.run(max(0, stop_iteration - start_iteration), callback=callback)
        snapshots.close()  # the snapshot in hand is saved before the final one
        ck.finalize(final.iteration, final.to_host_arrays, meta_of(final))
    finally:
        snapshots.close()  # after an error too: the copy in hand is saved (not if abandoned)
        ck.close()
        live.close()  # before the final previews: they are the same files
        if guard is not None:
            guard.uninstall()
    # release the engine's copy of the frames before rendering and writing
    rec = None  # noqa: F841 - the callbacks' closure cell keeps it alive otherwise
    l2 = ck.committed.get("L2")
    return Iterated(final=final, start_iteration=start_iteration, device=backend.name,
                    fft=backend.fft, times=times,
                    checkpoint_file=str(job.l2_dir / l2.file) if l2 is not None else None,
                    checkpoint_errors=[str(e) for e in ck.errors],
                    live_previews=dict(live.files))


class _PreviewCadence:
    """When a live preview is due: every ``preview_every`` iterations from the start, at
    most once per ``preview_min_seconds`` (one that comes too soon waits for the next
    multiple), never at the iteration to stop at (the final previews are drawn then).
    ``due`` takes the preview: a caller that cannot take it (a snapshot in flight) does not
    ask, and it stays due."""

    def __init__(self, job: ReconstructJob, start_iteration: int, stop_iteration: int) -> None:
        self.every, self.min_seconds = job.preview_every, job.preview_min_seconds
        self.start, self.stop_iteration = start_iteration, stop_iteration
        self.next = start_iteration + self.every
        self.last = -math.inf  # time.monotonic() of the last one

    def due(self, iteration: int) -> bool:
        if not self.every or iteration < self.next or iteration >= self.stop_iteration:
            return False
        # the next multiple of `every` after this iteration, whether this one is taken or not
        self.next = self.start + ((iteration - self.start) // self.every + 1) * self.every
        if time.monotonic() - self.last < self.min_seconds:
            return False
        self.last = time.monotonic()
        return True
