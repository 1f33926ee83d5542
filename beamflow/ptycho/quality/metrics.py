"""Image-quality metrics for ptychographic reconstructions (pure numpy).

Two families:

* **Error against ground truth** (:func:`compare`, :func:`complex_nrmse`, :func:`phase_nrmse`).
  A ptychographic solution is only defined up to a global complex factor, a linear phase
  ramp traded between object and probe (a probe shift in reciprocal space) and a rigid
  translation of the object frame (a probe shift in real space) [Guizar-Sicairos & Fienup
  2008, Opt. Express 16, 7264; Maiden & Rodenburg 2009, Ultramicroscopy 109, 1256]. Before
  comparing, the reconstruction is

  1. registered with the truth to sub-pixel precision: masked normalised cross-correlation
     (Padfield 2012) refined by the matrix-multiply upsampled DFT of Guizar-Sicairos,
     Thurman & Fienup, Opt. Lett. 33, 156 (2008); the *truth* is then moved onto the
     reconstruction by the Fourier shift theorem (the scored array is never interpolated);
  2. multiplied by exp(i(g_y·y + g_x·x)), the least-squares phase plane of
     ``truth · conj(reconstruction)`` over the region of interest (amplitude-weighted);
     steps 1–2 alternate until the shift is stable, since each biases the other;
  3. multiplied by the optimal complex scalar ``c = Σ conj(R)·T / Σ |R|²`` over the region,
     which removes the global amplitude and phase factor;

  then ``complex NRMSE = ‖c·R − T‖ / ‖T‖`` over the region, as in PTYCHO_MATH.md.

* **Fourier ring correlation** (:func:`frc`) between two images, e.g. two independent
  half-data reconstructions: ring-averaged normalised cross-spectrum with the fixed 1/7
  threshold or the half-bit threshold of van Heel & Schatz, J. Struct. Biol. 151, 250 (2005).

Conventions (all functions):

* Arrays are 2-D ``[y, x]``; complex objects may be any float/complex dtype and are computed
  in complex128 (metrics are cheap; precision matters more than speed here).
* A *shift* ``s = (s_y, s_x)`` in pixels means ``shifted(r) = image(r − s)``: a positive
  ``s_x`` moves features to larger ``x``. :func:`register_shift` returns the ``s`` that
  :func:`fourier_shift` must apply to ``moving`` to match ``reference``.
* Phase ramps are in radians per pixel along ``(y, x)``.
* ``mask`` is a boolean array of the object's shape selecting the region that counts (e.g.
  the well-illuminated region, see :func:`illumination_mask`); ``None`` means everywhere.
  The mask is in the *truth's* frame. Fourier shifts are circular: keep the region away from
  the array edges by more than the expected shift.
* Not handled: the "twin" ambiguity (conjugated, 180°-rotated object). Compare against
  ``np.conj(truth[::-1, ::-1])`` yourself if a reconstruction may have fallen into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "Comparison",
    "FRCResult",
    "compare",
    "complex_nrmse",
    "fit_phase_ramp",
    "fourier_shift",
    "frc",
    "illumination_mask",
    "phase_nrmse",
    "register_shift",
]

_EPS = 1e-30


# --------------------------------------------------------------------------- helpers


def _as_image(a: ArrayLike, name: str) -> NDArray[np.complex128]:
    arr = np.asarray(a)
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D image, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name}: empty image")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: contains NaN or infinite values")
    return arr.astype(np.complex128, copy=False)


def _as_mask(mask: ArrayLike | None, shape: tuple[int, ...]) -> NDArray[np.bool_]:
    if mask is None:
        return np.ones(shape, dtype=bool)
    m = np.asarray(mask)
    if m.shape != shape:
        raise ValueError(f"mask: shape {m.shape} differs from the image shape {shape}")
    m = m.astype(bool, copy=False)
    if m.sum() < 3:
        raise ValueError("mask: selects fewer than 3 pixels")
    return m


def _upsampled_dft(
    data: NDArray[np.complex128],
    region: int,
    upsample: int,
    offsets: NDArray[np.float64],
) -> NDArray[np.complex128]:
    """Inverse DFT of ``data`` on a ``region``² grid of spacing 1/upsample pixels.

    The grid starts at ``-offsets/upsample`` pixels (Guizar-Sicairos et al. 2008, eq. 1 by
    matrix multiplication): O(region·N²) instead of an FFT of the upsampled array.
    """
    out = data
    # Contract the last axis first so each step is one matrix product.
    for axis in (1, 0):
        n = data.shape[axis]
        kernel = np.exp(
            (2j * np.pi / (n * upsample))
            * (np.arange(region)[:, None] - offsets[axis])
            * np.fft.ifftshift(np.arange(n) - n // 2)[None, :]
        )
        out = np.tensordot(kernel, out, axes=(1, axis))
        # tensordot puts the new axis first; move it back into place.
        if axis == 1:
            out = np.moveaxis(out, 0, 1)
    return out


def _mean_phase_gradient(z: NDArray[np.complex128], mask: NDArray[np.bool_]) -> NDArray:
    """Amplitude-weighted mean phase step per pixel along (y, x), robust to wrapping.

    angle(Σ z[r+1]·conj(z[r])) is the phase of the average neighbour-to-neighbour phasor,
    which stays exact for ramps up to ±π per pixel where a plane fit to wrapped phase fails.
    """
    gy_pairs = mask[1:, :] & mask[:-1, :]
    gx_pairs = mask[:, 1:] & mask[:, :-1]
    sy = np.sum((z[1:, :] * np.conj(z[:-1, :]))[gy_pairs])
    sx = np.sum((z[:, 1:] * np.conj(z[:, :-1]))[gx_pairs])
    return np.array([np.angle(sy), np.angle(sx)])


# --------------------------------------------------------------------------- registration


def fourier_shift(image: ArrayLike, shift: tuple[float, float]) -> NDArray[np.complex128]:
    """Shift ``image`` by ``shift = (s_y, s_x)`` pixels (sub-pixel, circular).

    Returns ``image(r − s)`` computed as ``F⁻¹[F[image] · exp(−2πi k·s)]``. The result is
    complex; take ``.real`` for a real input if wanted.
    """
    img = _as_image(image, "image")
    ky = np.fft.fftfreq(img.shape[0])[:, None]
    kx = np.fft.fftfreq(img.shape[1])[None, :]
    phase = np.exp(-2j * np.pi * (ky * shift[0] + kx * shift[1]))
    return np.fft.ifft2(np.fft.fft2(img) * phase)


def register_shift(
    reference: ArrayLike,
    moving: ArrayLike,
    *,
    moving_mask: ArrayLike | None = None,
    upsample: int = 100,
    normalization: Literal["phase", "none"] = "phase",
) -> tuple[float, float]:
    """Sub-pixel translation between two images (Guizar-Sicairos et al., Opt. Lett. 2008).

    Locates the peak of the cross-correlation ``F⁻¹[F[reference]·conj(F[moving])]`` on the
    pixel grid, then refines it to ``1/upsample`` pixel by an upsampled DFT (matrix
    multiplication) in a 1.5-pixel neighbourhood. With ``normalization="phase"`` the
    cross-power spectrum is normalised to unit modulus (phase correlation: a sharp peak,
    insensitive to smooth amplitude differences); ``"none"`` is plain cross-correlation.

    With ``moving_mask`` (boolean, the moving image's shape) only the moving image's pixels
    in the mask are used, while ``reference`` is used everywhere: the score is then the
    masked normalised cross-correlation (Padfield, IEEE TIP 21, 2706, 2012) — window means
    removed and window energies divided out at every shift, all by FFT — so that the
    window neither pulls the peak nor needs the reference to be valid outside it. It is
    exactly 1 at the true shift of an exact copy, hence unbiased. ``normalization`` is then
    ignored.

    Returns ``s = (s_y, s_x)`` such that ``fourier_shift(moving, s) ≈ reference``.
    """
    ref = _as_image(reference, "reference")
    mov = _as_image(moving, "moving")
    if ref.shape != mov.shape:
        raise ValueError(f"reference shape {ref.shape} differs from moving shape {mov.shape}")
    if upsample < 1:
        raise ValueError(f"upsample must be >= 1, got {upsample}")
    if normalization not in ("phase", "none"):
        raise ValueError(f"normalization must be 'phase' or 'none', got {normalization!r}")

    f_ref = np.fft.fft2(ref)
    if moving_mask is None:
        spectra = [f_ref * np.conj(np.fft.fft2(mov))]
        if normalization == "phase":
            spectra[0] = spectra[0] / np.maximum(np.abs(spectra[0]), _EPS)

        def score(c: list[NDArray]) -> NDArray:
            return np.abs(c[0])

    else:
        m = _as_mask(moving_mask, mov.shape)
        mw = m.astype(np.float64)
        n_m = mw.sum()
        mov = np.where(m, mov, 0)
        sum_mov = mov.sum()
        var_mov = max(np.vdot(mov, mov).real - abs(sum_mov) ** 2 / n_m, _EPS)
        f_m = np.conj(np.fft.fft2(mw))
        # Correlations at shift s (sums over the moving window placed at r + s):
        #   Σ ref·conj(mov),  Σ_window ref,  Σ_window |ref|².
        spectra = [
            f_ref * np.conj(np.fft.fft2(mov)),
            f_ref * f_m,
            np.fft.fft2(np.abs(ref) ** 2) * f_m,
        ]

        def score(c: list[NDArray]) -> NDArray:
            num = np.abs(c[0] - c[1] * np.conj(sum_mov) / n_m)
            var_ref = c[2].real - np.abs(c[1]) ** 2 / n_m
            return num / np.sqrt(np.maximum(var_ref, _EPS) * var_mov)

    # ifft2 and _upsampled_dft / size both give true sums, so the score is comparable.
    coarse = score([np.fft.ifft2(sp) for sp in spectra])
    peak = np.array(np.unravel_index(np.argmax(coarse), coarse.shape), dtype=np.float64)
    shape = np.array(coarse.shape, dtype=np.float64)
    peak[peak > shape // 2] -= shape[peak > shape // 2]
    if upsample == 1:
        return float(peak[0]), float(peak[1])
    # Refine: evaluate the score on a fine grid of ±0.75 px around the coarse peak.
    region = int(np.ceil(upsample * 1.5))
    centre = region // 2
    offsets = centre - peak * upsample
    fine = score([_upsampled_dft(sp, region, upsample, offsets) / sp.size for sp in spectra])
    fy, fx = np.unravel_index(np.argmax(fine), fine.shape)
    refined = peak + (np.array([fy, fx], dtype=np.float64) - centre) / upsample
    return float(refined[0]), float(refined[1])


# --------------------------------------------------------------------------- phase ramps


def fit_phase_ramp(z: ArrayLike, mask: ArrayLike | None = None) -> tuple[float, float, float]:
    """Least-squares phase plane ``a + g_y·y + g_x·x`` of a complex image over ``mask``.

    Coordinates are pixel indices of the full array. The fit is done in two steps so that a
    ramp steeper than the phase range never meets a wrapped phase: a coarse gradient from
    the average neighbour phasor, then an amplitude-weighted least-squares plane through the
    (now small, unwrapped) residual phase. Returns ``(a, g_y, g_x)`` in radians and
    radians per pixel.
    """
    zz = _as_image(z, "z")
    m = _as_mask(mask, zz.shape)
    y0, x0 = np.indices(zz.shape, dtype=np.float64)
    cy, cx = y0[m].mean(), x0[m].mean()
    y, x = y0 - cy, x0 - cx
    g = _mean_phase_gradient(zz, m)
    # Remove the coarse plane and the mean phase so the residual is near zero everywhere.
    res = zz * np.exp(-1j * (g[0] * y + g[1] * x))
    a0 = np.angle(np.sum(res[m]))
    phi = np.angle(res[m] * np.exp(-1j * a0))
    w = np.abs(zz[m])
    if not np.any(w > 0):
        return 0.0, 0.0, 0.0
    design = np.stack([np.ones_like(phi), y[m], x[m]], axis=1) * w[:, None]
    coef, *_ = np.linalg.lstsq(design, phi * w, rcond=None)
    a, gy, gx = a0 + coef[0], g[0] + coef[1], g[1] + coef[2]
    # Express the offset at the array origin rather than the mask centroid.
    a = a - gy * cy - gx * cx
    return float(np.angle(np.exp(1j * a))), float(gy), float(gx)


# --------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Comparison:
    """Result of :func:`compare`.

    The comparison is made in the *reconstruction's* frame: the (clean) truth is shifted
    onto the reconstruction, never the reverse, so that no interpolation touches the array
    being scored and artefacts outside the valid region cannot ring into it.

    Attributes:
        nrmse: complex NRMSE ``‖c·e^{iθ}·R − T_s‖ / ‖T_s‖`` over the region.
        phase_nrmse: RMS of the wrapped phase difference (its mean removed) divided by the
            RMS of the truth's phase about its mean, over the region. 0 is perfect; about 1
            means the phase carries no information about the truth.
        phase_rms_rad: RMS of that phase difference in radians.
        shift: ``(s_y, s_x)`` such that ``fourier_shift(reconstruction, shift)`` lies on the
            truth (pixels); the truth was shifted by ``-shift``.
        ramp: the phase ramp ``(g_y, g_x)`` multiplied onto the reconstruction, rad/pixel.
        scale: the optimal complex factor ``c`` applied last.
        reconstruction: ``c · e^{i(g·r)} · reconstruction``, the corrected estimate.
        truth: the truth shifted into the reconstruction's frame.
        mask: the region in the reconstruction's frame (the input mask moved by the
            nearest whole-pixel shift).
    """

    nrmse: float
    phase_nrmse: float
    phase_rms_rad: float
    shift: tuple[float, float]
    ramp: tuple[float, float]
    scale: complex
    reconstruction: NDArray[np.complex128]
    truth: NDArray[np.complex128]
    mask: NDArray[np.bool_]


def _taper_outside(
    z: NDArray[np.complex128], mask: NDArray[np.bool_], guard: tuple[float, float]
) -> NDArray[np.complex128]:
    """``z`` relaxed smoothly to its masked mean between the region and the array edges.

    An FFT shift treats the array as periodic: the jump where opposite edges meet rings
    (Gibbs) across the whole image. Tapering the margin outside the region's bounding box
    (grown by the shift plus a guard pixel) makes the array smooth across the edges while
    leaving every pixel that the shift moves into the region untouched.
    """
    mean = z[mask].mean()
    w = np.ones(z.shape)
    for axis, s in enumerate(guard):
        idx = np.nonzero(mask.any(axis=1 - axis))[0]
        n = z.shape[axis]
        g = int(np.ceil(abs(s))) + 2
        lo, hi = max(idx[0] - g, 0), min(idx[-1] + g, n - 1)
        prof = np.ones(n)
        if lo > 0:
            prof[:lo] = 0.5 * (1 - np.cos(np.pi * np.arange(lo) / lo))
        if hi < n - 1:
            k = n - 1 - hi
            prof[hi + 1 :] = 0.5 * (1 - np.cos(np.pi * np.arange(k - 1, -1, -1) / k))
        w *= prof[:, None] if axis == 0 else prof[None, :]
    return mean + (z - mean) * w


def compare(
    reconstruction: ArrayLike,
    truth: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    register: bool = True,
    remove_ramp: bool = True,
    upsample: int = 100,
) -> Comparison:
    """Compare a reconstructed complex object with the ground truth.

    Registers ``reconstruction`` and ``truth`` (sub-pixel, masked normalised
    cross-correlation), removes the least-squares phase plane of
    ``truth·conj(reconstruction)`` and the optimal complex scalar over the region, then
    computes complex and phase NRMSE over the region. See the module docstring for the
    conventions and references, and :class:`Comparison` for the frame used.

    Args:
        reconstruction: complex 2-D object estimate.
        truth: complex 2-D ground truth of the same shape and pixel size.
        mask: boolean region of interest, e.g. the well-illuminated region (None:
            everywhere). Only the reconstruction's pixels in it are used, so garbage
            outside (unscanned object) does not matter.
        register: estimate and undo a translation (set False when frames are known equal).
        remove_ramp: estimate and undo a linear phase ramp.
        upsample: registration precision is ``1/upsample`` pixel.
    """
    rec = _as_image(reconstruction, "reconstruction")
    tru = _as_image(truth, "truth")
    if rec.shape != tru.shape:
        raise ValueError(f"reconstruction shape {rec.shape} differs from truth shape {tru.shape}")
    m = _as_mask(mask, tru.shape)
    if np.linalg.norm(tru[m]) == 0:
        raise ValueError("truth: zero everywhere in the mask; NRMSE is undefined")

    y, x = np.indices(tru.shape, dtype=np.float64)
    ramp = np.zeros(2)
    if remove_ramp:
        # A relative ramp decorrelates the images, so remove it *before* registering, in
        # the reconstruction's own frame. First guess: the difference of the images' own
        # mean phase gradients, exact when the only other difference is a shift.
        ramp = _mean_phase_gradient(tru, m) - _mean_phase_gradient(rec, m)

    shift = (0.0, 0.0)
    t_s, m_s = tru, m
    # Alternate registration and ramp fit: a residual ramp biases the correlation peak and
    # a misregistration biases the ramp, so repeat until the shift stops changing (2–3
    # passes in practice). From the second pass on, the truth's margin beyond the region
    # (grown by the current shift) is tapered, so the sub-pixel interpolation inside the
    # correlation does not ring from the array edges.
    max_passes = 5 if (register and remove_ramp) else 2 if register else 1
    for i in range(max_passes):
        ramped = rec * np.exp(1j * (ramp[0] * y + ramp[1] * x))
        previous = shift
        if register:
            ref = tru if i == 0 else _taper_outside(tru, m, shift)
            shift = register_shift(ref, ramped, moving_mask=m, upsample=upsample)
            t_s = fourier_shift(_taper_outside(tru, m, shift), (-shift[0], -shift[1]))
            m_s = np.roll(m, (-round(shift[0]), -round(shift[1])), axis=(0, 1))
        if remove_ramp:
            # Residual ramp, jointly fitted on the registered pair.
            _, gy, gx = fit_phase_ramp(t_s * np.conj(ramped), m_s)
            ramp = ramp + np.array([gy, gx])
        if i > 0 and shift == previous:
            break
    corrected = rec * np.exp(1j * (ramp[0] * y + ramp[1] * x))

    r_m, t_m = corrected[m_s], t_s[m_s]
    denom = np.vdot(r_m, r_m).real
    c = complex(np.vdot(r_m, t_m) / denom) if denom > 0 else 0j
    corrected = c * corrected
    nrmse = float(np.linalg.norm(c * r_m - t_m) / np.linalg.norm(t_m))

    dphi = np.angle(c * r_m * np.conj(t_m))
    dphi = np.angle(np.exp(1j * (dphi - np.angle(np.mean(np.exp(1j * dphi))))))
    phase_rms = float(np.sqrt(np.mean(dphi**2)))
    # Truth phase about its circular mean, so a truth near ±π is not split by the wrap.
    t_phase = np.angle(t_m * np.exp(-1j * np.angle(np.mean(np.exp(1j * np.angle(t_m))))))
    t_rms = float(np.sqrt(np.mean((t_phase - t_phase.mean()) ** 2)))
    phase_nrmse = phase_rms / t_rms if t_rms > 0 else float("inf")
    return Comparison(
        nrmse=nrmse,
        phase_nrmse=phase_nrmse,
        phase_rms_rad=phase_rms,
        shift=shift,
        ramp=(float(ramp[0]), float(ramp[1])),
        scale=c,
        reconstruction=corrected,
        truth=t_s,
        mask=m_s,
    )


def complex_nrmse(
    reconstruction: ArrayLike, truth: ArrayLike, mask: ArrayLike | None = None, **kwargs
) -> float:
    """Complex NRMSE after registration, ramp and global-factor removal (see :func:`compare`)."""
    return compare(reconstruction, truth, mask, **kwargs).nrmse


def phase_nrmse(
    reconstruction: ArrayLike, truth: ArrayLike, mask: ArrayLike | None = None, **kwargs
) -> float:
    """Phase NRMSE after registration, ramp and global-factor removal (see :func:`compare`)."""
    return compare(reconstruction, truth, mask, **kwargs).phase_nrmse


def illumination_mask(
    object_shape: tuple[int, int],
    probe: ArrayLike,
    corners: ArrayLike,
    fraction: float = 0.1,
) -> NDArray[np.bool_]:
    """The well-illuminated region: where the summed probe intensity ≥ ``fraction``·max.

    Args:
        object_shape: ``(H, W)`` of the object array.
        probe: ``[M, M]`` or ``[K, M, M]`` probe (modes are summed incoherently).
        corners: ``[N, 2]`` top-left corners ``(y, x)`` of each probe patch in object pixels
            (fractional values are rounded; the mask is coarse by design).
        fraction: threshold relative to the maximum of the summed illumination.
    """
    p = np.asarray(probe)
    if p.ndim == 2:
        p = p[None]
    if p.ndim != 3:
        raise ValueError(f"probe: expected [M,M] or [K,M,M], got shape {p.shape}")
    c = np.rint(np.asarray(corners, dtype=np.float64)).astype(np.int64)
    if c.ndim != 2 or c.shape[1] != 2:
        raise ValueError(f"corners: expected shape [N, 2], got {c.shape}")
    intensity = np.sum(np.abs(p) ** 2, axis=0)
    h, w = intensity.shape
    H, W = object_shape
    if c.size and (c.min() < 0 or np.any(c[:, 0] + h > H) or np.any(c[:, 1] + w > W)):
        raise ValueError("corners: a probe patch falls outside the object array")
    illum = np.zeros(object_shape, dtype=np.float64)
    for cy, cx in c:
        illum[cy : cy + h, cx : cx + w] += intensity
    peak = illum.max()
    return illum >= fraction * peak if peak > 0 else np.zeros(object_shape, dtype=bool)


# --------------------------------------------------------------------------- FRC


@dataclass(frozen=True)
class FRCResult:
    """Result of :func:`frc`.

    Attributes:
        frequency: ring centre spatial frequency, cycles per pixel (0 … 0.5), or per metre
            when a pixel size was given.
        curve: the FRC value per ring (1 for identical images, ≈0 for independent noise).
        n_pixels: number of Fourier pixels per ring.
        threshold: threshold curve used per ring (constant 1/7 or the half-bit curve).
        resolution: full-period resolution ``1/f`` where the curve first falls below the
            threshold (linear interpolation), in pixels or metres; ``None`` when it never
            falls below it (resolution is limited by the pixel size, i.e. ≤ 2 pixels).
    """

    frequency: NDArray[np.float64]
    curve: NDArray[np.float64]
    n_pixels: NDArray[np.int64]
    threshold: NDArray[np.float64]
    resolution: float | None


def _tukey(n: int, alpha: float) -> NDArray[np.float64]:
    if alpha <= 0 or n < 3:
        return np.ones(n)
    t = np.linspace(0.0, 1.0, n)
    w = np.ones(n)
    edge = t < alpha / 2
    w[edge] = 0.5 * (1 + np.cos(np.pi * (2 * t[edge] / alpha - 1)))
    edge = t > 1 - alpha / 2
    w[edge] = 0.5 * (1 + np.cos(np.pi * (2 * t[edge] / alpha - 2 / alpha + 1)))
    return w


def frc(
    image1: ArrayLike,
    image2: ArrayLike,
    *,
    threshold: Literal["1/7", "half-bit"] = "1/7",
    pixel_size: float | None = None,
    apodization: float = 0.2,
    skip_rings: int = 1,
) -> FRCResult:
    """Fourier ring correlation of two images (real or complex).

    ``FRC(r) = Re Σ_r F₁·conj(F₂) / sqrt(Σ_r |F₁|² · Σ_r |F₂|²)`` over rings of width one
    Fourier pixel of the smaller dimension (Saxton & Baumeister 1982; van Heel 1987).
    Thresholds: ``"1/7"`` is the fixed 0.143 criterion; ``"half-bit"`` is
    ``(0.2071 + 1.9102/√n) / (1.2071 + 0.9102/√n)`` with ``n`` pixels in the ring
    (van Heel & Schatz, J. Struct. Biol. 2005). For two half-data reconstructions, align
    them first (:func:`register_shift`); the FRC does not register.

    Args:
        image1, image2: 2-D images of equal shape.
        threshold: ``"1/7"`` or ``"half-bit"``.
        pixel_size: if given (metres), frequencies are per metre and resolution in metres.
        apodization: Tukey window fraction applied to both images against edge artefacts
            (0 disables).
        skip_rings: rings near zero frequency ignored when looking for the crossing (the
            curve is noisy and meaningless there).
    """
    a = _as_image(image1, "image1")
    b = _as_image(image2, "image2")
    if a.shape != b.shape:
        raise ValueError(f"image1 shape {a.shape} differs from image2 shape {b.shape}")
    window = np.outer(_tukey(a.shape[0], apodization), _tukey(a.shape[1], apodization))
    fa = np.fft.fft2(a * window)
    fb = np.fft.fft2(b * window)
    ky = np.fft.fftfreq(a.shape[0])[:, None]
    kx = np.fft.fftfreq(a.shape[1])[None, :]
    n_ref = min(a.shape)
    ring = np.rint(np.sqrt(ky**2 + kx**2) * n_ref).astype(np.int64).ravel()
    n_rings = n_ref // 2 + 1  # up to the Nyquist frequency of the smaller axis
    keep = ring < n_rings
    ring = ring[keep]
    cross = np.bincount(ring, (fa * np.conj(fb)).real.ravel()[keep], minlength=n_rings)
    pa = np.bincount(ring, (np.abs(fa) ** 2).ravel()[keep], minlength=n_rings)
    pb = np.bincount(ring, (np.abs(fb) ** 2).ravel()[keep], minlength=n_rings)
    count = np.bincount(ring, minlength=n_rings).astype(np.int64)
    denom = np.sqrt(pa * pb)
    curve = np.where(denom > 0, cross / np.maximum(denom, _EPS), 0.0)
    freq = np.arange(n_rings, dtype=np.float64) / n_ref

    if threshold == "1/7":
        thr = np.full(n_rings, 1.0 / 7.0)
    elif threshold == "half-bit":
        sq = np.sqrt(np.maximum(count, 1))
        thr = (0.2071 + 1.9102 / sq) / (1.2071 + 0.9102 / sq)
    else:
        raise ValueError(f"threshold must be '1/7' or 'half-bit', got {threshold!r}")

    resolution: float | None = None
    below = np.nonzero(curve[skip_rings:] < thr[skip_rings:])[0]
    if below.size:
        i = int(below[0]) + skip_rings
        if i == skip_rings:
            # Below threshold from the first ring considered: nothing is resolved beyond
            # the coarsest ring; report that ring's period (a lower bound on the truth).
            f_cross = freq[i]
        else:
            # Linear interpolation of (curve - threshold) between rings i-1 and i.
            d0 = curve[i - 1] - thr[i - 1]
            d1 = curve[i] - thr[i]
            t = d0 / (d0 - d1) if d0 != d1 else 0.0
            f_cross = freq[i - 1] + t * (freq[i] - freq[i - 1])
        resolution = 1.0 / f_cross if f_cross > 0 else float("inf")
    if pixel_size is not None:
        freq = freq / pixel_size
        if resolution is not None:
            resolution = resolution * pixel_size
    return FRCResult(
        frequency=freq, curve=curve, n_pixels=count, threshold=thr, resolution=resolution
    )
