"""The reconstruction job: scan file in -> engine with checkpoints -> product + previews out.

This is what ``beamflow reconstruct`` and the compute functions call::

    job = ReconstructJob(scan=Path("scan_master.h5"), out=Path("out"))
    summary = run_reconstruction(job)        # ReconstructSummary

The job, the summary and the errors are described in :mod:`beamflow.reconstruct_job`; this
module runs a job.

Output directory::

    DIR/product.h5              Ptychodus product (written at the end)
    DIR/previews/*.png          object phase (windowed and full range), amplitude, probe,
                                convergence (refreshed every few iterations and at the end)
    DIR/checkpoints/            L2 checkpoints + LATEST.json (beamflow.checkpoint)

Resuming: when ``DIR/checkpoints`` (or the node-local L1 level) holds a checkpoint, the job
continues from it if it is compatible: the same geometry, frame shape, probe modes and
algorithm (hard; a mismatch is refused with the differences named), the same frames or MORE
frames of the same scan (the stored frames are a prefix of the current ones: the
reconstruction goes on with the new positions appended). Other settings (step sizes,
iteration budget, batch size) may change; the differences are logged.

``iterations`` counts iterations over the current data: a fresh run or a resume of the same
data stops at ``iterations`` in total; a continuation with more frames runs ``iterations``
more from the iteration where the frames were added. Resuming is exact: N iterations straight
and k + kill + resume + N-k give bit-identical results (numpy backend, same thread count).
"""

from __future__ import annotations

import hashlib
import logging
import math
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from beamflow.checkpoint import (
    Checkpoint,
    Checkpointer,
    IncompatibleCheckpoint,
    TerminationGuard,
    check_compatible,
    clear_checkpoints,
    load_latest,
)
from beamflow.formats import Product, Scan, ScanFormatError, load_scan, write_product
from beamflow.live_previews import LivePreviews
from beamflow.ptycho.arrays import array_backend
from beamflow.ptycho.engine import Reconstructor, initial_state, mean_pattern
from beamflow.ptycho.propagation import Propagation, near_field_geometry
from beamflow.ptycho.state import PtychoData, ReconParams, ReconState
from beamflow.ptycho.verdict import judge, measure_data
from beamflow.reconstruct_job import (
    PROBE_FROM_DATA,
    PROBE_FROM_FILE,
    PROBE_FROM_OPTICS,
    Progress,
    ReconstructError,
    ReconstructJob,
    ReconstructSummary,
    check_out_dir,
    plain_words,
)

log = logging.getLogger(__name__)

JOB_FORMAT = "beamflow.reconstruct/1"
_READ_CHUNK = 32  # frames read (and hashed) at a time: small transients, not 2x the frames


def _bad_frame(scan: Scan, frames: np.ndarray) -> ScanFormatError | None:
    """The first frame with a NaN, an infinity or a negative count on a valid pixel, named
    by its data file and its number there (1-based where the file counts from 1)."""
    mask = scan.mask
    for start in range(0, frames.shape[0], 64):
        block = frames[start : start + 64][:, mask]
        finite = np.isfinite(block)
        if not finite.all():
            what, rows = "a NaN or infinite value", ~finite.all(axis=1)
        elif block.size and float(block.min()) < 0:
            what, rows = "a negative count", (block < 0).any(axis=1)
        else:
            continue
        index = start + int(np.flatnonzero(rows)[0])
        file, key, where = scan.locate(index)
        return ScanFormatError(
            file, key, f"{where}: {what} on a valid detector pixel; mark such pixels "
            "invalid in the detector's pixel mask (or fix the file)"
        )
    return None


# --------------------------------------------------------------------------- data


class _LoadedData:
    """Frames, positions and what identifies them (for compatibility checks)."""

    def __init__(self, scan: Scan, frames: np.ndarray, digests: dict[int, str]):
        self.scan = scan
        self.frames = frames
        self._digests = digests

    def digest(self, n: int) -> str:
        """sha256 over the first n frames and their positions (as measured)."""
        if n not in self._digests:
            self._digests[n] = _data_digest(self.scan, self.frames, n)
        return self._digests[n]


