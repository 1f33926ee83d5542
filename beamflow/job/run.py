"""The reconstruction job: scan file in -> engine with checkpoints -> product + previews out.

This is what ``beamflow reconstruct`` and the compute functions call::

    job = ReconstructJob(scan=Path("scan_master.h5"), out=Path("out"))
    summary = run_reconstruction(job)        # ReconstructSummary

The job, the summary and the errors are described in :mod:`beamflow.job.models`; this
module runs a job, as a list of named steps (:func:`_run_reconstruction`): load the scan,
find the starting point (a checkpoint or a fresh object), prepare the engine's data and
state, iterate with checkpoints and live previews, finish (previews, verdict, product).

Output directory::

    DIR/product.h5              Ptychodus product (written at the end)
    DIR/previews/*.png          object phase (windowed and full range), amplitude, probe,
                                convergence (refreshed every few iterations and at the end)
    DIR/checkpoints/            L2 checkpoints + LATEST.json (beamflow.checkpoint)

Resuming: when ``DIR/checkpoints`` (or the node-local L1 level) holds a checkpoint, the job
continues from it if it is compatible (:mod:`beamflow.job.checkpoints` holds the rules):
the same geometry, frame shape, probe modes and algorithm (hard; a mismatch is refused with
the differences named), the same frames or MORE frames of the same scan (the stored frames
are a prefix of the current ones: the reconstruction goes on with the new positions
appended). Other settings (step sizes, iteration budget, batch size) may change; the
differences are logged.

``iterations`` counts iterations over the current data: a fresh run or a resume of the same
data stops at ``iterations`` in total; a continuation with more frames runs ``iterations``
more from the iteration where the frames were added. Resuming is exact: N iterations straight
and k + kill + resume + N-k give bit-identical results (numpy backend, same thread count).
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from beamflow.checkpoint import Checkpointer, TerminationGuard, load_latest
from beamflow.formats import (
    Product,
    Scan,
    ScanFormatError,
    invalid_counts,
    load_scan,
    write_product,
)
from beamflow.job.checkpoints import (
    LoadedData,
    fingerprint,
    frame_of,
    job_meta,
    latest_checkpoint,
    protected_files,
    resume,
)
from beamflow.job.live_previews import LivePreviews
from beamflow.job.models import (
    PROBE_FROM_DATA,
    PROBE_FROM_FILE,
    PROBE_FROM_OPTICS,
    Progress,
    ReconstructError,
    ReconstructJob,
    ReconstructSummary,
    check_out_dir,
    length_text,
    plain_words,
    settings_used,
)
from beamflow.job.snapshots import SnapshotConsumer
from beamflow.ptycho.arrays import array_backend
from beamflow.ptycho.engine import Reconstructor, initial_state, mean_pattern
from beamflow.ptycho.forward.propagation import Propagation, near_field_geometry
from beamflow.ptycho.forward.slices import slice_spacings
from beamflow.ptycho.scan_geometry import ScanFrame, scan_extent
from beamflow.ptycho.state import PtychoData, ReconParams, ReconState
from beamflow.ptycho.verdict import DataRegime, Verdict, judge, measure_data, regime_findings

log = logging.getLogger(__name__)

_READ_CHUNK = 32  # frames read at a time: small transients, not 2x the frames


def run_reconstruction(job: ReconstructJob, progress: Progress | None = None) -> ReconstructSummary:
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


def _run_reconstruction(job: ReconstructJob, progress: Progress | None,
                        live: LivePreviews) -> ReconstructSummary:
    """The job's steps: load the scan, find where to start, prepare the engine's input,
    iterate, finish. A divergence is told with the cause the data and geometry point to."""
    t_start = time.perf_counter()
    inputs = _load(job)
    start = _starting_point(job, inputs)
    engine_input = _prepare(job, inputs, start)
    try:
        result = _iterate(job, inputs, start, engine_input, progress, live)
    except FloatingPointError as e:  # diverged: say what the data and geometry suggest
        causes = regime_findings(inputs.propagation, engine_input.regime,
                                 loose=True) + inputs.notes
        if not causes:
            raise
        raise FloatingPointError(" ".join([str(e) + ".", *causes])) from e
    return _finish(job, inputs, start, engine_input, result, t_start)


#: What the previews of a run take on disk, about (five PNGs of ~0.1-0.3 MB).
PREVIEW_BYTES = 2_000_000


def written_bytes_estimate(job: ReconstructJob) -> int:
    """About how many bytes a run of ``job`` writes beside its scan: its checkpoints (those
    kept, and one being written) and its product, each about one state (the object's layers
    and the probe modes, complex64, and the positions), and its previews. Read from the scan file's
    geometry and positions, without its frames."""
    scan = load_scan(job.scan, max_frames=job.max_frames, allow_partial=True)
    propagation, _ = _propagation(job, scan)
    frame = ScanFrame.for_positions(
        scan.positions_m, scan.planned_positions_m, scan.frame_shape[0], job.object_margin_px,
        propagation.pixel_size_m or scan.object_pixel_size_m)
    h, w = frame.object_shape
    pixels = (job.params.slices * h * w
              + job.params.probe_modes * scan.frame_shape[0] * scan.frame_shape[1])
    state = 8 * pixels + 16 * len(scan.planned_positions_m)
    return state * (job.checkpoint_keep + 2) + PREVIEW_BYTES


# --------------------------------------------------------------------------- 1. load


@dataclass
class _Inputs:
    """The scan, the settings the job runs with, and the frames (until the engine has them)."""

    scan: Scan
    params: ReconParams  # the job's, with the propagation model of this scan's geometry
    focus_distance_m: float | None
    loaded: LoadedData | None
    #: what the geometry asks the user to check (said with any failure and a suspect result)
    notes: list[str] = field(default_factory=list)

    @property
    def propagation(self) -> Propagation:
        return self.params.propagation

    @property
    def n(self) -> int:
        return self.scan.n_frames

    def title(self, iteration: int) -> str:
        return f"{self.scan.name} · {self.params.algorithm} · iteration {iteration}"


def _load(job: ReconstructJob) -> _Inputs:
    """The scan, its propagation model in the engine's geometry, and all its frames."""
    scan = load_scan(job.scan, max_frames=job.max_frames, allow_partial=job.allow_partial)
    propagation, focus_distance = _propagation(job, scan)
    params = job.params.model_copy(update={"propagation": propagation})
    return _Inputs(scan=scan, params=params, focus_distance_m=focus_distance,
                   loaded=LoadedData(scan, _read_frames(scan)),
                   notes=_geometry_notes(scan, propagation, focus_distance))


