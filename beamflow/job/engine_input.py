"""Step 3 of the job, the engine's input: the measured frames in the engine's form (a bad
count named by its data file and frame), what they say of their regime and noise, the
starting state (the checkpoint's, or a fresh one from the initial probe: a ``--probe`` file,
the recorded zone plate, or the mean diffraction) and the fingerprint of the checkpoints to
come."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from beamflow.formats import Scan, ScanFormatError, invalid_counts
from beamflow.job.checkpoints import fingerprint
from beamflow.job.load import Inputs
from beamflow.job.models import (
    PROBE_FROM_DATA,
    PROBE_FROM_FILE,
    PROBE_FROM_OPTICS,
    ReconstructError,
    ReconstructJob,
    plain_words,
)
from beamflow.job.start import Start
from beamflow.ptycho.engine import initial_state, mean_pattern
from beamflow.ptycho.quality.verdict import DataRegime, measure_data
from beamflow.ptycho.scan_geometry import scan_extent
from beamflow.ptycho.state import PtychoData, ReconParams, ReconState

log = logging.getLogger(__name__)


@dataclass
class EngineInput:
    """What the engine is handed; it takes both over (``data`` and ``state`` are dropped
    here once it has them, so that the frames are never held twice)."""

    data: PtychoData | None
    state: ReconState | None
    regime: DataRegime
    fingerprint: dict[str, Any]
    extent: tuple[int, int, int, int]


def engine_input(job: ReconstructJob, inputs: Inputs, start: Start) -> EngineInput:
    """The measured data in the engine's form, what they say of their regime, the starting
    state (the checkpoint's, or a fresh one from the initial probe) and the fingerprint."""
    loaded, scan = inputs.loaded, inputs.scan
    assert loaded is not None
    # The engine's ReconParams.iterations is a total: the iteration it stops at.
    engine_params = inputs.params.model_copy(update={"iterations": start.stop_iteration})
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
        state = initial_state(data, engine_params, probe=probe0)
    else:
        state.params = engine_params
    prints = fingerprint(scan, inputs.params, loaded, job, inputs.n)
    inputs.loaded = None  # the frames stay referenced by `data` only (and the engine's copy)
    release_freed_memory()
    return EngineInput(data=data, state=state, regime=regime, fingerprint=prints,
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
                              n_modes=params.probe_modes_value,
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


def release_freed_memory() -> None:
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