def _data_digest(scan: Scan, frames: np.ndarray, n: int) -> str:
    h = hashlib.sha256(f"{n}:{frames.shape[1:]}".encode())
    pos = np.ascontiguousarray(scan.positions_m[:n], dtype=np.float64)
    h.update(pos.tobytes())
    for s in range(0, n, _READ_CHUNK):
        h.update(memoryview(np.ascontiguousarray(frames[s:min(n, s + _READ_CHUNK)])).cast("B"))
    return h.hexdigest()


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


def _read_frames(scan: Scan) -> np.ndarray:
    """All frames into one preallocated float32 array (read in chunks: no second copy)."""
    n = scan.n_frames
    out = np.empty((n, *scan.frame_shape), np.float32)
    for s in range(0, n, _READ_CHUNK):
        out[s:min(n, s + _READ_CHUNK)] = scan.frames(s, min(n, s + _READ_CHUNK))
    return out


class _Frame(BaseModel):
    """Metres <-> object pixels: corner_px = (pos_m - origin_m) / dx - M/2."""

    origin_m: tuple[float, float]  # metres of object pixel (0, 0), (y, x)
    pixel_size_m: float
    object_shape: tuple[int, int]
    frame_size: int

    def corners(self, positions_m: np.ndarray) -> np.ndarray:
        o = np.asarray(self.origin_m)
        return (np.asarray(positions_m, np.float64) - o) / self.pixel_size_m - self.frame_size / 2

    def to_metres(self, corners_px: np.ndarray) -> np.ndarray:
        o = np.asarray(self.origin_m)
        return (np.asarray(corners_px, np.float64) + self.frame_size / 2) * self.pixel_size_m + o

    @classmethod
    def for_scan(cls, scan: Scan, margin: int, pixel_size_m: float) -> _Frame:
        """Object big enough for every PLANNED position (so later frames fit too)."""
        m = scan.frame_shape[0]
        dx = pixel_size_m
        planned = np.asarray(scan.planned_positions_m, np.float64)
        if planned.size == 0:
            planned = np.asarray(scan.positions_m, np.float64)
        allpos = np.concatenate([planned, np.asarray(scan.positions_m, np.float64)])
        lo = allpos.min(axis=0)
        origin = lo - (margin + m / 2) * dx
        span = (allpos.max(axis=0) - lo) / dx
        shape = tuple(int(math.ceil(s)) + m + 2 * margin + 1 for s in span)
        return cls(origin_m=(float(origin[0]), float(origin[1])), pixel_size_m=dx,
                   object_shape=(shape[0], shape[1]), frame_size=m)


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
        return Propagation(), None
    focus = job.focus_distance_m or scan.focus_distance_m
    dx, z_eff, mag = near_field_geometry(g.detector_pixel_size_m, g.distance_m, focus)
    log.info("near field: %s, magnification %.4g, object pixel %.4g nm, effective distance "
             "%.4g mm", "cone beam" if focus else "parallel beam", mag, dx * 1e9, z_eff * 1e3)
    return Propagation(model="near-field", wavelength_m=g.wavelength_m, distance_m=z_eff,
                       pixel_size_m=dx), focus


def _fingerprint(scan: Scan, params: ReconParams, data: _LoadedData, job: ReconstructJob,
                 n: int) -> dict[str, Any]:
    g = scan.geometry
    prop = params.propagation
    soft = params.model_dump(mode="json", exclude={"algorithm", "probe_modes", "propagation"})
    soft.update(device=job.device, probe=str(job.probe) if job.probe else None,
                mask_sha256=hashlib.sha256(np.ascontiguousarray(scan.mask).tobytes()).hexdigest())
    return {
        "hard": {
            "energy_eV": g.energy_eV,
            "distance_m": g.distance_m,
            "detector_pixel_size_m": g.detector_pixel_size_m,
            "object_pixel_size_m": prop.pixel_size_m or scan.object_pixel_size_m,
            "propagation": prop.model,
            "propagation_distance_m": prop.distance_m,
            "frame_shape": list(scan.frame_shape),
            "probe_modes": params.probe_modes,
            "algorithm": params.algorithm,
        },
        "soft": soft,
        "data": {"n": n, "digest": data.digest(n)},
    }