def _read_frames(scan: Scan) -> np.ndarray:
    """All frames into one preallocated float32 array (read in chunks: no second copy)."""
    n = scan.n_frames
    out = np.empty((n, *scan.frame_shape), np.float32)
    for s in range(0, n, _READ_CHUNK):
        out[s:min(n, s + _READ_CHUNK)] = scan.frames(s, min(n, s + _READ_CHUNK))
    return out


def _propagation(job: ReconstructJob, scan: Scan) -> tuple[Propagation, float | None]:
    """The propagation model in the engine's geometry, and the focus distance it used.

    The job's choice, else the scan file's, else far field. Near field with a focus distance
    z1 (a cone beam) is reduced to a parallel beam by the Fresnel scaling theorem.
    """
    g = scan.geometry
    model = job.propagation or scan.propagation or "far-field"
    if model == "far-field":
        if job.focus_distance_m is not None:
            log.warning("focus distance %.4g m ignored: it only applies to near-field "
                        "propagation", job.focus_distance_m)
        # The layers of a thick sample are propagated between on the object's grid.
        return Propagation(wavelength_m=g.wavelength_m,
                           pixel_size_m=scan.object_pixel_size_m), None
    focus = job.focus_distance_m or scan.focus_distance_m
    dx, z_eff, mag = near_field_geometry(g.detector_pixel_size_m, g.distance_m, focus)
    log.info("near field: %s, magnification %.4g, object pixel %s, effective distance %s",
             "cone beam" if focus else "parallel beam", mag, length_text(dx),
             length_text(z_eff))
    return Propagation(model="near-field", wavelength_m=g.wavelength_m, distance_m=z_eff,
                       pixel_size_m=dx), focus


