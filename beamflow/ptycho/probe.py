"""Initial probe guesses (pure numpy; h5py only to read a probe file).

Conventions (PTYCHO_MATH.md):

* A probe is a complex array ``[M, M]`` (one mode) or ``[K, M, M]`` (K incoherent modes);
  the functions here return ``[K, M, M]`` complex64, ``K ≥ 1``.
* The far field is the unnormalised FFT, so ``Σ|F[P]|² = M² Σ|P|²`` (Parseval); detector
  frames and masks are stored with the zero frequency in the centre (``fftshift`` order).
* Propagation uses the paraxial Fresnel transfer function ``exp(−iπλΔz|k|²)``: a positive
  defocus ``Δz`` puts the sample *downstream* of the focus. ``k`` is in cycles per metre on
  the object grid, ``k = n / (M·Δx)``.

Guesses:

* :func:`load_probe` — a previous reconstruction: ``.npy`` or an HDF5 product (Ptychodus
  layout, dataset ``probe``).
* :func:`zone_plate_probe` — from Fresnel zone-plate optics: focal length ``f = D·d_r/λ``,
  the annular aperture (central stop) with its lens phase propagated by ``f + Δz``.
* :func:`probe_from_diffraction` — the mean diffraction amplitude ``√⟨I⟩`` as the probe's
  far field, with a chosen defocus curvature.
* :func:`scale_probe` — scale to the measured counts per frame.

Mixed-state modes (Thibault & Menzel, Nature 494, 68, 2013) are made from the first by the
engine's ``initial_state`` (:mod:`beamflow.ptycho.modes`), the one place that makes them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ProbeFileError",
    "ZonePlate",
    "load_probe",
    "mean_counts_per_frame",
    "probe_from_diffraction",
    "scale_probe",
    "wavelength_m",
    "zone_plate_probe",
]

#: h·c in eV·m: λ[m] = HC_EV_M / E[eV].
HC_EV_M = 1.239841984e-6


def wavelength_m(energy_eV: float) -> float:
    """X-ray wavelength [m] for a photon energy [eV]."""
    if not energy_eV > 0:
        raise ValueError(f"photon energy must be positive, got {energy_eV} eV")
    return HC_EV_M / energy_eV


class ProbeFileError(ValueError):
    """A probe file that cannot be used; the message names the file and the problem."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


# --------------------------------------------------------------------------- from a file