# --------------------------------------------------------------------------- the job


def _initial_probe(job: ReconstructJob, scan: Scan) -> tuple[np.ndarray | None, str]:
    """The starting probe and where it came from (first that applies):

    ``--probe`` file → the zone plate and defocus the scan file records (``scan.optics``) →
    None, for the engine's guess from the mean diffraction. The engine scales the probe to
    the data's counts and makes the configured number of modes from it (initial_state).
    """
    from beamflow.ptycho.probe import ZonePlate, load_probe, zone_plate_probe

    if job.probe is not None:
        try:
            return load_probe(job.probe, frame_size=scan.frame_shape[0],
                              n_modes=job.params.probe_modes,
                              pixel_size_m=scan.object_pixel_size_m), PROBE_FROM_FILE
        except ValueError as e:
            raise ReconstructError(plain_words(str(e))) from e
    optics = scan.optics
    if optics is not None and job.params.propagation.near_field:
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
             "hologram" if job.params.propagation.near_field else "diffraction")
    return None, PROBE_FROM_DATA


def _fit_object(state: ReconState, frame: _Frame, corners: np.ndarray) -> _Frame:
    """Grow the object (new area = 1) when appended positions fall outside it."""
    m = frame.frame_size
    h, w = frame.object_shape
    lo = np.floor(np.rint(corners).min(axis=0)).astype(int)
    hi = np.rint(corners).max(axis=0).astype(int) + m
    pad_top, pad_left = max(0, -int(lo[0])), max(0, -int(lo[1]))
    pad_bottom, pad_right = max(0, int(hi[0]) - h), max(0, int(hi[1]) - w)
    if not (pad_top or pad_left or pad_bottom or pad_right):
        return frame
    log.info("new positions leave the object: growing it by (%d, %d, %d, %d) px",
             pad_top, pad_bottom, pad_left, pad_right)
    state.object = np.pad(state.object, ((pad_top, pad_bottom), (pad_left, pad_right)),
                          constant_values=1).astype(np.complex64)
    state.positions_px = state.positions_px + np.array([pad_top, pad_left], np.float64)
    dx = frame.pixel_size_m
    origin = (frame.origin_m[0] - pad_top * dx, frame.origin_m[1] - pad_left * dx)
    return _Frame(origin_m=origin, pixel_size_m=dx, frame_size=m,
                  object_shape=state.object.shape)


def _load_resume(job: ReconstructJob) -> Checkpoint | None:
    dirs = [d for d in (job.l1_path(), job.l2_dir) if d is not None]
    if not job.resume:
        for d in dirs:
            clear_checkpoints(d)
        return None
    return load_latest(dirs)


