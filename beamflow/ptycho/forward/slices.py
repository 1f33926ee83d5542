"""Multislice geometry: the layers' spacings, the propagator between layers, the depth of field.

A sample thicker than the depth of field is modelled as S thin layers O_1 … O_S spaced
Δz_1 … Δz_{S−1} (Maiden, Humphry & Rodenburg, JOSA A 29, 1606 (2012), "3PIE"; notation of
PTYCHO_MATH.md, "Multislice"). The wave leaving layer s reaches layer s+1 by angular-spectrum
propagation 𝒫_Δz[a] = F⁻¹[H · F[a]] with the exact kz of
:func:`.propagation.transfer_function` (constant phase exp(2πiΔz/λ) dropped),
band-limited by :func:`slice_transfer`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .propagation import transfer_function

__all__ = ["NYQUIST_FRACTION", "depth_of_field", "separation_frequency", "slice_spacings",
           "slice_transfer", "spacing_from_text"]

#: The circular band limit of :func:`slice_transfer`, as a fraction of the Nyquist frequency.
NYQUIST_FRACTION = 2.0 / 3.0


def spacing_from_text(text: str) -> float | list[float]:
    """``"4e-4"`` or ``"1e-4,2e-4"`` (a command line's or a KEY=VALUE's form) as numbers: one
    value, or a list of them. Raises ValueError with the reason."""
    try:
        values = [float(p.strip()) for p in text.split(",")]
    except ValueError:
        raise ValueError(f"slice spacing {text!r} is not a number of metres or "
                         "comma-separated numbers of metres") from None
    return values[0] if len(values) == 1 else values


def slice_spacings(slices: int, spacing: float | Sequence[float] | str | None
                   ) -> tuple[float, ...]:
    """The S−1 spacings (metres) between S layers.

    ``spacing`` is one value (every gap), exactly S−1 values, or None (only for one layer);
    a string is read as one number or S−1 comma-separated numbers (``"4e-4"``,
    ``"1e-4,2e-4"``), as ``--slice-spacing`` gives it. One layer has no gaps: ``()`` (one
    value broadcasts to none; a list must then be empty). Raises ValueError with the reason.
    """
    if isinstance(slices, bool) or not isinstance(slices, int | np.integer) or slices < 1:
        raise ValueError(f"slices must be a whole number ≥ 1, got {slices!r}")
    slices = int(slices)
    gaps = slices - 1
    if isinstance(spacing, str):
        spacing = spacing_from_text(spacing)
    if spacing is None:
        if gaps:
            either = f": one value, or {gaps} comma-separated values" if gaps > 1 else ""
            raise ValueError(f"{slices} slices need a slice spacing (metres){either}")
        return ()
    if np.ndim(spacing) == 0:  # one number (a 0-d array too)
        try:
            value = float(spacing)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"slice spacing must be a number of metres, got {spacing!r}"
                             ) from None
        _check_positive([value])
        return (value,) * gaps
    try:
        values = [float(v) for v in np.asarray(spacing, dtype=np.float64).reshape(-1)]
    except (TypeError, ValueError):
        raise ValueError(f"slice spacings must be numbers of metres, got {spacing!r}") from None
    if np.ndim(spacing) > 1 or len(values) != gaps:
        raise ValueError(f"{slices} slices need {gaps} slice spacing{'s' if gaps != 1 else ''} "
                         f"(or one for every gap), got {len(values)}")
    _check_positive(values)
    return tuple(values)


def _check_positive(values: list[float]) -> None:
    bad = [v for v in values if not (math.isfinite(v) and v > 0)]
    if bad:
        raise ValueError(f"slice spacings must be finite and > 0 metres, got {bad[0]!r}")


def slice_transfer(m: int, wavelength_m: float, spacing_m: float, pixel_size_m: float, *,
                   nyquist_fraction: float | None = NYQUIST_FRACTION) -> np.ndarray:
    """Band-limited angular-spectrum transfer function between layers: (m, m) complex64, FFT
    order, for the periodic m×m window of pixel ``pixel_size_m``.

    ``H = transfer_function(m, λ, Δz, Δx) · B``, the exact-kz propagator times a band limit
    ``B`` (0 or 1) that is the product of two conditions:

    * **No wrap-around in the periodic window** (Matsushima & Shimobaba, "Band-limited
      angular spectrum method for numerical simulation of free-space propagation in far and
      near fields", Opt. Express 17, 19662 (2009)): a plane wave of frequency f moves
      sideways by λΔz·f/√(1−λ²f²) over Δz, which is also the local frequency of H's phase;
      H sampled at Δf = 1/(m·Δx) resolves it, and the displacement stays within half the
      window, only for ``|f_x|, |f_y| < f_lim = 1/(λ·√((2·Δf·Δz)² + 1))``, each axis on its
      own. Beyond it the circular convolution folds the wave back into the window from the
      other side. (The paper pads the field to twice the window; here Δf is that of the
      unpadded periodic window, which is what the engine propagates.)
    * **No aliasing from one layer's product with the next** (the usual multislice limit,
      Kirkland, *Advanced Computing in Electron Microscopy*, 2nd ed., §6.8): the wave is
      kept within a disc of radius ``nyquist_fraction`` (2/3) of the Nyquist frequency
      1/(2Δx), so that the product of two band-limited functions (wave × transmission)
      folds no frequency back into the kept band. ``nyquist_fraction=None`` applies only the
      first condition (for a simulator working on a padded window).

    Evanescent frequencies (|f| ≥ 1/λ) are zero, as in :func:`transfer_function`. A spacing
    of 0 propagates nothing but still applies the band limit.

    What the disc costs in the far field: it removes the first layers' scattering beyond 1/3
    cycle per pixel, which falls on 65 % of the detector's pixels. On the simulator's
    two-layer sample (64² frames, 400 µm apart, 60 positions), the frame-sized periodic
    model with this transfer misses the exact (padded) simulation by 8.6 % in diffraction
    amplitude with the disc and by 0.5 % without it (``nyquist_fraction=None``); Poisson
    noise at 10⁶ photons a frame is 3.2 %, and one layer (the projection) misses by 7.9 %.
    Pty-Chi's multislice propagator applies neither limit (evanescent waves only).
    """
    if m < 1:
        raise ValueError(f"window size must be ≥ 1, got {m}")
    for name, v in (("wavelength_m", wavelength_m), ("pixel_size_m", pixel_size_m)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be finite and > 0, got {v!r}")
    if not (math.isfinite(spacing_m) and spacing_m >= 0):
        raise ValueError(f"spacing_m must be finite and ≥ 0, got {spacing_m!r}")
    h = transfer_function(m, wavelength_m, spacing_m, pixel_size_m)
    f = np.fft.fftfreq(m) / pixel_size_m
    df = 1.0 / (m * pixel_size_m)
    f_lim = 1.0 / (wavelength_m * math.sqrt((2.0 * df * spacing_m) ** 2 + 1.0))
    axis = np.abs(f) < f_lim
    keep = axis[:, None] & axis[None, :]
    if nyquist_fraction is not None:
        if not 0 < nyquist_fraction <= 1:
            raise ValueError(f"nyquist_fraction must be in (0, 1], got {nyquist_fraction!r}")
        radius = nyquist_fraction * 0.5 / pixel_size_m
        keep &= f[:, None] ** 2 + f[None, :] ** 2 <= radius**2
    return np.where(keep, h, 0).astype(np.complex64)


def depth_of_field(wavelength_m: float, pixel_size_m: float) -> float:
    """Depth of field ``Δx²/λ`` (metres) of a reconstruction with pixel ``Δx``.

    Over this distance a feature one pixel wide blurs by about one pixel (Fresnel number
    Δx²/(λz) = 1); a sample thicker than it is not one layer. This is the estimate
    PTYCHO_MATH.md uses (24 µm at 58.7 nm pixels and 8.8 keV); the multislice literature
    (e.g. Tsai et al., Opt. Express 24, 29089 (2016)) uses the same Δx²/λ scaling with
    constant factors of order one.
    """
    if not (math.isfinite(wavelength_m) and wavelength_m > 0):
        raise ValueError(f"wavelength must be finite and > 0 metres, got {wavelength_m!r}")
    if not (math.isfinite(pixel_size_m) and pixel_size_m > 0):
        raise ValueError(f"pixel size must be finite and > 0 metres, got {pixel_size_m!r}")
    return pixel_size_m**2 / wavelength_m


def separation_frequency(wavelength_m: float, spacing_m: float) -> float:
    """The spatial frequency (cycles per metre) above which two layers ``spacing_m`` apart can
    be told apart: ``π·λ·Δz·f² = 1``, where propagation over Δz turns the phase of frequency f
    by one radian. Below it, content can move between the layers without changing the data:
    only their product (the projection) is defined there (PTYCHO_MATH.md, "Multislice")."""
    if not (math.isfinite(wavelength_m) and wavelength_m > 0):
        raise ValueError(f"wavelength must be finite and > 0 metres, got {wavelength_m!r}")
    if not (math.isfinite(spacing_m) and spacing_m > 0):
        raise ValueError(f"spacing must be finite and > 0 metres, got {spacing_m!r}")
    return 1.0 / math.sqrt(math.pi * wavelength_m * spacing_m)
