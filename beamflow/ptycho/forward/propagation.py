"""From the exit wave to the detector: the far field (Fraunhofer) or the near field (Fresnel).

Far field: the detector records ``|F[ψ]|²`` with the zero frequency in the centre; the
engine holds the data ifftshifted so that the FFT's output needs no shift.

Near field: the detector records an in-line hologram ``|D_z[ψ]|²`` in real space, where the
angular-spectrum propagator over a distance ``z`` (Goodman, *Introduction to Fourier
Optics*, §3.10) is

    D_z[ψ] = F⁻¹[ H · F[ψ] ],    H(f) = exp(2πi z (√(1/λ² − |f|²) − 1/λ))  ≈ exp(−iπλz|f|²)

(the constant phase ``exp(2πiz/λ)`` is dropped: it is a global phase; evanescent
frequencies, |f| > 1/λ, are set to zero). ``f`` is in cycles per metre on the object grid:
``k / Δx`` with ``k = fftfreq(M)``. The sign follows numpy's forward FFT ``exp(−2πi k x)``
and a wave travelling towards +z.

Cone beam (a focused, divergent probe: KB mirrors or a zone plate upstream of the sample)
is reduced to this parallel-beam form by the Fresnel scaling theorem (e.g. Paganin,
*Coherent X-Ray Optics*, §2.5): with the focus a distance ``z1`` before the sample and the
detector ``z2`` after it, the magnification is ``M = (z1 + z2) / z1`` and the hologram is
that of a parallel beam with object pixel ``p / M`` over the distance ``z2 / M`` (``p`` the
detector pixel), apart from a magnification of the detector coordinates and a quadratic phase
that the intensity does not see. Without ``z1`` a near-field setup is a parallel beam: the
object pixel is the detector pixel.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["Propagation", "PropagationModel", "near_field_geometry", "transfer_function"]

PropagationModel = Literal["far-field", "near-field"]


class Propagation(BaseModel):
    """How the exit wave reaches the detector, in the engine's (effective) geometry.

    ``model="far-field"`` needs nothing else. ``model="near-field"`` needs the wavelength,
    the effective propagation distance and the effective object pixel size (see
    :func:`near_field_geometry`), all in metres.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: PropagationModel = "far-field"
    wavelength_m: float | None = Field(default=None, gt=0)
    distance_m: float | None = Field(default=None, gt=0, description="effective z [m]")
    pixel_size_m: float | None = Field(default=None, gt=0, description="effective Δx [m]")

    @model_validator(mode="after")
    def _near_field_needs_geometry(self) -> Propagation:
        if self.model == "near-field":
            missing = [n for n in ("wavelength_m", "distance_m", "pixel_size_m")
                       if getattr(self, n) is None]
            if missing:
                raise ValueError(f"near-field propagation needs {', '.join(missing)}")
        return self

    @property
    def near_field(self) -> bool:
        return self.model == "near-field"

    def transfer(self, m: int) -> np.ndarray | None:
        """The (M, M) complex64 transfer function H in FFT order, or None in the far field."""
        if not self.near_field:
            return None
        return transfer_function(m, self.wavelength_m, self.distance_m, self.pixel_size_m)


def transfer_function(m: int, wavelength_m: float, distance_m: float,
                      pixel_size_m: float) -> np.ndarray:
    """Angular-spectrum transfer function ``H`` on an M×M grid, FFT order, complex64."""
    f = np.fft.fftfreq(m) / pixel_size_m
    f2 = f[:, None] ** 2 + f[None, :] ** 2
    inv_l2 = 1.0 / wavelength_m**2
    kz = np.sqrt(np.maximum(inv_l2 - f2, 0.0))
    # kz − 1/λ written as −|f|²/(kz + 1/λ): no cancellation at paraxial frequencies.
    phase = -2.0 * np.pi * distance_m * f2 / (kz + 1.0 / wavelength_m)
    h = np.exp(1j * phase)
    h[f2 >= inv_l2] = 0.0
    return h.astype(np.complex64)


def near_field_geometry(detector_pixel_m: float, distance_m: float,
                        focus_distance_m: float | None) -> tuple[float, float, float]:
    """``(object pixel, effective distance, magnification)`` of a near-field setup.

    ``focus_distance_m`` is z1, the focus-to-sample distance of a cone beam (None: a
    parallel beam, magnification 1); ``distance_m`` is z2, sample to detector.
    """
    if focus_distance_m is None:
        return detector_pixel_m, distance_m, 1.0
    if not (math.isfinite(focus_distance_m) and focus_distance_m > 0):
        raise ValueError(f"focus distance must be a positive number of metres, "
                         f"got {focus_distance_m}")
    mag = (focus_distance_m + distance_m) / focus_distance_m
    return detector_pixel_m / mag, distance_m / mag, mag
