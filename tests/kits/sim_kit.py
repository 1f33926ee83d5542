"""Scans the engine has never seen: simulators of their own, independent of beamflow.simulate.

beamflow/simulate.py makes the scans the project was tuned on (a zone-plate ring probe, a
Siemens star with bars and glyphs, Fermat spirals, a jittered grid in the near field, a beam
that drifts on one circle). An engine tuned only there may be tuned to them, so these scans
differ in everything but the physics:

* **Objects** are analytic (cells, a porous two-phase material, heavy nano-particles on a
  membrane), rendered on a grid ``SUPERSAMPLE`` times finer than the object pixel. Each
  window is the fine grid's average over the object pixels at the position's true sub-pixel
  offset (positions are multiples of 1/SUPERSAMPLE px): the object is moved under a fixed
  probe, as a stage moves it, not the probe shifted by a Fourier ramp as the engine does.
* **Probes** come from optics: a Kirkpatrick–Baez pair (a rectangular, separable pupil with
  each mirror's figure errors) or a zone plate (annular pupil, Zernike aberrations), propagated
  through their focus to the sample by Fresnel transforms, or a pinhole's Fresnel diffraction.
* **Scans**: concentric rings, a jittered raster, a fly scan's snake of rows; the near-field
  scans move the sample over part of the field.
* **Near field**: a cone beam from a focus ``z1`` upstream. The hologram is computed in the
  effective parallel geometry of the Fresnel scaling theorem (object pixel p/M, distance z2/M)
  with the paraxial Fresnel propagator on a grid twice the window (light leaves the window
  and none wraps round, unlike the engine's periodic model). The cone's spherical phase is
  what the theorem removes; the probe is the field at the sample divided by it.
* **Fly scans** vary the beam smoothly in time: its position at the sample, its focus and its
  flux drift along acquisition order; the stable twin has the mean beam at every position.

Every scan returns a :class:`Scan` with the Poisson-noisy frames, the true positions (top-left
corners in object pixels, as the engine takes them), the truth on the engine's grid and the
project's own score (:func:`beamflow.ptycho.quality.metrics.compare` over the well-lit region, as
:func:`beamflow.ground_truth.score_product` does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from beamflow.ptycho import PtychoData
from beamflow.ptycho.forward.propagation import Propagation
from beamflow.ptycho.quality.metrics import compare, illumination_mask

SUPERSAMPLE = 4
MARGIN_PX = 4


@dataclass(eq=False)
class Scan:
    """A simulated scan and its truth.

    frames: (N, M, M) float32 Poisson counts (far field: zero frequency in the centre).
    positions_px: (N, 2) true top-left corners (y, x) of each window, object pixels.
    object: (H, W) complex64, the truth on the engine's grid.
    probe: (M, M) complex64, the mean beam at the sample (effective geometry in the near
        field), scaled to the counts.
    probes: (N, M, M) each position's own beam (a fly scan), or None (a stable beam).
    """

    frames: np.ndarray
    positions_px: np.ndarray
    object: np.ndarray
    probe: np.ndarray
    propagation: Propagation
    probes: np.ndarray | None = None

    def data(self) -> PtychoData:
        return PtychoData(intensities=self.frames.copy(), positions_px=self.positions_px,
                          object_shape=self.object.shape)

    def region(self) -> np.ndarray:
        return illumination_mask(self.object.shape, self.probe, self.positions_px,
                                 fraction=0.3)

    def nrmse(self, obj: np.ndarray) -> float:
        """Complex NRMSE against the truth over the well-lit region (global factor, phase
        ramp and sub-pixel shift removed), the project's own score."""
        return compare(obj, self.object, self.region()).nrmse


# ----------------------------------------------------------------------------- objects