def _geometry_notes(scan: Scan, propagation: Propagation, focus: float | None) -> list[str]:
    """What the user should check of the geometry: a near field without a focus distance
    reconstructs at the detector's pixel, right only for a parallel beam."""
    if not propagation.near_field or focus is not None:
        return []
    pixel = length_text(scan.geometry.detector_pixel_size_m)
    note = (f"Near field without a focus distance: the object pixel is the detector pixel "
            f"({pixel}), as for a parallel beam. If a zone plate or mirrors focus the beam "
            "before the sample, give --focus-distance (focus-to-sample, in metres): the cone "
            "beam magnifies the sample (z1 + z2)/z1 times onto the detector, and the object "
            "pixel is the detector pixel divided by that.")
    log.warning("%s: %s", scan.source, note)
    return [note]


# --------------------------------------------------------------------------- 2. start


@dataclass
class _Start:
    """Where the iterations start: a checkpoint's state, or (``state`` None) a fresh one."""

    frame: ScanFrame
    state: ReconState | None
    protect: dict[str, Path]
    resumed_from: int | None = None
    continuation: bool = False
    since: int = 0  # iteration at which the current data set began
    initial_probe: str = PROBE_FROM_DATA
    target: int = 0  # the iteration count to stop at


def _starting_point(job: ReconstructJob, inputs: _Inputs) -> _Start:
    """Resume (or continue) from a compatible checkpoint, else a fresh object frame."""
    ckpt = latest_checkpoint(job)
    assert inputs.loaded is not None
    if ckpt is None:
        scan = inputs.scan
        pixel_size = inputs.propagation.pixel_size_m or scan.object_pixel_size_m
        frame = ScanFrame.for_positions(scan.positions_m, scan.planned_positions_m,
                                        scan.frame_shape[0], job.object_margin_px, pixel_size)
        start = _Start(frame=frame, state=None, protect={})
    else:
        current = fingerprint(inputs.scan, inputs.params, inputs.loaded, job, inputs.n)
        back = resume(ckpt, current, inputs.loaded, inputs.params)
        start = _Start(frame=back.frame, state=back.state, protect=protected_files(job, ckpt),
                       resumed_from=back.iteration, continuation=back.continuation,
                       since=back.since, initial_probe=back.initial_probe)
    start.target = start.since + inputs.params.iterations
    return start


# --------------------------------------------------------------------------- 3. prepare


@dataclass
class _EngineInput:
    """What the engine is handed; it takes both over (``data`` and ``state`` are dropped
    here once it has them, so that the frames are never held twice)."""

    data: PtychoData | None
    state: ReconState | None
    regime: DataRegime
    fingerprint: dict[str, Any]
    extent: tuple[int, int, int, int]


def _prepare(job: ReconstructJob, inputs: _Inputs, start: _Start) -> _EngineInput:
    """The measured data in the engine's form, what they say of their regime, the starting
    state (the checkpoint's, or a fresh one from the initial probe) and the fingerprint."""
    loaded, scan = inputs.loaded, inputs.scan
    assert loaded is not None
    run_params = inputs.params.model_copy(update={"iterations": start.target})
    # positions already refined by position correction stay as the state has them
    nominal = start.frame.corners(scan.positions_m)
    try:
        data = PtychoData(intensities=loaded.frames, positions_px=nominal,
                          object_shape=start.frame.object_shape, mask=scan.mask)
    except ValueError as e:
        # Bad counts live in a data file: name it, and the frame as that file numbers it.
        bad = _bad_frame(scan, loaded.frames)
        if bad is not None:
            raise bad from None
        raise ReconstructError(f"{scan.source}: {plain_words(str(e))}") from e
    loaded.frames = data.intensities  # the same array (no copy): one reference only
    # What the data say of their regime and noise, before the engine spends the frames.
    regime = measure_data(data.intensities, data.positions_px, mean_pattern(data), data.mask)
    state, start.state = start.state, None
    if state is None:
        probe0, start.initial_probe = _initial_probe(job, scan, inputs.params)
        state = initial_state(data, run_params, probe=probe0)
    else:
        state.params = run_params
    prints = fingerprint(scan, inputs.params, loaded, job, inputs.n)
    inputs.loaded = None  # the frames stay referenced by `data` only (and the engine's copy)
    _release_freed_memory()
    return _EngineInput(data=data, state=state, regime=regime, fingerprint=prints,
                        extent=scan_extent(data.positions_px, start.frame.frame_size))