def _as_modes(arr: np.ndarray, path: Path, where: str) -> NDArray[np.complex64]:
    """Validate a probe array read from ``path`` and return it as ``[K, M, M]`` complex64."""
    if not (np.iscomplexobj(arr) or np.issubdtype(arr.dtype, np.floating)):
        raise ProbeFileError(path, f"{where}: expected a complex array, found dtype {arr.dtype}")
    a = arr
    # Ptychodus writes [OPR modes, incoherent modes, H, W]; OPR (position-dependent
    # probes) is not something an initial guess can carry.
    if a.ndim == 4:
        if a.shape[0] != 1:
            raise ProbeFileError(
                path, f"{where}: {a.shape[0]} OPR modes (shape {a.shape}); only 1 is supported"
            )
        a = a[0]
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3:
        raise ProbeFileError(
            path, f"{where}: expected [H, W], [modes, H, W] or [1, modes, H, W], got {a.shape}"
        )
    if a.shape[0] == 0 or a.shape[1] != a.shape[2]:
        raise ProbeFileError(path, f"{where}: expected square, non-empty modes, got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ProbeFileError(path, f"{where}: contains NaN or infinite values")
    if not np.any(a != 0):
        raise ProbeFileError(path, f"{where}: the probe is zero everywhere")
    return np.ascontiguousarray(a, dtype=np.complex64)


def load_probe(
    path: str | Path,
    *,
    frame_size: int | None = None,
    n_modes: int | None = None,
    pixel_size_m: float | None = None,
    rtol: float = 0.01,
) -> NDArray[np.complex64]:
    """Read a probe from a previous reconstruction.

    Args:
        path: a ``.npy`` file holding a complex ``[H, W]`` or ``[modes, H, W]`` array, or an
            HDF5 file (``.h5``, ``.hdf5``, ``.cxi``, a Ptychodus product) whose ``probe``
            dataset is ``[H, W]``, ``[modes, H, W]`` or ``[1, modes, H, W]``.
        frame_size: if given, the probe must be ``frame_size`` pixels square (the detector
            frame size M of the scan it will reconstruct).
        n_modes: if given, return at most this many modes: extra modes are dropped (they
            are ordered by power in a product); missing ones are made by the engine's
            ``initial_state``, the one place that makes modes.
        pixel_size_m: if given and the HDF5 ``probe`` dataset has a ``pixel_width_m``
            attribute, the two must agree within ``rtol`` (a probe from another geometry
            would be silently wrong).

    Returns:
        ``[K, M, M]`` complex64.

    Raises:
        ProbeFileError: missing file, unreadable file, no ``probe`` dataset, wrong shape or
            dtype, NaN values, or a frame size / pixel size that does not match.
    """
    p = Path(path)
    if not p.is_file():
        raise ProbeFileError(p, "no such file")
    suffix = p.suffix.lower()
    file_pixel: float | None = None
    if suffix == ".npy":
        try:
            arr = np.load(p, allow_pickle=False)
        except Exception as exc:  # numpy raises several types for bad files
            raise ProbeFileError(p, f"not a readable .npy array ({exc})") from exc
        probe = _as_modes(arr, p, "array")
    elif suffix in (".h5", ".hdf5", ".cxi", ".nxs"):
        import h5py
        import hdf5plugin  # noqa: F401  (registers compression filters a writer may use)

        try:
            with h5py.File(p, "r") as f:
                if "probe" not in f or not isinstance(f["probe"], h5py.Dataset):
                    raise ProbeFileError(p, "no 'probe' dataset (expected the product layout)")
                ds = f["probe"]
                arr = ds[()]
                if "pixel_width_m" in ds.attrs:
                    file_pixel = float(ds.attrs["pixel_width_m"])
        except ProbeFileError:
            raise
        except OSError as exc:
            raise ProbeFileError(p, f"not a readable HDF5 file ({exc})") from exc
        probe = _as_modes(np.asarray(arr), p, "dataset 'probe'")
    else:
        raise ProbeFileError(p, f"unknown probe file type {suffix!r} (use .npy or .h5)")

    m = probe.shape[-1]
    if frame_size is not None and m != frame_size:
        raise ProbeFileError(
            p, f"probe is {m}×{m} px but the scan's frames are {frame_size}×{frame_size} px"
        )
    if (
        pixel_size_m is not None
        and file_pixel is not None
        and not math.isclose(file_pixel, pixel_size_m, rel_tol=rtol)
    ):
        raise ProbeFileError(
            p,
            f"probe pixel size {file_pixel:.4g} m differs from the scan's object pixel "
            f"size {pixel_size_m:.4g} m",
        )
    if n_modes is not None:
        if n_modes < 1:
            raise ValueError(f"n_modes must be >= 1, got {n_modes}")
        probe = probe[:n_modes]
    return probe


# --------------------------------------------------------------------------- from optics


class ZonePlate(BaseModel):
    """Fresnel zone-plate optics.

    Attributes:
        diameter_m: outer diameter D.
        outer_zone_width_m: outermost zone width d_r (sets the focal length and the NA,
            ``NA = λ / (2 d_r)``).
        central_stop_fraction: diameter of the central stop as a fraction of D (0: none).
    """

    model_config = ConfigDict(frozen=True)

    diameter_m: float = Field(gt=0)
    outer_zone_width_m: float = Field(gt=0)
    central_stop_fraction: float = Field(default=0.0, ge=0, lt=1)

    def focal_length_m(self, energy_eV: float) -> float:
        """``f = D·d_r/λ`` (first diffraction order)."""
        return self.diameter_m * self.outer_zone_width_m / wavelength_m(energy_eV)


def zone_plate_probe(
    size: int,
    pixel_size_m: float,
    energy_eV: float,
    zone_plate: ZonePlate,
    defocus_m: float = 0.0,
) -> NDArray[np.complex64]:
    """The probe of a zone plate at ``defocus_m`` from its focus, on the object grid.

    The aperture ``A(ρ)`` (annulus: radius D/2, central stop) with the thin-lens phase
    ``exp(−iπρ²/(λf))`` is propagated by Fresnel diffraction over ``z = f + Δz``:

        P(x) ∝ exp(iπ|x|²/(λz)) · Σ_ρ A(ρ) exp(iπ|ρ|²(1/z − 1/f)/λ) exp(−2πi x·ρ/(λz)),

    a single FFT with the aperture sampled at ``dρ = λz/(M·Δx)`` so that the output lands
    on the object pixel size ``Δx``. Near focus this is the Debye picture: the aperture is
    the probe's angular spectrum (pupil radius ``1/(2 d_r)`` cycles/m) with the defocus phase
    ``exp(−iπλΔz|k|²)``. Aperture edges are anti-aliased over one sample.

    Args:
        size: M, the probe (detector frame) size in pixels.
        pixel_size_m: Δx, the object pixel size.
        energy_eV: photon energy.
        zone_plate: the optics.
        defocus_m: Δz; positive puts the sample downstream of the focus.

    Returns:
        ``[1, M, M]`` complex64 with ``Σ|P|² = 1`` (scale with :func:`scale_probe`).

    Raises:
        ValueError: if the defocused beam (diameter ``D·|Δz|/f``) does not fit in the
            ``M·Δx`` window, where the sampled probe would alias.
    """
    if size < 4:
        raise ValueError(f"probe size must be at least 4 px, got {size}")
    if not pixel_size_m > 0:
        raise ValueError(f"pixel size must be positive, got {pixel_size_m} m")
    lam = wavelength_m(energy_eV)
    f = zone_plate.focal_length_m(energy_eV)
    z = f + defocus_m
    if z <= 0:
        raise ValueError(f"defocus {defocus_m} m puts the sample before the zone plate (f={f} m)")
    window = size * pixel_size_m
    beam = zone_plate.diameter_m * abs(defocus_m) / f
    if beam > window:
        raise ValueError(
            f"the defocused beam ({beam * 1e6:.3g} µm across at Δz = {defocus_m * 1e3:.3g} mm) "
            f"does not fit the {window * 1e6:.3g} µm probe window ({size} px of "
            f"{pixel_size_m * 1e9:.3g} nm); reduce the defocus or enlarge the window"
        )
    d_rho = lam * z / window
    n = np.arange(size) - size // 2
    rho = np.hypot(*np.meshgrid(n * d_rho, n * d_rho, indexing="ij"))
    outer = np.clip((zone_plate.diameter_m / 2 - rho) / d_rho + 0.5, 0.0, 1.0)
    stop = zone_plate.central_stop_fraction * zone_plate.diameter_m / 2
    inner = np.clip((rho - stop) / d_rho + 0.5, 0.0, 1.0) if stop > 0 else 1.0
    # Residual curvature 1/z − 1/f = −Δz/(f·z), written so it stays exact at Δz = 0.
    field = outer * inner * np.exp(-1j * np.pi * rho**2 * defocus_m / (lam * f * z))
    probe = np.fft.fftshift(np.fft.fft2(np.fft.ifftshift(field)))
    x = n * pixel_size_m
    r2 = x[:, None] ** 2 + x[None, :] ** 2
    probe = probe * np.exp(1j * np.pi * r2 / (lam * z))
    probe /= np.sqrt(np.sum(np.abs(probe) ** 2))
    return probe.astype(np.complex64)[None]


# --------------------------------------------------------------------------- from the data


def mean_counts_per_frame(frames: ArrayLike, mask: ArrayLike | None = None) -> float:
    """Mean over frames of the total counts on valid pixels (``mask`` True = valid)."""
    d = np.asarray(frames)
    if d.ndim == 2:
        d = d[None]
    if d.ndim != 3 or d.shape[0] == 0:
        raise ValueError(f"frames: expected [N, M, M], got shape {d.shape}")
    if mask is not None:
        mk = np.asarray(mask, dtype=bool)
        if mk.shape != d.shape[1:]:
            raise ValueError(f"mask shape {mk.shape} differs from the frame shape {d.shape[1:]}")
        total = np.tensordot(d, mk.astype(np.float64), axes=([1, 2], [0, 1]))
    else:
        total = d.sum(axis=(1, 2), dtype=np.float64)
    return float(np.mean(total))


def _fill_masked(a: NDArray[np.float64], valid: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Fill invalid pixels with the mean of their valid 8-neighbours, growing inwards."""
    out = np.where(valid, a, 0.0)
    ok = valid.copy()
    for _ in range(max(a.shape)):
        if ok.all():
            break
        s = np.zeros_like(out)
        c = np.zeros_like(out)
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                if dy or dx:
                    s += np.roll(np.where(ok, out, 0.0), (dy, dx), axis=(0, 1))
                    c += np.roll(ok, (dy, dx), axis=(0, 1))
        new = ~ok & (c > 0)
        if not new.any():
            break
        out[new] = s[new] / c[new]
        ok |= new
    return out


def _checked_mean(
    frames: ArrayLike, mask: ArrayLike | None
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """The mean frame of ``[N, M, M]`` frames (or an ``[M, M]`` mean) and the valid-pixel mask,
    refusing what no probe can be built from."""
    d = np.asarray(frames, dtype=np.float64)
    mean = d if d.ndim == 2 else d.mean(axis=0) if d.ndim == 3 else None
    if mean is None or mean.shape[0] != mean.shape[1] or mean.size == 0:
        raise ValueError(f"frames: expected [N, M, M] or [M, M] square frames, got {d.shape}")
    if not np.all(np.isfinite(mean)):
        raise ValueError("frames: contain NaN or infinite values")
    valid = np.ones(mean.shape, bool) if mask is None else np.asarray(mask, dtype=bool)
    if valid.shape != mean.shape:
        raise ValueError(f"mask shape {valid.shape} differs from the frame shape {mean.shape}")
    if not np.any(mean[valid] > 0):
        raise ValueError("frames: no counts on valid pixels")
    return mean, valid


def probe_from_diffraction(
    frames: ArrayLike,
    *,
    pixel_size_m: float | None = None,
    energy_eV: float | None = None,
    defocus_m: float = 0.0,
    mask: ArrayLike | None = None,
) -> NDArray[np.complex64]:
    """Probe whose far field is the mean diffraction amplitude ``√⟨I⟩`` with a defocus phase.

    ``P = F⁻¹[√⟨I⟩(k) · exp(−iπλΔz|k|²)]``: for a weakly scattering object the bright-field
    intensity is ``|F[P]|²``, so its square root is the probe's far-field modulus, and the
    chosen curvature (the phase of a beam ``Δz`` downstream of its focus) spreads the probe
    over the window rather than leaving a flat-phase, sharply focused guess. Masked
    (invalid) pixels are filled from their neighbours. The result is scaled so that
    ``Σ|F[P]|²`` equals the mean counts per frame (valid pixels).

    Args:
        frames: ``[N, M, M]`` diffraction frames or an ``[M, M]`` mean, zero frequency in
            the centre (as the detector stores them).
        pixel_size_m: Δx, the object pixel size (needed only with a defocus).
        energy_eV: photon energy (needed only with a defocus).
        defocus_m: Δz of the curvature; 0 gives a flat far-field phase.
        mask: ``[M, M]`` valid-pixel mask (True = valid), zero frequency in the centre.

    Returns:
        ``[1, M, M]`` complex64.
    """
    mean, valid = _checked_mean(frames, mask)
    m = mean.shape[0]
    amp = np.sqrt(np.maximum(_fill_masked(mean, valid), 0.0))
    far = amp.astype(np.complex128)
    if defocus_m:
        if pixel_size_m is None or energy_eV is None:
            raise ValueError("a defocus curvature needs pixel_size_m and energy_eV")
        k = (np.arange(m) - m // 2) / (m * pixel_size_m)
        k2 = k[:, None] ** 2 + k[None, :] ** 2
        far *= np.exp(-1j * np.pi * wavelength_m(energy_eV) * defocus_m * k2)
    probe = np.fft.fftshift(np.fft.ifft2(np.fft.ifftshift(far)))
    return scale_probe(probe, mean_counts_per_frame(mean, valid), mask=valid)


def probe_from_hologram(
    frames: ArrayLike, transfer: ArrayLike, *, mask: ArrayLike | None = None
) -> NDArray[np.complex64]:
    """Near-field probe guess: the mean hologram amplitude ``√⟨I⟩`` propagated back to the
    sample, ``P = F⁻¹[conj(H)·F[√⟨I⟩]]``.

    A near-field scan has no central bright peak to build a far-field guess from; averaged
    over many positions the object's fringes wash out and ``⟨I⟩`` is close to the
    illumination's own hologram ``|D_z[P]|²``. Its flat phase is right for the effective
    (parallel-beam) geometry of the Fresnel scaling theorem, which removes the cone beam's
    curvature. Masked pixels are filled from their neighbours; the result is scaled so the
    model's counts on valid pixels match the mean counts per frame.

    Args:
        frames: ``[N, M, M]`` holograms or their ``[M, M]`` mean, as recorded (real space).
        transfer: ``[M, M]`` angular-spectrum transfer function H, FFT order.
        mask: ``[M, M]`` valid-pixel mask (True = valid), as recorded.

    Returns:
        ``[1, M, M]`` complex64.
    """
    mean, valid = _checked_mean(frames, mask)
    h = np.asarray(transfer)
    amp = np.sqrt(np.maximum(_fill_masked(mean, valid), 0.0))
    probe = np.fft.ifft2(np.conj(h) * np.fft.fft2(amp))
    return scale_probe(probe, mean_counts_per_frame(mean, valid), mask=valid, transfer=h)


# --------------------------------------------------------------------------- scale, modes


def scale_probe(
    probe: ArrayLike, counts_per_frame: float, mask: ArrayLike | None = None,
    transfer: ArrayLike | None = None,
) -> NDArray[np.complex64]:
    """Scale ``probe`` so that ``Σ_k Σ_valid |F[P_k]|²`` equals ``counts_per_frame``.

    With an object of unit transmission this makes the model's total counts match the
    measured mean (use :func:`mean_counts_per_frame` with the same mask), so the first
    modulus projections change the phase, not the scale. ``mask`` is the detector's
    valid-pixel mask with the zero frequency in the centre; without it all pixels count
    (then ``Σ|F[P]|² = M²·Σ|P|²``). Near field (``transfer`` = the propagator H, FFT
    order): the model is ``|F⁻¹[H·F[P]]|²`` and the mask is as recorded (real space).

    Returns:
        ``[K, M, M]`` complex64.
    """
    p = np.asarray(probe)
    if p.ndim == 2:
        p = p[None]
    if p.ndim != 3 or p.shape[-1] != p.shape[-2]:
        raise ValueError(f"probe: expected [M, M] or [K, M, M], got shape {p.shape}")
    if not counts_per_frame > 0:
        raise ValueError(f"counts per frame must be positive, got {counts_per_frame}")
    m = p.shape[-1]
    if transfer is not None:
        wave = np.fft.ifft2(np.asarray(transfer) * np.fft.fft2(p))
        valid = np.ones(p.shape[1:], bool) if mask is None else np.asarray(mask, dtype=bool)
        if valid.shape != p.shape[1:]:
            raise ValueError(f"mask shape {valid.shape} differs from the probe shape {p.shape}")
        power = float(np.sum(np.abs(wave[:, valid]) ** 2))
    elif mask is None:
        power = m * m * float(np.sum(np.abs(p) ** 2))
    else:
        valid = np.fft.ifftshift(np.asarray(mask, dtype=bool))
        if valid.shape != p.shape[1:]:
            raise ValueError(f"mask shape {valid.shape} differs from the probe shape {p.shape}")
        power = float(np.sum(np.abs(np.fft.fft2(p))[:, valid] ** 2))
    if not power > 0:
        raise ValueError("probe: zero power (on the valid pixels); cannot scale it")
    return (p * math.sqrt(counts_per_frame / power)).astype(np.complex64)