def run_reconstruction(job: ReconstructJob, progress: Progress | None = None) -> ReconstructSummary:
    """Run (or resume, or continue) the reconstruction `job` describes."""
    check_out_dir(job.out)
    # Live previews are drawn by a helper process (see beamflow.live_previews), started now
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
    t_start = time.perf_counter()
    scan = load_scan(job.scan, max_frames=job.max_frames, allow_partial=job.allow_partial)
    propagation, focus_distance = _propagation(job, scan)
    params = job.params.model_copy(update={"propagation": propagation})
    job = job.model_copy(update={"params": params})
    pixel_size = propagation.pixel_size_m or scan.object_pixel_size_m
    frames = _read_frames(scan)
    digests: dict[int, str] = {}
    loaded = _LoadedData(scan, frames, digests)
    n = scan.n_frames
    ckpt = _load_resume(job)

    resumed_from: int | None = None
    continuation = False
    since = 0  # iteration at which the current data set began
    if ckpt is not None:
        current = _fingerprint(scan, params, loaded, job, n)
        try:
            compat = check_compatible(ckpt.fingerprint, current, prefix_digest=loaded.digest,
                                      source=str(ckpt.path))
        except IncompatibleCheckpoint as e:
            raise IncompatibleCheckpoint(e.mismatches, str(ckpt.path),
                                         hint="use --no-resume to start over") from None
        for d in compat.soft:
            log.info("resuming with a changed setting: %s", d)
        job_meta = ckpt.meta.get("job") or {}
        probe_source = str(job_meta.get("initial_probe", "checkpoint"))
        if job_meta.get("format") != JOB_FORMAT:
            raise ReconstructError(f"{ckpt.path}: not a checkpoint of this reconstruction job "
                                   f"(format {job_meta.get('format')!r}); use --no-resume")
        try:
            frame = _Frame.model_validate(job_meta["frame"])
            state = ReconState.from_arrays(ckpt.arrays, ckpt.meta["state"])
        except (KeyError, ValueError) as e:
            raise ReconstructError(
                f"{ckpt.path}: cannot restore the state: {plain_words(str(e))}") from e
        state.params = params  # soft settings may change; the hard ones were checked
        resumed_from = ckpt.iteration
        since = int(job_meta["data_since_iteration"])
        if compat.continuation:
            continuation = True
            since = ckpt.iteration
            stored_n = int(compat.stored_n or 0)
            new = frame.corners(scan.positions_m[stored_n:])
            frame = _fit_object(state, frame, new)
            state.extend_positions(frame.corners(scan.positions_m[stored_n:]))
            log.info("continuing from iteration %d with %d new frames (%d -> %d)",
                     ckpt.iteration, n - stored_n, stored_n, n)
        positions = frame.corners(scan.positions_m)
        # positions already refined by position correction stay as the state has them
        nominal = positions
    else:
        frame = _Frame.for_scan(scan, job.object_margin_px, pixel_size)
        nominal = frame.corners(scan.positions_m)
        state = None
    target = since + params.iterations
    run_params = params.model_copy(update={"iterations": target})

    try:
        data = PtychoData(intensities=frames, positions_px=nominal,
                          object_shape=frame.object_shape, mask=scan.mask)
    except ValueError as e:
        # Bad counts live in a data file: name it, and the frame as that file numbers it.
        bad = _bad_frame(scan, frames)
        if bad is not None:
            raise bad from None
        raise ReconstructError(f"{scan.source}: {plain_words(str(e))}") from e
    del frames  # PtychoData holds the same array (no copy); keep one reference only
    loaded.frames = data.intensities
    # What the data say of their regime and noise, before the engine spends the frames.
    regime = measure_data(data.intensities, data.positions_px, mean_pattern(data), data.mask)
    if state is None:
        probe0, probe_source = _initial_probe(job, scan)
        state = initial_state(data, run_params, probe=probe0)
    else:
        state.params = run_params

    fingerprint = _fingerprint(scan, params, loaded, job, n)
    del loaded  # the frames stay referenced by `data` only (and the engine's copy)
    _release_freed_memory()
    backend = array_backend(job.device, threads=job.threads)
    log.info("device %s, %d thread(s), FFTs: %s", backend.name, backend.threads, backend.fft)
    preview_dir = job.out / "previews"
    job.out.mkdir(parents=True, exist_ok=True)
    extent = _scan_extent(data.positions_px, frame)

    def job_meta() -> dict[str, Any]:
        return {"format": JOB_FORMAT, "frame": frame.model_dump(mode="json"),
                "data_since_iteration": since, "n_frames": n, "scan": str(scan.source),
                "scan_name": scan.name, "initial_probe": probe_source}

    policy = job.policy()
    protect = {name: ckpt.path for name, cfg in policy.levels().items()
               if ckpt is not None and Path(cfg.dir) == ckpt.path.parent}
    ck = Checkpointer(policy, fingerprint=fingerprint,
                      start_iteration=state.iteration, protect=protect)
    guard: TerminationGuard | None = None
    if job.handle_sigterm and threading.current_thread() is threading.main_thread():
        guard = TerminationGuard(ck, defer=True).install()

    times: list[float] = []
    previews: dict[str, Path] = {}
    last_preview = [-math.inf]
    start_iteration = state.iteration

    def title(iteration: int) -> str:
        return f"{scan.name} · {params.algorithm} · iteration {iteration}"

    try:
        # The engine turns the frames into amplitudes in place (on the GPU it copies them
        # to the device): the frames are never held twice, and `data` is spent.
        with Reconstructor(data, state, backend, consume_data=True) as rec:
            # The engine holds its own copy of the state: drop ours (the initial object, a
            # resumed checkpoint's arrays) with the spent data before the iterations start.
            last_loss = state.loss_history[-1] if state.loss_history else None
            data = state = ckpt = None
            _release_freed_memory()
            cache: dict[str, Any] = {}

            def snapshot() -> ReconState:
                if cache.get("it") != rec.iteration:
                    cache.update(it=rec.iteration, state=rec.snapshot())
                return cache["state"]

            def meta() -> dict[str, Any]:
                return {"state": snapshot().meta(), "job": job_meta()}

            def callback(view: Any, info: dict[str, Any]) -> None:
                # wall time between callbacks: the iteration plus what we do here
                now = time.perf_counter()
                times.append(now - t_iter[0])
                t_iter[0] = now
                it = int(info["iteration"])
                ck.maybe_save(it, lambda: snapshot().to_host_arrays(), meta)
                if guard is not None and guard.requested:
                    ck.save(it, snapshot().to_host_arrays(), meta())
                    guard.exit()  # flush, exit 143
                if (job.preview_every and (it - start_iteration) % job.preview_every == 0
                        and time.monotonic() - last_preview[0] >= job.preview_min_seconds
                        and it < target):
                    st = snapshot()  # the checkpoint's, when one is due now too
                    live.submit(st.object, st.probe, st.loss_history, title(it),
                                frame.pixel_size_m, scan_extent_px=extent,
                                positions_px=st.positions_px)
                    last_preview[0] = time.monotonic()
                if progress is not None:
                    progress(it, target, float(info["loss"]))
                cache.clear()

            if progress is not None:
                progress(start_iteration, target, last_loss)
            t_iter = [time.perf_counter()]
            final = rec.run(max(0, target - start_iteration), callback=callback)
        ck.finalize(final.iteration, final.to_host_arrays,
                    {"state": final.meta(), "job": job_meta()})
    finally:
        ck.close()
        live.close()  # before the final previews: they are the same files
        if guard is not None:
            guard.uninstall()

    # release the engine's copy of the frames before rendering and writing
    rec = None  # noqa: F841 - the callbacks' closure cell keeps it alive otherwise
    from beamflow.ptycho.previews import write_previews

    previews.update(live.files)
    try:
        previews.update(write_previews(
            preview_dir, final.object, final.probe, frame.pixel_size_m, final.loss_history,
            scan_extent_px=extent, title=title(final.iteration),
            positions_px=final.positions_px))
        if "opr_weights" in final.extras:
            from beamflow.ptycho.opr_previews import write_opr_preview

            path = write_opr_preview(preview_dir, final.extras["opr_weights"], final.probe,
                                     title=title(final.iteration))
            previews[path.stem] = path
    except ValueError as e:  # a diverged state: report, do not draw it
        log.warning("previews not written: %s", e)
    verdict = judge(obj=final.object, probe=final.probe, positions_px=final.positions_px,
                    loss_history=final.loss_history, propagation=propagation, data=regime)
    if verdict.verdict == "suspect":
        log.warning("%s: the result is SUSPECT: %s", scan.source, " ".join(verdict.reasons))
    else:
        log.info("%s: the result is trusted", scan.source)
    positions_m = frame.to_metres(final.positions_px)
    h, w = final.object.shape
    product_path = job.out / "product.h5"
    write_product(product_path, Product(
        name=job.name or scan.name,
        comments=f"beamflow {params.algorithm}, {final.iteration} iterations, {n} frames, "
                 f"initial probe from {probe_source}",
        detector_object_distance_m=scan.geometry.distance_m,
        photon_energy_eV=scan.geometry.energy_eV,
        probe_photon_count=float(np.sum(np.abs(final.probe) ** 2)),
        probe=final.probe,
        probe_pixel_width_m=frame.pixel_size_m,
        probe_pixel_height_m=frame.pixel_size_m,
        object=final.object,
        object_center_x_m=frame.origin_m[1] + (w / 2) * frame.pixel_size_m,
        object_center_y_m=frame.origin_m[0] + (h / 2) * frame.pixel_size_m,
        object_pixel_width_m=frame.pixel_size_m,
        object_pixel_height_m=frame.pixel_size_m,
        probe_position_indexes=np.arange(n),
        probe_position_x_m=positions_m[:, 1],
        probe_position_y_m=positions_m[:, 0],
        loss_epochs=np.arange(1, len(final.loss_history) + 1),
        loss_values=np.asarray(final.loss_history),
        propagation=propagation.model,
        focus_distance_m=focus_distance,
        verdict=verdict.verdict,
        verdict_reasons=verdict.reasons,
        opr_eigen_probes=final.extras.get("opr_eigen_probes"),
        opr_weights=final.extras.get("opr_weights"),
    ))
    l2 = ck.committed.get("L2")
    return ReconstructSummary(
        iterations=final.iteration,
        iterations_this_run=final.iteration - start_iteration,
        seconds_per_iteration=statistics.median(times[1:]) if len(times) > 1 else (
            times[0] if times else None),
        final_loss=final.loss_history[-1] if final.loss_history else None,
        device=backend.name,
        fft=backend.fft,
        product=str(product_path),
        previews=[str(p) for p in previews.values()],
        resumed_from_iteration=resumed_from,
        continuation=continuation,
        checkpoint=str(job.l2_dir / l2.file) if l2 is not None else None,
        checkpoint_errors=[str(e) for e in ck.errors],
        n_frames=n,
        algorithm=params.algorithm,
        seconds=time.perf_counter() - t_start,
        initial_probe=probe_source,
        propagation=propagation.model,
        focus_distance_m=focus_distance,
        object_pixel_size_m=frame.pixel_size_m,
        verdict=verdict.verdict,
        verdict_reasons=verdict.reasons,
        verdict_metrics=verdict.metrics,
    )


