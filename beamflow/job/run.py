"""The job's entry: :func:`run_reconstruction` runs a job as a build of named steps, each in
its own module of this package, read top to bottom in :func:`_run_reconstruction`::

    inputs = load(job)                          1. the scan, its geometry, the frames
    start = starting_point(job, inputs)         2. a checkpoint to resume, or a fresh frame
    given = engine_input(job, inputs, start)    3. the engine's data and starting state
    iterated = iterate(job, inputs, start, given, ...)   4. the engine, with checkpoints
    return finish(job, inputs, start, given, iterated, ...)  5. verdict, previews, product

This is what ``beamflow reconstruct`` and the compute function call::

    job = ReconstructJob(scan=Path("scan_master.h5"), out=Path("out"))
    summary = run_reconstruction(job)        # ReconstructSummary
"""

from __future__ import annotations

import time

from beamflow.formats import load_scan
from beamflow.job.engine_input import engine_input
from beamflow.job.finish import finish
from beamflow.job.iterate import iterate
from beamflow.job.live_previews import LivePreviews
from beamflow.job.load import load, scan_propagation
from beamflow.job.models import ProgressCallback, ReconstructJob, ReconstructSummary, check_out_dir
from beamflow.job.start import starting_point
from beamflow.ptycho.quality.verdict import regime_findings
from beamflow.ptycho.scan_geometry import ScanFrame


def run_reconstruction(job: ReconstructJob, progress: ProgressCallback | None = None
                       ) -> ReconstructSummary:
    """Run (or resume, or continue) the reconstruction `job` describes."""
    check_out_dir(job.out)
    # Live previews are drawn by a helper process (see beamflow.job.live_previews), started now
    # so that its imports overlap the reading of the frames; the final previews are drawn
    # here, once the engine's memory is released.
    live = LivePreviews(job.out / "previews")
    if job.preview_every:
        live.start()
    try:
        return _run_reconstruction(job, progress, live)
    finally:
        live.close()


def _run_reconstruction(job: ReconstructJob, progress: ProgressCallback | None,
                        live: LivePreviews) -> ReconstructSummary:
    """The job's steps: load the scan, find where to start, prepare the engine's input,
    iterate, finish. A divergence is told with the cause the data and geometry point to."""
    t_start = time.perf_counter()
    inputs = load(job)
    start = starting_point(job, inputs)
    given = engine_input(job, inputs, start)
    try:
        iterated = iterate(job, inputs, start, given, progress, live)
    except FloatingPointError as e:  # diverged: say what the data and geometry suggest
        causes = regime_findings(inputs.propagation, given.regime, loose=True) + inputs.notes
        if not causes:
            raise
        raise FloatingPointError(" ".join([str(e) + ".", *causes])) from e
    return finish(job, inputs, start, given, iterated, t_start)



#: What the previews of a run take on disk, about (five PNGs of ~0.1-0.3 MB).
PREVIEW_BYTES = 2_000_000


def written_bytes_estimate(job: ReconstructJob) -> int:
    """About how many bytes a run of ``job`` writes beside its scan: its checkpoints (those
    kept, and one being written) and its product, each about one state (the object's layers
    and the probe modes, complex64, and the positions), and its previews. Read from the scan file's
    geometry and positions, without its frames."""
    scan = load_scan(job.scan, max_frames=job.max_frames, allow_partial=True)
    propagation, _ = scan_propagation(job, scan)
    frame = ScanFrame.for_positions(
        scan.positions_m, scan.planned_positions_m, scan.frame_shape[0], job.object_margin_px,
        propagation.pixel_size_m or scan.object_pixel_size_m)
    h, w = frame.object_shape
    pixels = (job.params.slices * h * w
              + job.params.for_propagation(propagation).probe_modes_value
              * scan.frame_shape[0] * scan.frame_shape[1])
    state = 8 * pixels + 16 * len(scan.planned_positions_m)
    return state * (job.checkpoint_keep + 2) + PREVIEW_BYTES
