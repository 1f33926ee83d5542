"""Step 2 of the job, the starting point: a compatible checkpoint's state (resumed, or
continued with more frames: :mod:`beamflow.job.checkpoints` holds the rules), else a fresh
object frame around the scan's positions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from beamflow.job.checkpoints import fingerprint, latest_checkpoint, protected_files, resume
from beamflow.job.load import Inputs
from beamflow.job.models import PROBE_FROM_DATA, ReconstructJob
from beamflow.ptycho.scan_geometry import ScanFrame
from beamflow.ptycho.state import ReconState


@dataclass
class Start:
    """Where the iterations start: a checkpoint's state, or (``state`` None) a fresh one."""

    frame: ScanFrame
    state: ReconState | None
    protect: dict[str, Path]
    resumed_from: int | None = None
    continuation: bool = False
    since: int = 0  # iteration at which the current data set began
    initial_probe: str = PROBE_FROM_DATA
    #: the iteration the engine stops at: ``iterations`` (a count over the current data)
    #: after ``since``
    stop_iteration: int = 0


def starting_point(job: ReconstructJob, inputs: Inputs) -> Start:
    """Resume (or continue) from a compatible checkpoint, else a fresh object frame."""
    ckpt = latest_checkpoint(job)
    assert inputs.loaded is not None
    if ckpt is None:
        scan = inputs.scan
        pixel_size = inputs.propagation.pixel_size_m or scan.object_pixel_size_m
        frame = ScanFrame.for_positions(scan.positions_m, scan.planned_positions_m,
                                        scan.frame_shape[0], job.object_margin_px, pixel_size)
        start = Start(frame=frame, state=None, protect={})
    else:
        current = fingerprint(inputs.scan, inputs.params, inputs.loaded, job, inputs.n)
        back = resume(ckpt, current, inputs.loaded, inputs.params)
        start = Start(frame=back.frame, state=back.state, protect=protected_files(job, ckpt),
                      resumed_from=back.iteration, continuation=back.continuation,
                      since=back.since, initial_probe=back.initial_probe)
    start.stop_iteration = start.since + inputs.params.iterations
    return start
