"""The job's checkpoints: what it writes in them beside the engine's state (the
fingerprint, the job's metadata), when a job may continue from one and from where, and
the previews of one (``beamflow previews``, while a job runs or after it).

The job's checkpoints carry a fingerprint (:func:`fingerprint`) that
:func:`beamflow.checkpoint.check_compatible` compares with the current run's:

* ``hard``: the geometry, the propagation model, the frame shape, the probe modes, the
  algorithm and the object's layers. A mismatch is refused with the differences named.
* ``soft``: every other engine setting, the device, the probe file and the detector mask:
  they may change (step sizes, iteration budget, batch size, ...); the differences are logged.
* ``data``: the number of frames and a digest over them and their positions. The same
  frames resume; MORE frames of the same scan (the stored ones a prefix of the current ones)
  continue, with the new positions appended and the object grown to fit them.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from beamflow.checkpoint import (
    Checkpoint,
    IncompatibleCheckpoint,
    check_compatible,
    clear_checkpoints,
    load_latest,
)
from beamflow.formats import Scan
from beamflow.job.models import ReconstructError, ReconstructJob, plain_words
from beamflow.ptycho.forward.slices import slice_spacings
from beamflow.ptycho.scan_geometry import ScanFrame, grow_to_fit, scan_extent
from beamflow.ptycho.state import ReconParams, ReconState

log = logging.getLogger(__name__)

#: what the job writes beside the engine's state in a checkpoint's metadata ("job"); the
#: name the job had when the format was made, kept: the checkpoints on disk carry it
JOB_FORMAT = "beamflow.reconstruct/1"
_READ_CHUNK = 32  # frames hashed at a time: small transients


class LoadedData:
    """Frames, positions and what identifies them (for compatibility checks)."""

    def __init__(self, scan: Scan, frames: np.ndarray):
        self.scan = scan
        self.frames = frames
        self._digests: dict[int, str] = {}

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


def fingerprint(scan: Scan, params: ReconParams, data: LoadedData, job: ReconstructJob,
                n: int) -> dict[str, Any]:
    """The fingerprint of this run's checkpoints (hard, soft and data parts, above)."""
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
            "probe_modes": params.probe_modes_value,
            "algorithm": params.algorithm,
            # a thick sample's layers (absent for one: older checkpoints say nothing)
            **({"slices": params.slices} if params.slices > 1 else {}),
        },
        "soft": soft,
        "data": {"n": n, "digest": data.digest(n)},
    }


def latest_checkpoint(job: ReconstructJob) -> Checkpoint | None:
    """The newest verified checkpoint of the job's levels; with ``resume`` off, none (and
    the old ones are cleared)."""
    dirs = [d for d in (job.l1_path(), job.l2_dir) if d is not None]
    if not job.resume:
        for d in dirs:
            clear_checkpoints(d)
        return None
    return load_latest(dirs)


@dataclass
class Resumed:
    """What a compatible checkpoint gives the job back."""

    state: ReconState
    frame: ScanFrame
    iteration: int
    #: iteration at which the current data set began (the frames were last added)
    since: int
    continuation: bool
    initial_probe: str


def resume(ckpt: Checkpoint, current: dict[str, Any], data: LoadedData,
           params: ReconParams) -> Resumed:
    """The state of ``ckpt``, checked against the ``current`` fingerprint, with the new
    positions appended (object grown to fit) when the data set grew."""
    try:
        compat = check_compatible(ckpt.fingerprint, current, prefix_digest=data.digest,
                                  source=str(ckpt.path))
    except IncompatibleCheckpoint as e:
        raise IncompatibleCheckpoint(e.mismatches, str(ckpt.path),
                                     hint="use --no-resume to start over") from None
    for d in compat.soft:
        log.info("resuming with a changed setting: %s", d)
    job_meta = ckpt.meta.get("job") or {}
    if job_meta.get("format") != JOB_FORMAT:
        raise ReconstructError(f"{ckpt.path}: not a checkpoint of this reconstruction job "
                               f"(format {job_meta.get('format')!r}); use --no-resume")
    try:
        frame = ScanFrame.model_validate(job_meta["frame"])
        state = ReconState.from_arrays(ckpt.arrays, ckpt.meta["state"])
    except (KeyError, ValueError) as e:
        raise ReconstructError(
            f"{ckpt.path}: cannot restore the state: {plain_words(str(e))}") from e
    state.params = params  # soft settings may change; the hard ones were checked
    since = int(job_meta["data_since_iteration"])
    if compat.continuation:
        since = ckpt.iteration
        scan = data.scan
        stored_n = int(compat.stored_n or 0)
        frame = grow_to_fit(state, frame, frame.corners(scan.positions_m[stored_n:]))
        state.extend_positions(frame.corners(scan.positions_m[stored_n:]))
        log.info("continuing from iteration %d with %d new frames (%d -> %d)",
                 ckpt.iteration, scan.n_frames - stored_n, stored_n, scan.n_frames)
    return Resumed(state=state, frame=frame, iteration=ckpt.iteration, since=since,
                   continuation=compat.continuation,
                   initial_probe=str(job_meta.get("initial_probe", "checkpoint")))


def job_meta(frame: ScanFrame, since: int, scan: Scan, initial_probe: str) -> dict[str, Any]:
    """The job's part of a checkpoint's metadata (what :func:`resume` reads back)."""
    return {"format": JOB_FORMAT, "frame": frame.model_dump(mode="json"),
            "data_since_iteration": since, "n_frames": scan.n_frames,
            "scan": str(scan.source), "scan_name": scan.name, "initial_probe": initial_probe}


def frame_of(ckpt: Checkpoint) -> ScanFrame:
    """The scan frame a job checkpoint was written with (for previews of it)."""
    meta = ckpt.meta.get("job", {})
    if meta.get("format") != JOB_FORMAT:
        raise ReconstructError(f"{ckpt.path}: not a checkpoint of a reconstruction job")
    return ScanFrame.model_validate(meta["frame"])


def protected_files(job: ReconstructJob, ckpt: Checkpoint | None) -> dict[str, Path]:
    """The checkpoint resumed from, per level, which the checkpointer must not prune."""
    if ckpt is None:
        return {}
    return {name: ckpt.path for name, cfg in job.policy().levels().items()
            if Path(cfg.dir) == ckpt.path.parent}


def previews_from_checkpoint(checkpoint_dirs: Path | list[Path], out_dir: Path
                             ) -> dict[str, Path] | None:
    """Render the previews of the newest verified checkpoint (any process, any time).

    Returns the written files, or None when no checkpoint verifies yet.
    """
    from beamflow.ptycho.quality.previews import write_previews

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