def previews_from_checkpoint(checkpoint_dirs: Path | list[Path], out_dir: Path
                             ) -> dict[str, Path] | None:
    """Render the previews of the newest verified checkpoint (any process, any time).

    Returns the written files, or None when no checkpoint verifies yet.
    """
    from beamflow.ptycho.previews import write_previews

    ck = load_latest(checkpoint_dirs)
    if ck is None:
        return None
    job_meta = ck.meta.get("job", {})
    if job_meta.get("format") != JOB_FORMAT:
        raise ReconstructError(f"{ck.path}: not a checkpoint of a reconstruction job")
    frame = _Frame.model_validate(job_meta["frame"])
    return write_previews(
        out_dir, ck.arrays["object"], ck.arrays["probe"], frame.pixel_size_m,
        ck.arrays.get("loss_history", np.zeros(0)),
        scan_extent_px=_scan_extent(ck.arrays["positions_px"], frame),
        title=f"{job_meta.get('scan_name', '')} · iteration {ck.iteration}",
        positions_px=ck.arrays["positions_px"])


def _scan_extent(corners: np.ndarray, frame: _Frame) -> tuple[int, int, int, int]:
    c = np.rint(corners).astype(int)
    m = frame.frame_size
    return (int(c[:, 0].min()), int(c[:, 0].max()) + m, int(c[:, 1].min()),
            int(c[:, 1].max()) + m)