def _bad_frame(scan: Scan, frames: np.ndarray) -> ScanFormatError | None:
    """The first frame with a NaN, an infinity or a negative count on a valid pixel, named
    by its data file and its number there (1-based where the file counts from 1)."""
    mask = scan.mask
    for start in range(0, frames.shape[0], 64):
        found = invalid_counts(frames[start : start + 64][:, mask])
        if found is None:
            continue
        what, row = found
        index = start + row
        file, key, where = scan.locate(index)
        return ScanFormatError(
            file, key, f"{where}: {what} on a valid detector pixel; mark such pixels "
            "invalid in the detector's pixel mask (or fix the file)"
        )
    return None


def _initial_probe(job: ReconstructJob, scan: Scan, params: ReconParams
                   ) -> tuple[np.ndarray | None, str]:
    """The starting probe and where it came from (first that applies):

    ``--probe`` file → the zone plate and defocus the scan file records (``scan.optics``) →
    None, for the engine's guess from the mean diffraction. The engine scales the probe to
    the data's counts and makes the configured number of modes from it (initial_state).
    """
    from beamflow.ptycho.probe import ZonePlate, load_probe, zone_plate_probe

    if job.probe is not None:
        try:
            return load_probe(job.probe, frame_size=scan.frame_shape[0],
                              n_modes=params.probe_modes,
                              pixel_size_m=scan.object_pixel_size_m), PROBE_FROM_FILE
        except ValueError as e:
            raise ReconstructError(plain_words(str(e))) from e
    optics = scan.optics
    if optics is not None and params.propagation.near_field:
        log.info("initial probe: the recorded zone plate is not used in the near field")
        optics = None
    if optics is not None:
        try:
            probe = zone_plate_probe(
                scan.frame_shape[0], scan.object_pixel_size_m, scan.geometry.energy_eV,
                ZonePlate(diameter_m=optics.diameter_m,
                          outer_zone_width_m=optics.outer_zone_width_m,
                          central_stop_fraction=optics.central_stop_fraction),
                optics.defocus_m)
        except ValueError as e:  # e.g. a defocused beam wider than the window: fall back
            log.warning("%s: no probe from the recorded optics (%s); using the mean "
                        "diffraction", scan.source, e)
        else:
            log.info("initial probe: zone plate D=%.4g µm, d_r=%.4g nm, stop %.2f, "
                     "defocus %.4g mm (from %s)", optics.diameter_m * 1e6,
                     optics.outer_zone_width_m * 1e9, optics.central_stop_fraction,
                     optics.defocus_m * 1e3, scan.source.name)
            return probe, PROBE_FROM_OPTICS
    log.info("initial probe: from the mean %s (no --probe, no recorded optics)",
             "hologram" if params.propagation.near_field else "diffraction")
    return None, PROBE_FROM_DATA


def _release_freed_memory() -> None:
    """Hand freed heap memory back to the OS (glibc only; a no-op elsewhere).

    Setup makes frame-block temporaries; glibc keeps such freed blocks in the heap (its mmap
    threshold adapts upwards), so they would sit under the engine's large allocations and
    raise the peak RSS by tens of MB.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------- 4. iterate


@dataclass
class _Iterated:
    """The engine's final state and what the iterations left behind."""

    final: ReconState
    start_iteration: int
    device: str
    fft: str
    times: list[float] = field(default_factory=list)
    checkpoint_file: str | None = None
    checkpoint_errors: list[str] = field(default_factory=list)
    live_previews: dict[str, Path] = field(default_factory=dict)