def _grid(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Fine-grid coordinates (y, x) in object pixels (pixel i spans [i, i+1))."""
    s = SUPERSAMPLE
    y = (np.arange(shape[0] * s) + 0.5) / s
    x = (np.arange(shape[1] * s) + 0.5) / s
    return y[:, None], x[None, :]


def _random_field(shape: tuple[int, int], rng: np.random.Generator,
                  length_px: float) -> np.ndarray:
    """A Gaussian random field of unit variance with correlation length ``length_px``
    (object pixels) on the fine grid."""
    s = SUPERSAMPLE
    fine = (shape[0] * s, shape[1] * s)
    k2 = (np.fft.fftfreq(fine[0])[:, None] ** 2 + np.fft.fftfreq(fine[1])[None] ** 2) * s * s
    spec = np.fft.fft2(rng.standard_normal(fine)) * np.exp(-2 * (np.pi * length_px) ** 2 * k2)
    f = np.real(np.fft.ifft2(spec))
    return (f - f.mean()) / f.std()


def cells(shape: tuple[int, int], rng: np.random.Generator, size: float = 1.0) -> np.ndarray:
    """Biological cells on a thin film: overlapping ellipsoids (projected thickness of an
    ellipsoid), each with a denser nucleus and a few small vesicles. A weak phase object
    (≲ 1.2 rad) with little absorption. Fine grid, complex128."""
    y, x = _grid(shape)
    h, w = shape
    t = 0.05 * _random_field(shape, rng, 6.0 * size)  # the film's uneven thickness
    dense = np.zeros_like(t)
    for _ in range(max(4, int(h * w / (500 * size * size)))):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        a, b = size * rng.uniform(5, 14), size * rng.uniform(4, 10)
        th = rng.uniform(0, np.pi)
        u = ((x - cx) * np.cos(th) + (y - cy) * np.sin(th)) / a
        v = (-(x - cx) * np.sin(th) + (y - cy) * np.cos(th)) / b
        t += 0.5 * np.sqrt(np.clip(1 - u * u - v * v, 0, None))
        nu, nv = rng.uniform(-0.3, 0.3, 2)
        dense += 0.6 * np.sqrt(np.clip(1 - ((u - nu) ** 2 + (v - nv) ** 2) / 0.12, 0, None))
        for _ in range(int(rng.integers(2, 6))):
            vu, vv = rng.uniform(-0.7, 0.7, 2)
            dense += 0.4 * (((u - vu) ** 2 + (v - vv) ** 2) < 0.012) * (u * u + v * v < 1)
    phase = 1.0 * t + 0.8 * dense
    return np.exp(1j * phase - 0.03 * phase)


def porous(shape: tuple[int, int], rng: np.random.Generator, size: float = 1.0) -> np.ndarray:
    """A porous two-phase material (a catalyst support, a battery electrode): a random field
    thresholded at a random level, its edges one fine sample wide; phase 0.9 rad and 8 %
    absorption where the solid is, and larger voids cut out. Fine grid, complex128."""
    f = _random_field(shape, rng, 2.5 * size)
    solid = (f > rng.uniform(-0.4, 0.2)).astype(np.float64)
    y, x = _grid(shape)
    h, w = shape
    for _ in range(max(2, int(h * w / 1500))):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), size * rng.uniform(3, 8)
        solid[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = 0.0
    return np.exp((1j * 0.9 - 0.08) * solid)


def particles(shape: tuple[int, int], rng: np.random.Generator,
              size: float = 1.0) -> np.ndarray:
    """Heavy nano-particles (gold-like, β/δ = 0.1) of 1–6 px radius on a membrane with a
    gentle thickness gradient: projected thickness 2√(R² − r²), up to ~2 rad. Fine grid."""
    y, x = _grid(shape)
    h, w = shape
    t = np.zeros(np.broadcast(y, x).shape)
    for _ in range(max(6, int(h * w / (120 * size * size)))):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        r = size * (rng.uniform(1.0, 6.0) if rng.random() < 0.7 else rng.uniform(1.0, 2.0))
        t += np.sqrt(np.clip(r * r - (y - cy) ** 2 - (x - cx) ** 2, 0, None)) / 6.0
    membrane = 0.3 + 0.2 * (y / h) - 0.1 * (x / w)
    phase = 1.0 * t + membrane
    return np.exp(1j * phase - 0.1 * t)


OBJECTS = {"cells": cells, "porous": porous, "particles": particles}


def render(fine: np.ndarray, corner_fine: tuple[int, int], m: int) -> np.ndarray:
    """The (m, m) window at fine-grid corner ``corner_fine``, averaged over object pixels."""
    s = SUPERSAMPLE
    y0, x0 = corner_fine
    win = fine[y0 : y0 + m * s, x0 : x0 + m * s]
    return win.reshape(m, s, m, s).mean(axis=(1, 3))


def on_engine_grid(fine: np.ndarray) -> np.ndarray:
    s = SUPERSAMPLE
    h, w = fine.shape[0] // s, fine.shape[1] // s
    return fine.reshape(h, s, w, s).mean(axis=(1, 3)).astype(np.complex64)


# ----------------------------------------------------------------------------- scans


def rings(n: int, radius_px: float) -> np.ndarray:
    """Concentric rings (y, x) around 0: ring r holds ∝ r points, from the centre out to
    ``radius_px``, each ring at a random-free fixed phase offset."""
    n_rings = 1
    while 1 + 3 * n_rings * (n_rings + 1) < n:  # 1 + 6 + 12 + ... points
        n_rings += 1
    pts = [(0.0, 0.0)]
    for r in range(1, n_rings + 1):
        k = 6 * r
        th = 2 * np.pi * (np.arange(k) + 0.5 * (r % 2)) / k
        rad = radius_px * r / n_rings
        pts += list(zip(rad * np.sin(th), rad * np.cos(th), strict=True))
    return np.asarray(pts[:n])


def jittered_raster(n: int, step_px: float, rng: np.random.Generator,
                    jitter: float = 0.25) -> np.ndarray:
    """A square raster of ``step_px`` with each point moved by up to ±``jitter`` steps."""
    side = math.ceil(math.sqrt(n))
    j = np.arange(n)
    pos = np.stack([j // side, j % side], 1).astype(np.float64) * step_px
    return pos + rng.uniform(-jitter, jitter, pos.shape) * step_px


def snake(n: int, step_px: float, rng: np.random.Generator) -> np.ndarray:
    """A fly scan's path in acquisition order: rows along x, alternate rows backwards, points
    at equal times along each row, a little wobble across it."""
    side = math.ceil(math.sqrt(n))
    j = np.arange(n)
    row, col = j // side, j % side
    col = np.where(row % 2 == 1, side - 1 - col, col)
    pos = np.stack([row * step_px, col * step_px], 1).astype(np.float64)
    pos[:, 0] += rng.normal(0, 0.08 * step_px, n)
    pos[:, 1] += rng.normal(0, 0.03 * step_px, n)
    return pos


def _corners(centres: np.ndarray, m: int) -> tuple[np.ndarray, tuple[int, int]]:
    """Top-left corners, multiples of 1/SUPERSAMPLE px, MARGIN_PX inside an object array."""
    s = SUPERSAMPLE
    c = centres - centres.min(axis=0) + MARGIN_PX
    c = np.round(c * s) / s
    shape = tuple(int(v) for v in np.ceil(c.max(axis=0)) + m + MARGIN_PX)
    return c, shape


# ----------------------------------------------------------------------------- optics


def _legendre_phase(n: int, rng: np.random.Generator, rms_rad: float,
                    ripples: int = 3) -> np.ndarray:
    """A mirror's figure error along its length (n samples): low orders (Legendre 2–4) and a
    few mid-frequency ripples, ``rms_rad`` in total."""
    u = np.linspace(-1, 1, n)
    phase = sum(rng.normal() * np.polynomial.legendre.Legendre.basis(k)(u) for k in (2, 3, 4))
    for _ in range(ripples):
        phase = phase + 0.3 * rng.normal() * np.sin(2 * np.pi * rng.uniform(3, 9) * u
                                                    + rng.uniform(0, 2 * np.pi))
    phase = phase - phase.mean()
    return phase * rms_rad / phase.std()


def _soft_box(n: int, width: float, soft: float = 1.0) -> np.ndarray:
    """A 1-D aperture of ``width`` samples in an n-sample grid, edges soft over ``soft``."""
    u = np.arange(n) - (n - 1) / 2
    return np.clip((width / 2 - np.abs(u)) / soft + 0.5, 0.0, 1.0)


def _through_focus(pupil: np.ndarray, fresnel_samples: float) -> np.ndarray:
    """The beam a distance z past the focus of a converging pupil, its spherical phase about
    the focus removed: pupil (centred, any dims ≤ 2) → focal field (FFT) × the Fresnel chirp
    of the distance z → back (FFT). ``fresnel_samples`` = λz/Δx² of the output sampling Δx;
    the chirp in the focal plane is exp(iπ q²/(N²·F)) at focal sample q of an N grid."""
    focal = np.fft.fftshift(np.fft.fftn(np.fft.ifftshift(pupil)))
    grids = np.meshgrid(*[np.arange(n) - n // 2 for n in pupil.shape], indexing="ij")
    q2 = sum((g / n) ** 2 for g, n in zip(grids, pupil.shape, strict=True))
    focal = focal * np.exp(1j * np.pi * fresnel_samples * q2)
    return np.fft.fftshift(np.fft.ifftn(np.fft.ifftshift(focal)))


def kb_cone_beam(m: int, rng: np.random.Generator, fresnel_samples: float,
                 fill: float = 0.85, figure_rad: float = 1.0) -> np.ndarray:
    """Near-field illumination of a KB pair, ``fill`` of the window across: each mirror's
    aperture (a soft box, a little reflectivity roll-off) with its own figure error, taken
    through the focus to the sample. A KB focus is separable: P(y, x) = P_v(y)·P_h(x).
    ``fresnel_samples`` = λ·z1/Δx² (z1 focus to sample, Δx the object pixel) sets the edge
    fringes. Computed on a 4× grid and cut to the window."""
    n = 4 * m
    out = []
    for _ in range(2):
        pupil = _soft_box(n, fill * m, 1.5) * (1 + 0.1 * rng.normal() * np.linspace(-1, 1, n))
        phase = np.zeros(n)
        inside = pupil > 0
        phase[inside] = _legendre_phase(int(inside.sum()), rng, figure_rad)
        beam = _through_focus(pupil * np.exp(1j * phase), fresnel_samples)
        out.append(beam[n // 2 - m // 2 : n // 2 + m - m // 2])
    return (out[0][:, None] * out[1][None, :]).astype(np.complex64)


def zernike_phase(y: np.ndarray, x: np.ndarray, coeffs: dict[str, float]) -> np.ndarray:
    """A few Zernike terms on the unit disc (radians)."""
    r2 = y * y + x * x
    terms = {
        "astig": x * x - y * y,
        "astig45": 2 * x * y,
        "coma_x": (3 * r2 - 2) * x,
        "coma_y": (3 * r2 - 2) * y,
        "spherical": 6 * r2 * r2 - 6 * r2 + 1,
        "trefoil": x * (x * x - 3 * y * y),
    }
    return sum(c * terms[k] for k, c in coeffs.items())


def zone_plate_cone_beam(m: int, rng: np.random.Generator, fresnel_samples: float,
                         fill: float = 0.85, stop: float = 0.35,
                         aberration_rad: float = 1.0) -> np.ndarray:
    """Near-field illumination of a zone plate with a central stop: the cone downstream of
    the focus is a ring (the stop's shadow in its middle), with astigmatism, coma and
    spherical aberration of ~1 rad and Fresnel fringes at both edges."""
    n = 4 * m
    u = (np.arange(n) - (n - 1) / 2) / (fill * m / 2)
    y, x = np.meshgrid(u, u, indexing="ij")
    r = np.hypot(y, x)
    edge = 2.0 / (fill * m)  # one sample, in pupil units
    amp = np.clip((1 - r) / edge + 0.5, 0, 1) * np.clip((r - stop) / edge + 0.5, 0, 1)
    coeffs = {k: rng.normal(0, 0.5 * aberration_rad)
              for k in ("astig", "astig45", "coma_x", "coma_y", "spherical")}
    pupil = amp * np.exp(1j * zernike_phase(y, x, coeffs))
    beam = _through_focus(pupil, fresnel_samples)
    a, b = n // 2 - m // 2, n // 2 + m - m // 2
    return beam[a:b, a:b].astype(np.complex64)


def kb_figures(m: int, rng: np.random.Generator, pupil_radius_px: float,
               figure_rad: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    """The two mirrors' pupils (m,) in the far field: a soft box of half-width
    ``pupil_radius_px`` detector pixels times each mirror's figure error."""
    out = []
    for _ in range(2):
        pupil = _soft_box(m, 2 * pupil_radius_px, 1.0).astype(np.complex128)
        inside = pupil.real > 0
        pupil[inside] *= np.exp(1j * _legendre_phase(int(inside.sum()), rng, figure_rad,
                                                     ripples=1))
        out.append(pupil)
    return out[0], out[1]


def kb_focus(pupils: tuple[np.ndarray, np.ndarray], defocus_px: float) -> np.ndarray:
    """A KB probe a little out of focus (far field): the mirrors' pupils (:func:`kb_figures`)
    with the defocus phase exp(−iπ·defocus_px·(k/m)²), k the detector pixel from the centre;
    with pupil half-width R the probe is about 2·R·defocus_px/m px across."""
    out = []
    for pupil in pupils:
        m = len(pupil)
        k = np.arange(m) - m // 2
        far = pupil * np.exp(-1j * np.pi * defocus_px * (k / m) ** 2)
        out.append(np.fft.fftshift(np.fft.ifft(np.fft.ifftshift(far))))
    return (out[0][:, None] * out[1][None, :]).astype(np.complex64)


def pinhole_beam(m: int, radius_px: float, fresnel_samples: float) -> np.ndarray:
    """The Fresnel diffraction of a round pinhole of ``radius_px`` a short way downstream
    (λz/Δx² = ``fresnel_samples``): a flat-topped disc with edge ripples (far field)."""
    u = np.arange(m) - (m - 1) / 2
    r = np.hypot(u[:, None], u[None, :])
    disc = np.clip(radius_px - r + 0.5, 0, 1).astype(np.complex128)
    k2 = np.fft.fftfreq(m)[:, None] ** 2 + np.fft.fftfreq(m)[None] ** 2
    beam = np.fft.ifft2(np.fft.fft2(disc) * np.exp(-1j * np.pi * fresnel_samples * k2))
    return beam.astype(np.complex64)


# ----------------------------------------------------------------------------- detectors


def _scale(probe: np.ndarray, windows: np.ndarray, photons: float) -> float:
    """The factor that makes the mean counts per frame ``photons`` (both propagations are
    unitary up to the FFT's M²: far field Σ|Fψ|² = M²Σ|ψ|², near field Σ|ψ|² minus what
    leaves the window, which is small)."""
    power = float(np.mean(np.sum(np.abs(probe * windows) ** 2, axis=(-2, -1))))
    return math.sqrt(photons / power)


def far_field(waves: np.ndarray) -> np.ndarray:
    """|F[ψ]|², zero frequency in the centre (unnormalised FFT)."""
    f = np.fft.fftshift(np.fft.fft2(waves), axes=(-2, -1))
    return f.real**2 + f.imag**2


def fresnel_hologram(waves: np.ndarray, fresnel_number: float) -> np.ndarray:
    """|D_z[ψ]|² by the paraxial Fresnel propagator on a grid twice the window (zero outside
    it), cut back to the window: light leaving the window is lost, none wraps round.
    ``fresnel_number`` = Δx²/(λz) of one pixel."""
    m = waves.shape[-1]
    pad = m // 2
    big = np.zeros(waves.shape[:-2] + (2 * m, 2 * m), np.complex128)
    big[..., pad : pad + m, pad : pad + m] = waves
    f2 = np.fft.fftfreq(2 * m)[:, None] ** 2 + np.fft.fftfreq(2 * m)[None] ** 2
    out = np.fft.ifft2(np.fft.fft2(big) * np.exp(-1j * np.pi * f2 / fresnel_number))
    out = out[..., pad : pad + m, pad : pad + m]
    return out.real**2 + out.imag**2


# ----------------------------------------------------------------------------- the scans


def cone_beam_scan(n: int = 49, m: int = 32, *, seed: int = 0, optics: str = "kb",
                   sample: str = "cells", pattern: str = "rings", photons: float = 1e7,
                   fresnel_pixel: float = 0.06, focus_fresnel: float | None = None,
                   span: float = 0.5, size: float = 1.0, figure_rad: float = 1.0,
                   defocus_rad: float = 0.0, noise: bool = True) -> Scan:
    """A near-field cone-beam scan.

    optics: ``"kb"`` or ``"zone-plate"``; sample: a key of :data:`OBJECTS`; pattern:
    ``"rings"`` or ``"raster"`` (jittered). ``fresnel_pixel`` = Δx²/(λ z_eff), the
    Fresnel number of one object pixel in the effective geometry (PETRA III's P25 scan:
    0.09); the smaller, the more holographic the frames. ``focus_fresnel`` = λ·z1/Δx² of the
    real focus-to-sample distance (the probe's edge fringes, √ of it px wide; default M).
    ``figure_rad``: the optics' aberrations (rms). ``defocus_rad``: the residual curvature
    at the window's edge when the focus distance given to the engine is not the true one
    (a 5 % error in z1 leaves ~50·0.05/focus_fresnel·M²/64 rad). ``span``: the scan
    covers this fraction of the window.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5C0E]))
    r_obj, r_probe, r_scan, r_noise = rng.spawn(4)
    focus = float(m) if focus_fresnel is None else focus_fresnel
    if optics == "kb":
        probe = kb_cone_beam(m, r_probe, focus, figure_rad=figure_rad)
    elif optics == "zone-plate":
        probe = zone_plate_cone_beam(m, r_probe, focus, aberration_rad=figure_rad)
    else:
        raise ValueError(f"optics {optics!r}: kb or zone-plate")
    if defocus_rad:
        u = (np.arange(m) - (m - 1) / 2) / (m / 2)
        probe = probe * np.exp(1j * defocus_rad * (u[:, None] ** 2 + u[None, :] ** 2))
    if pattern == "rings":
        centres = rings(n, span * m / 2)
    elif pattern == "raster":
        centres = jittered_raster(n, span * m / max(math.ceil(math.sqrt(n)) - 1, 1), r_scan)
    else:
        raise ValueError(f"pattern {pattern!r}: rings or raster")
    corners, shape = _corners(centres, m)
    fine = OBJECTS[sample](shape, r_obj, size)
    windows = _windows(fine, corners, m)
    probe = probe * _scale(probe, windows, photons)
    intens = fresnel_hologram(probe * windows, fresnel_pixel)
    # An effective geometry with this Fresnel number: 17.5 keV, 60 nm object pixels (a
    # 6 µm detector pixel at magnification 100).
    lam, dx = 7.085e-11, 60e-9
    prop = Propagation(model="near-field", wavelength_m=lam, pixel_size_m=dx,
                       distance_m=dx * dx / (lam * fresnel_pixel))
    frames = (r_noise.poisson(intens) if noise else intens).astype(np.float32)
    return Scan(frames, corners, on_engine_grid(fine), probe.astype(np.complex64), prop)


def _windows(fine: np.ndarray, corners: np.ndarray, m: int) -> np.ndarray:
    s = SUPERSAMPLE
    idx = np.rint(corners * s).astype(int)
    return np.stack([render(fine, (int(a), int(b)), m) for a, b in idx])


def fly_scan(n: int = 64, m: int = 32, *, seed: int = 0, optics: str = "kb",
             sample: str = "particles", photons: float = 1e6, drift: float = 1.0,
             overlap: float = 0.7, noise: bool = True, moves: bool = True) -> Scan:
    """A far-field fly scan (a snake of rows in acquisition order) whose beam varies smoothly
    in time; ``drift=0`` is its stable twin (the same object, scan and mean beam, the same
    noise seed).

    optics: ``"kb"`` (a square KB focus, out of focus) or ``"pinhole"``. With ``drift`` d the
    beam moves at the sample on a slow random path of up to ~d px, its focus drifts by ~15·d %
    of the defocus, and its flux by ±3·d %, all smooth along acquisition order;
    ``moves=False`` keeps the beam in place (focus and flux drift only).
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xF17]))
    r_obj, r_probe, r_scan, r_noise, r_drift = rng.spawn(5)
    t = np.linspace(0.0, 1.0, n)
    paths = _smooth_paths(t, r_drift, 4)
    shift = drift * moves * np.stack([paths[0], paths[1]], 1)  # (n, 2) px
    focus = 1.0 + 0.15 * drift * paths[2]
    flux = 1.0 + 0.03 * drift * paths[3]
    k = np.fft.fftfreq(m)
    if optics == "kb":
        pupil_r, diameter = 0.22 * m, 0.35 * m
        pupils = kb_figures(m, r_probe, pupil_r)

        def beam(f: float) -> np.ndarray:
            return kb_focus(pupils, f * diameter * m / (2 * pupil_r))
    elif optics == "pinhole":
        radius = 0.17 * m
        diameter = 2 * radius

        def beam(f: float) -> np.ndarray:  # Fresnel number r²/(λz) of 4
            return pinhole_beam(m, radius, f * radius * radius / 4.0)
    else:
        raise ValueError(f"optics {optics!r}: kb or pinhole")
    step = (1 - overlap) * diameter
    centres = snake(n, step, r_scan)
    corners, shape = _corners(centres, m)
    fine = OBJECTS[sample](shape, r_obj)
    windows = _windows(fine, corners, m)
    mean_probe = beam(1.0)
    if drift:
        ramp_y = np.exp(-2j * np.pi * shift[:, 0, None] * k)
        ramp_x = np.exp(-2j * np.pi * shift[:, 1, None] * k)
        probes = np.stack([np.fft.ifft2(np.fft.fft2(beam(f)) * ry[:, None] * rx[None, :])
                           for f, ry, rx in zip(focus, ramp_y, ramp_x, strict=True)])
        probes = probes * np.sqrt(flux)[:, None, None]
    else:
        probes = np.broadcast_to(mean_probe, (n, m, m))
    c = _scale(mean_probe, windows, photons / (m * m))
    intens = far_field(c * probes * windows)
    frames = (r_noise.poisson(intens) if noise else intens).astype(np.float32)
    return Scan(frames, corners, on_engine_grid(fine), (c * mean_probe).astype(np.complex64),
                Propagation(), probes=(c * probes).astype(np.complex64) if drift else None)


def _smooth_paths(t: np.ndarray, rng: np.random.Generator, count: int) -> list[np.ndarray]:
    """``count`` smooth random functions of time t ∈ [0, 1], each within about ±1: a slow
    drift (a few sine terms of random phase, periods from the scan's length up) and a
    linear trend."""
    out = []
    for _ in range(count):
        f = rng.normal() * (t - 0.5)
        for period in (1.0, 0.6, 0.35):
            f = f + rng.normal() * np.sin(2 * np.pi * t / period + rng.uniform(0, 2 * np.pi))
        f = f - f.mean()
        out.append(f / max(np.abs(f).max(), 1e-12))
    return out
