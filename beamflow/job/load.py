"""Step 1 of the job, load: the scan, the propagation model of its geometry in the engine's
terms (far field, or near field with the Fresnel scaling of a cone beam), what that geometry
asks the user to check, and all the frames."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from beamflow.formats import Scan, load_scan
from beamflow.job.checkpoints import LoadedData
from beamflow.job.models import ReconstructJob, length_text
from beamflow.ptycho.forward.propagation import Propagation, near_field_geometry
from beamflow.ptycho.state import ReconParams

log = logging.getLogger(__name__)

_READ_CHUNK = 32  # frames read at a time: small transients, not 2x the frames


@dataclass
class Inputs:
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


def load(job: ReconstructJob) -> Inputs:
    """The scan, its propagation model in the engine's geometry, and all its frames."""
    scan = load_scan(job.scan, max_frames=job.max_frames, allow_partial=job.allow_partial)
    propagation, focus_distance = scan_propagation(job, scan)
    params = job.params.for_propagation(propagation)
    return Inputs(scan=scan, params=params, focus_distance_m=focus_distance,
                  loaded=LoadedData(scan, read_frames(scan)),
                  notes=_geometry_notes(scan, propagation, focus_distance))


def read_frames(scan: Scan) -> np.ndarray:
    """All frames into one preallocated float32 array (read in chunks: no second copy)."""
    n = scan.n_frames
    out = np.empty((n, *scan.frame_shape), np.float32)
    for s in range(0, n, _READ_CHUNK):
        out[s:min(n, s + _READ_CHUNK)] = scan.frames(s, min(n, s + _READ_CHUNK))
    return out


def scan_propagation(job: ReconstructJob, scan: Scan) -> tuple[Propagation, float | None]:
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