def _iterate(job: ReconstructJob, inputs: _Inputs, start: _Start, given: _EngineInput,
             progress: Progress | None, live: LivePreviews) -> _Iterated:
    """Run the engine to the target iteration: checkpoints as the policy says them (and one
    on SIGTERM, then exit 143), live previews, progress; a final checkpoint at the end.

    A due checkpoint or preview starts a copy of the state to the host and goes on; the
    snapshot consumer (:mod:`beamflow.job.snapshots`) waits for the copy and hands the
    state to the checkpointer and the preview helper. With a snapshot still in flight, what
    is due stays due: the iterations never wait for a copy."""
    backend = array_backend(job.device, threads=job.threads)
    log.info("device %s, %d thread(s), FFTs: %s", backend.name, backend.threads, backend.fft)
    job.out.mkdir(parents=True, exist_ok=True)
    scan, frame, target = inputs.scan, start.frame, start.target

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
    previews = _PreviewCadence(job, start_iteration, target)
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
            _release_freed_memory()

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
                    progress(it, target, float(info["loss"]))

            if progress is not None:
                progress(start_iteration, target, last_loss)
            t_iter = [time.perf_counter()]
            final = rec.run(max(0, target - start_iteration), callback=callback)
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
    return _Iterated(final=final, start_iteration=start_iteration, device=backend.name,
                     fft=backend.fft, times=times,
                     checkpoint_file=str(job.l2_dir / l2.file) if l2 is not None else None,
                     checkpoint_errors=[str(e) for e in ck.errors],
                     live_previews=dict(live.files))


class _PreviewCadence:
    """When a live preview is due: every ``preview_every`` iterations from the start, at
    most once per ``preview_min_seconds`` (one that comes too soon waits for the next
    multiple), never at the target (the final previews are drawn then). ``due`` takes the
    preview: a caller that cannot take it (a snapshot in flight) does not ask, and it stays
    due."""

    def __init__(self, job: ReconstructJob, start_iteration: int, target: int) -> None:
        self.every, self.min_seconds = job.preview_every, job.preview_min_seconds
        self.start, self.target = start_iteration, target
        self.next = start_iteration + self.every
        self.last = -math.inf  # time.monotonic() of the last one

    def due(self, iteration: int) -> bool:
        if not self.every or iteration < self.next or iteration >= self.target:
            return False
        # the next multiple of `every` after this iteration, whether this one is taken or not
        self.next = self.start + ((iteration - self.start) // self.every + 1) * self.every
        if time.monotonic() - self.last < self.min_seconds:
            return False
        self.last = time.monotonic()
        return True


# --------------------------------------------------------------------------- 5. finish


def _finish(job: ReconstructJob, inputs: _Inputs, start: _Start, given: _EngineInput,
            run: _Iterated, t_start: float) -> ReconstructSummary:
    """Previews, the verdict and the product of the final state; the summary."""
    final, scan = run.final, inputs.scan
    verdict = judge(obj=final.object, probe=final.probe, positions_px=final.positions_px,
                    loss_history=final.loss_history, propagation=inputs.propagation,
                    data=given.regime)
    notes = inputs.notes + verdict.notes
    if verdict.verdict == "suspect":
        verdict.reasons += notes
        log.warning("%s: the result is SUSPECT: %s", scan.source, " ".join(verdict.reasons))
    else:
        log.info("%s: the result is trusted", scan.source)
    previews = dict(run.live_previews)
    previews.update(_final_previews(job, inputs, start.frame, given, final,
                                    suspect=verdict.verdict == "suspect"))
    product_path = _write_product(job, inputs, start, final, verdict)
    times = run.times
    return ReconstructSummary(
        iterations=final.iteration,
        iterations_this_run=final.iteration - run.start_iteration,
        seconds_per_iteration=statistics.median(times[1:]) if len(times) > 1 else (
            times[0] if times else None),
        final_loss=final.loss_history[-1] if final.loss_history else None,
        device=run.device,
        fft=run.fft,
        product=str(product_path),
        previews=[str(p) for p in previews.values()],
        resumed_from_iteration=start.resumed_from,
        continuation=start.continuation,
        checkpoint=run.checkpoint_file,
        checkpoint_errors=run.checkpoint_errors,
        n_frames=inputs.n,
        algorithm=inputs.params.algorithm,
        seconds=time.perf_counter() - t_start,
        initial_probe=start.initial_probe,
        propagation=inputs.propagation.model,
        focus_distance_m=inputs.focus_distance_m,
        object_pixel_size_m=start.frame.pixel_size_m,
        verdict=verdict.verdict,
        verdict_reasons=verdict.reasons,
        verdict_metrics=verdict.metrics,
        notes=notes,
        parameters=settings_used(inputs.params, inputs.n),
    )


def _final_previews(job: ReconstructJob, inputs: _Inputs, frame: ScanFrame,
                    given: _EngineInput, final: ReconState, suspect: bool) -> dict[str, Path]:
    """The previews of the final state, marked SUSPECT when the verdict is (none of a
    diverged state: it is reported instead)."""
    from beamflow.ptycho.previews import write_previews

    try:
        previews = write_previews(
            job.out / "previews", final.object, final.probe, frame.pixel_size_m,
            final.loss_history, scan_extent_px=given.extent,
            title=inputs.title(final.iteration), positions_px=final.positions_px,
            noise_floor=given.regime.noise_floor, suspect=suspect,
            spacings_m=inputs.params.slice_spacings)
        if "opr_weights" in final.extras:  # the variable probe: its weights along the scan
            from beamflow.ptycho.opr_previews import write_opr_preview
            from beamflow.ptycho.previews import headline

            path = write_opr_preview(job.out / "previews", final.extras["opr_weights"],
                                     final.probe,
                                     title=headline(inputs.title(final.iteration), suspect))
            previews[path.stem] = path
        return previews
    except ValueError as e:  # a diverged state: report, do not draw it
        log.warning("previews not written: %s", e)
        return {}


def _write_product(job: ReconstructJob, inputs: _Inputs, start: _Start, final: ReconState,
                   verdict: Verdict) -> Path:
    """The Ptychodus product of the final state, with the verdict."""
    scan, frame, n = inputs.scan, start.frame, inputs.n
    positions_m = frame.to_metres(final.positions_px)
    centre_y, centre_x = frame.centre_m()
    product_path = job.out / "product.h5"
    write_product(product_path, Product(
        name=job.name or scan.name,
        comments=f"beamflow {inputs.params.algorithm}, {final.iteration} iterations, {n} "
                 f"frames, initial probe from {start.initial_probe}; settings: "
                 + ", ".join(f"{k}={v}" for k, v in settings_used(inputs.params, n).items()),
        detector_object_distance_m=scan.geometry.distance_m,
        photon_energy_eV=scan.geometry.energy_eV,
        probe_photon_count=float(np.sum(np.abs(final.probe) ** 2)),
        probe=final.probe,
        probe_pixel_width_m=frame.pixel_size_m,
        probe_pixel_height_m=frame.pixel_size_m,
        object=final.object,
        object_layer_spacing_m=np.asarray(inputs.params.slice_spacings, np.float64),
        object_center_x_m=centre_x,
        object_center_y_m=centre_y,
        object_pixel_width_m=frame.pixel_size_m,
        object_pixel_height_m=frame.pixel_size_m,
        probe_position_indexes=np.arange(n),
        probe_position_x_m=positions_m[:, 1],
        probe_position_y_m=positions_m[:, 0],
        loss_epochs=np.arange(1, len(final.loss_history) + 1),
        loss_values=np.asarray(final.loss_history),
        propagation=inputs.propagation.model,
        focus_distance_m=inputs.focus_distance_m,
        verdict=verdict.verdict,
        verdict_reasons=verdict.reasons,
        opr_eigen_probes=final.extras.get("opr_eigen_probes"),
        opr_weights=final.extras.get("opr_weights"),
    ))
    return product_path


# --------------------------------------------------------------------------- previews


def previews_from_checkpoint(checkpoint_dirs: Path | list[Path], out_dir: Path
                             ) -> dict[str, Path] | None:
    """Render the previews of the newest verified checkpoint (any process, any time).

    Returns the written files, or None when no checkpoint verifies yet.
    """
    from beamflow.ptycho.previews import write_previews

    ck = load_latest(checkpoint_dirs)
    if ck is None:
        return None
    frame = frame_of(ck)
    params = (ck.meta.get("state") or {}).get("params") or {}
    layers = int(params.get("slices") or 1)
    spacings = slice_spacings(layers, params.get("slice_spacing_m")) if layers > 1 else ()
    return write_previews(
        out_dir, ck.arrays["object"], ck.arrays["probe"], frame.pixel_size_m,
        ck.arrays.get("loss_history", np.zeros(0)),
        scan_extent_px=scan_extent(ck.arrays["positions_px"], frame.frame_size),
        title=f"{ck.meta.get('job', {}).get('scan_name', '')} · iteration {ck.iteration}",
        positions_px=ck.arrays["positions_px"], spacings_m=spacings)
