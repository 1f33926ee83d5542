"""The beamline simulator: realistic far-field ptychography scans, written as an Eiger writes them.

Physics (notation of /work/shared/PTYCHO_MATH.md):

* Object: a complex transmission O = exp(Σ_m t_m (i φ_m − μ_m)) of projected thickness maps t_m
  ∈ [0, 1] of two materials plus a weak smooth background: a Siemens (resolution) star in the
  scan centre, resolution bar groups, discs, and text-like glyph blocks. Amplitude 0.7–1,
  phase 0–~2 rad. Features are rendered 3× supersampled and box-averaged (area coverage).
* Probe: a zone-plate-like annular pupil (central stop, slight astigmatism) in the far field,
  defocused so that the probe at the sample is a ring-like spot of ~45 % of the window with
  Fresnel fringes and sharp-ish edges. P = F⁻¹[pupil · exp(iπλΔz|k|²)]. The equivalent
  Fresnel zone plate (:func:`zone_plate_optics`: the pupil radius R fixes the outermost zone
  width, d_r = λz/(2pR)) and the sample defocus are recorded in the master file and the
  ground truth; with the engine's F (exp(−2πi k·x)) this probe is the beam Δz *upstream* of
  the focus, so the recorded defocus is −Δz (positive = downstream, as in
  :func:`beamflow.ptycho.probe.zone_plate_probe`).
* Scan: Fermat spiral (or raster) of probe positions with sub-pixel coordinates at the chosen
  linear overlap, plus Gaussian stage jitter: the master file records the planned positions,
  the ground truth keeps the true ones.
* Detector: I_j = |F[P_δj · O_j]|² (unnormalised FFT, zero frequency in the centre), O_j the
  object patch at the integer part of position j and P_δj the probe shifted by the fractional
  part with a Fourier phase ramp exp(−2πi k·δ_j) — the engine's forward model. The probe is
  scaled so that the mean total counts per frame equal ``photons``; counts are Poisson. Dead
  pixels read 0, hot pixels a high Poisson rate; all are flagged in the pixel mask (Eiger bits).

* Thick samples (``slices`` S ≥ 2): S distinct layers (the resolution sample above at half
  strength, then layers of other kinds: chip wiring, particles; each |O| 0.8–1, phase up to ~1
  rad), spaced Δz_1 … Δz_{S−1}. The probe meets layer 1; the wave leaving layer s reaches
  layer s+1 by the exact angular spectrum
  (:func:`~beamflow.ptycho.forward.propagation.transfer_function` with only the
  Matsushima–Shimobaba sampling limit, no 2/3-Nyquist cut) on a window twice the frame,
  centred on it, so that light spreading out of the frame meets the sample that is really
  there and nothing wraps around; the far field at the detector's pixels is that of the whole
  padded exit wave (folded onto the frame: sampling the far field at the detector's
  frequencies is exactly that), the near field is cropped to the detector. An engine's model
  (one periodic frame-sized window, band-limited) differs from this on purpose: tests of it
  must not be fed its own forward model.

Files: ``OUT/NAME/ground_truth.h5`` first, then ``OUT/NAME/NAME_master.h5`` (positions and the
expected frame count), then ``NAME_data_NNNNNN.h5`` files as frames are "acquired" at
``rate_hz`` (each under a temporary name, renamed when complete). Deterministic for a seed.
The truth's record and file, and the scoring of a reconstruction against it, are
:mod:`beamflow.ground_truth`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import scipy.fft as sfft

from beamflow.formats import Geometry, ZonePlateOptics
from beamflow.formats.eiger import (
    MASK_DEAD,
    MASK_HOT,
    data_file_name,
    master_path,
    write_data_file,
    write_master,
)
from beamflow.ground_truth import GROUND_TRUTH, GroundTruth, write_ground_truth
from beamflow.ptycho.forward.propagation import Propagation, near_field_geometry, transfer_function
from beamflow.ptycho.forward.slices import slice_spacings, slice_transfer
from beamflow.samples import make_layers, make_object

DEFAULT_GEOMETRY = Geometry(energy_eV=8800.0, distance_m=2.0, detector_pixel_size_m=75e-6)

#: Fraction of the window the defocused probe's ring spans, and the pupil (bright-field disc)
#: radius on the detector as a fraction of the frame size.
PROBE_DIAMETER_FRACTION = 0.45
PUPIL_RADIUS_FRACTION = 0.2
CENTRAL_STOP_FRACTION = 0.45  # of the pupil radius, as on a Fresnel zone plate
#: Outer diameter of the simulated zone plate (a typical hard X-ray FZP; with the outermost
#: zone width from the pupil radius, f = D·d_r/λ ≈ 0.16 m for 64 px frames at 8.8 keV).
ZONE_PLATE_DIAMETER_M = 150e-6
_MARGIN_PX = 8

Progress = Callable[[int, int], None]


# ------------------------------------------------------------------------------ forward model


def shift_probe(probe: np.ndarray, frac: np.ndarray) -> np.ndarray:
    """Probe shifted by sub-pixel (dy, dx) ``frac`` (N, 2): F⁻¹[F[P] exp(−2πi k·δ)] → (N, M, M).

    The ramp is separable, exp(−2πi k_y δ_y)·exp(−2πi k_x δ_x), so it costs two 1-D exps.
    """
    m = probe.shape[-1]
    k = np.fft.fftfreq(m)
    ry = np.exp(-2j * np.pi * frac[:, 0, None] * k).astype(np.complex64)
    rx = np.exp(-2j * np.pi * frac[:, 1, None] * k).astype(np.complex64)
    spectrum = sfft.fft2(probe.astype(np.complex64))
    return sfft.ifft2(spectrum[None] * ry[:, :, None] * rx[:, None, :], workers=-1)


def exit_waves(obj: np.ndarray, probe: np.ndarray, positions_px: np.ndarray,
               drift_px: np.ndarray | None = None) -> np.ndarray:
    """ψ_j = P_δj · O[iy:iy+M, ix:ix+M] for top-left corners ``positions_px`` (N, 2).

    ``drift_px`` (N, 2): a lateral beam drift per frame, the probe moved within its window
    while the object window stays (a varying probe, see :func:`fly_scan_drift`)."""
    m = probe.shape[-1]
    pos = np.asarray(positions_px, dtype=np.float64)
    corner = np.floor(pos).astype(np.int64)
    if (corner < 0).any() or (corner + m > np.array(obj.shape)).any():
        raise ValueError("a probe window leaves the object array")
    iy = corner[:, 0, None, None] + np.arange(m)[None, :, None]
    ix = corner[:, 1, None, None] + np.arange(m)[None, None, :]
    shift = pos - corner if drift_px is None else pos - corner + drift_px
    return shift_probe(probe, shift) * obj[iy, ix]


def diffraction(obj: np.ndarray, probe: np.ndarray, positions_px: np.ndarray,
                drift_px: np.ndarray | None = None) -> np.ndarray:
    """Far-field intensities |F[ψ_j]|² (N, M, M) float64: unnormalised FFT, zero frequency
    in the centre (detector view). Computed in complex64, as the engine does."""
    out = np.empty((len(positions_px), probe.shape[-1], probe.shape[-1]))
    for s in range(0, len(positions_px), 64):  # bounded memory for long scans
        drift = None if drift_px is None else drift_px[s : s + 64]
        psi = exit_waves(obj, probe, positions_px[s : s + 64], drift)
        far = sfft.fftshift(sfft.fft2(psi, workers=-1), axes=(-2, -1))
        out[s : s + 64] = far.real.astype(np.float64) ** 2 + far.imag.astype(np.float64) ** 2
    return out


def holograms(obj: np.ndarray, probe: np.ndarray, positions_px: np.ndarray,
              propagation: Propagation) -> np.ndarray:
    """Near-field intensities |D_z[ψ_j]|² (N, M, M) float64, in real space as recorded.

    The probe is fixed relative to the detector and the object moves: the detector sees
    P·O(u + r_j), i.e. the engine's window wave P_δj·O_j shifted back by the sub-pixel part
    δ_j, which together with the propagator is one Fourier multiplier H·exp(+2πi k·δ_j).
    """
    m = probe.shape[-1]
    h = propagation.transfer(m)
    k = np.fft.fftfreq(m)
    pos = np.asarray(positions_px, dtype=np.float64)
    out = np.empty((len(pos), m, m))
    for s in range(0, len(pos), 64):  # bounded memory for long scans
        p = pos[s : s + 64]
        frac = p - np.floor(p)
        back = (np.exp(2j * np.pi * frac[:, 0, None] * k)[:, :, None]
                * np.exp(2j * np.pi * frac[:, 1, None] * k)[:, None, :])
        spec = sfft.fft2(exit_waves(obj, probe, p), workers=-1) * (h * back).astype(np.complex64)
        wave = sfft.ifft2(spec, workers=-1)
        out[s : s + 64] = wave.real.astype(np.float64) ** 2 + wave.imag.astype(np.float64) ** 2
    return out


def thick_exit_waves(layers: np.ndarray, spacings_m: Sequence[float], probe: np.ndarray,
                     positions_px: np.ndarray, wavelength_m: float, pixel_size_m: float,
                     drift_px: np.ndarray | None = None) -> np.ndarray:
    """Exit waves (N, 2M, 2M) of a thick sample on windows twice the frame, centred on it.

    The probe (shifted by the sub-pixel part of each position, as for a thin sample) sits in
    the middle M×M of a 2M×2M window of zeros; ψ_1 = that, e_s = ψ_s · O_s(window),
    ψ_{s+1} = 𝒫_{Δz_s}[e_s] with the exact angular spectrum (only its sampling limit, see
    :func:`beamflow.ptycho.forward.slices.slice_transfer` with ``nyquist_fraction=None``); returns
    e_S. Frame pixel (0, 0) is window pixel (M/2, M/2).
    """
    m = probe.shape[-1]
    big, lo = 2 * m, m // 2
    pos = np.asarray(positions_px, dtype=np.float64)
    corner = np.floor(pos).astype(np.int64)
    if (corner - lo < 0).any() or (corner - lo + big > np.array(layers.shape[1:])).any():
        raise ValueError("a padded probe window leaves the object array")
    iy = corner[:, 0, None, None] - lo + np.arange(big)[None, :, None]
    ix = corner[:, 1, None, None] - lo + np.arange(big)[None, None, :]
    shift = pos - corner if drift_px is None else pos - corner + drift_px
    wave = np.zeros((len(pos), big, big), np.complex64)
    wave[:, lo : lo + m, lo : lo + m] = shift_probe(probe, shift)
    transfer = [slice_transfer(big, wavelength_m, dz, pixel_size_m, nyquist_fraction=None)
                for dz in spacings_m]
    for s, layer in enumerate(layers):
        wave = wave * layer[iy, ix]
        if s < len(transfer):
            wave = sfft.ifft2(sfft.fft2(wave, workers=-1) * transfer[s], workers=-1)
    return wave


def thick_intensities(layers: np.ndarray, spacings_m: Sequence[float], probe: np.ndarray,
                      positions_px: np.ndarray, wavelength_m: float, pixel_size_m: float,
                      propagation: Propagation = Propagation(),
                      drift_px: np.ndarray | None = None) -> np.ndarray:
    """Detector intensities (N, M, M) float64 of a thick sample (:func:`thick_exit_waves`).

    Far field: the detector samples the far field of the whole exit wave at frequencies
    k/(MΔx), which is the M-point FFT of the padded wave folded onto the frame (summed over
    the frame's periodic copies), zero frequency in the centre. Near field: the padded exit
    wave propagated to the detector (exact angular spectrum on the padded window, the
    sub-pixel back-shift of :func:`holograms`), cropped to the M×M detector.
    """
    m = probe.shape[-1]
    lo = m // 2
    k = np.fft.fftfreq(2 * m)
    h = None
    if propagation.near_field:
        h = transfer_function(2 * m, propagation.wavelength_m, propagation.distance_m,
                              propagation.pixel_size_m)
    pos = np.asarray(positions_px, dtype=np.float64)
    out = np.empty((len(pos), m, m))
    for s in range(0, len(pos), 64):  # bounded memory for long scans
        p = pos[s : s + 64]
        drift = None if drift_px is None else drift_px[s : s + 64]
        exit_wave = thick_exit_waves(layers, spacings_m, probe, p, wavelength_m, pixel_size_m,
                                     drift)
        if h is None:
            folded = np.roll(exit_wave, (-lo, -lo), axis=(1, 2))
            folded = folded.reshape(len(p), 2, m, 2, m).sum(axis=(1, 3))
            wave = sfft.fftshift(sfft.fft2(folded, workers=-1), axes=(-2, -1))
        else:
            frac = p - np.floor(p)
            back = (np.exp(2j * np.pi * frac[:, 0, None] * k)[:, :, None]
                    * np.exp(2j * np.pi * frac[:, 1, None] * k)[:, None, :])
            spec = sfft.fft2(exit_wave, workers=-1) * (h * back).astype(np.complex64)
            wave = sfft.ifft2(spec, workers=-1)[:, lo : lo + m, lo : lo + m]
        out[s : s + 64] = wave.real.astype(np.float64) ** 2 + wave.imag.astype(np.float64) ** 2
    return out


def model_intensities(gt: GroundTruth, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Noise-free model intensities of positions ``start:stop`` of ``gt`` (detector view)."""
    if gt.n_layers > 1:
        drift = None if gt.probe_drift_px is None else gt.probe_drift_px[start:stop]
        return thick_intensities(gt.layers, gt.object_layer_spacing_m, gt.probe,
                                 gt.positions_px[start:stop], gt.geometry.wavelength_m,
                                 gt.object_pixel_size_m, gt.propagation, drift)
    if gt.propagation.near_field:
        return holograms(gt.object, gt.probe, gt.positions_px[start:stop], gt.propagation)
    drift = None if gt.probe_drift_px is None else gt.probe_drift_px[start:stop]
    return diffraction(gt.object, gt.probe, gt.positions_px[start:stop], drift)


def fly_scan_drift(n: int, amplitude_px: float) -> np.ndarray:
    """(n, 2) lateral beam drift along acquisition order: one slow loop of radius
    ``amplitude_px`` over the scan (y, x out of phase), as a beam wanders during a fly scan."""
    t = 2 * np.pi * np.arange(n) / max(n, 1)
    return amplitude_px * np.stack([np.sin(t), np.cos(t) - 1.0], axis=1)


# ------------------------------------------------------------------------------ sample, optics


def scan_positions_px(
    n: int, probe_diameter_px: float, overlap: float, pattern: str = "spiral"
) -> np.ndarray:
    """(n, 2) probe-centre positions (y, x) in object pixels around 0 for a linear ``overlap``.

    Fermat spiral r = c√(j+½), θ = j·golden angle: its mean nearest-neighbour distance is
    ≈ 1.9 c, so c = step / 1.9 with step = (1 − overlap)·D.
    """
    if not 0 <= overlap < 1:
        raise ValueError("overlap must be in [0, 1)")
    step = (1.0 - overlap) * probe_diameter_px
    if pattern == "spiral":
        j = np.arange(n) + 0.5
        r = step / 1.905 * np.sqrt(j)
        theta = j * math.pi * (3.0 - math.sqrt(5.0))
        pos = np.stack([r * np.sin(theta), r * np.cos(theta)], axis=1)
    elif pattern == "raster":
        cols = math.ceil(math.sqrt(n))
        j = np.arange(n)
        pos = np.stack([(j // cols) * step, (j % cols) * step], axis=1)
    else:
        raise ValueError(f"unknown scan pattern {pattern!r} (spiral or raster)")
    return pos - pos.mean(axis=0)


def make_probe(m: int, geometry: Geometry) -> tuple[np.ndarray, float]:
    """Unit-power defocused zone-plate probe (M, M) and its defocus Δz [m].

    A pupil of radius R (detector pixels) and defocus Δz give a spot of diameter
    D = 2λRΔz/(MΔx²) object pixels; the quadratic pupil phase πλΔz|k|² is then πD n²/(2RM)
    in pixel units, which stays below π per pixel (no aliasing) for D < M.
    """
    dx = geometry.object_pixel_size_m(m)
    radius = PUPIL_RADIUS_FRACTION * m
    diameter = PROBE_DIAMETER_FRACTION * m
    n = np.fft.fftfreq(m) * m  # frequency index, unshifted
    ny, nx = np.meshgrid(n, n, indexing="ij")
    rr = np.hypot(ny, nx)
    # Edges soft over ~1.5 detector pixels (pixel integration, partial coherence): still a
    # sharp bright-field disc, but the probe's Fresnel tails stay ≲1 % outside 0.4 M.
    soft = 1.5
    outer = np.clip((radius - rr) / soft + 0.5, 0.0, 1.0)
    inner = np.clip((rr - CENTRAL_STOP_FRACTION * radius) / soft + 0.5, 0.0, 1.0)
    pupil = outer * inner
    phase = math.pi * diameter * rr**2 / (2.0 * radius * m)
    phase += 0.6 * (nx**2 - ny**2) / radius**2  # mild astigmatism: breaks the symmetry
    probe = np.fft.fftshift(np.fft.ifft2(pupil * np.exp(1j * phase)))
    probe /= np.sqrt(np.sum(np.abs(probe) ** 2))
    defocus = diameter * m * dx**2 / (2.0 * radius * geometry.wavelength_m)
    return probe.astype(np.complex64), defocus


def zone_plate_optics(m: int, geometry: Geometry, defocus_m: float) -> ZonePlateOptics:
    """The Fresnel zone plate equivalent to :func:`make_probe`'s pupil, and the signed defocus.

    The bright-field disc of radius R detector pixels is the cone of the zone plate's NA:
    R·p = z·NA with NA = λ/(2 d_r), so d_r = λz/(2pR); D is :data:`ZONE_PLATE_DIAMETER_M`
    (it only sets f = D·d_r/λ, which barely matters at |Δz| ≪ f). make_probe applies
    exp(+iπλΔz|k|²) to the angular spectrum F[P]: free-space propagation by +Δz multiplies it
    by exp(−iπλΔz|k|²), so its probe lies Δz upstream of the focus: the defocus is −Δz.
    """
    radius_px = PUPIL_RADIUS_FRACTION * m
    outer_zone = (
        geometry.wavelength_m * geometry.distance_m
        / (2.0 * geometry.detector_pixel_size_m * radius_px)
    )  # fmt: skip
    return ZonePlateOptics(
        diameter_m=ZONE_PLATE_DIAMETER_M,
        outer_zone_width_m=outer_zone,
        central_stop_fraction=CENTRAL_STOP_FRACTION,
        defocus_m=-defocus_m,
    )


def make_near_field_probe(m: int, rng: np.random.Generator,
                          propagation: Propagation) -> np.ndarray:
    """Unit-power near-field illumination (M, M): a cone beam far downstream of its focus,
    seen in the effective parallel geometry — a soft-edged rectangular field (the KB
    mirrors' aperture) filling ~80 % of the window, with smooth aberrations of a few radians
    and the edge fringes of a short propagation, as measured near-field probes look."""
    y = (np.arange(m) - (m - 1) / 2) / m
    edge = lambda u, half: np.clip((half - np.abs(u)) * m / 2.0 + 0.5, 0.0, 1.0)  # noqa: E731
    amp = edge(y, 0.40)[:, None] * edge(y, 0.38)[None, :]
    coeff = rng.normal(0.0, 1.0, 6)
    yy, xx = np.meshgrid(y, y, indexing="ij")
    phase = 3.0 * (coeff[0] * yy**2 + coeff[1] * xx**2 + coeff[2] * xx * yy
                   + coeff[3] * yy**3 + coeff[4] * xx**3 + coeff[5] * xx * yy**2)
    field = amp * np.exp(1j * phase)
    # A short propagation (a tenth of the sample-detector distance) rounds the edges into
    # Fresnel fringes, as the beam-defining apertures upstream do.
    short = propagation.model_copy(update={"distance_m": 0.1 * propagation.distance_m})
    field = np.fft.ifft2(np.fft.fft2(field) * short.transfer(m))
    field /= np.sqrt(np.sum(np.abs(field) ** 2))
    return field.astype(np.complex64)


def _bad_pixels(m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = m * m
    n_dead = max(1, round(0.002 * n))
    n_hot = max(1, round(0.001 * n))
    idx = rng.permutation(n)[: n_dead + n_hot]
    mask = np.zeros(n, np.uint32)
    mask[idx[:n_dead]] = MASK_DEAD
    mask[idx[n_dead:]] = MASK_HOT
    rate = np.zeros(n)
    rate[idx[n_dead:]] = rng.uniform(1e3, 1e5, n_hot)
    return mask.reshape(m, m), rate.reshape(m, m)


# ------------------------------------------------------------------------------ ground truth


def _checked_start(positions: int, probe_size: int, photons: float, slices: int,
                   slice_spacing_m: float | Sequence[float] | str | None, seed: int
                   ) -> tuple[tuple[float, ...], list[np.random.Generator]]:
    """A ground truth's arguments checked, its layer spacings, and its three random streams
    (object, positions, detector), each its own so that one does not shift another."""
    if positions < 1 or probe_size < 8 or photons <= 0:
        raise ValueError("need positions ≥ 1, probe_size ≥ 8 and photons > 0")
    spacings = slice_spacings(slices, slice_spacing_m)
    return spacings, [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)]


def make_ground_truth(
    positions: int = 200,
    probe_size: int = 64,
    photons: float = 1e6,
    seed: int = 0,
    *,
    overlap: float = 0.75,
    jitter_m: float = 10e-9,
    pattern: str = "spiral",
    geometry: Geometry = DEFAULT_GEOMETRY,
    probe_drift_px: float = 0.0,
    slices: int = 1,
    slice_spacing_m: float | Sequence[float] | str | None = None,
) -> GroundTruth:
    """The object, probe (scaled to ``photons`` mean counts per frame), positions and detector
    defects of a scan, without writing anything. Deterministic for ``seed``.
    ``probe_drift_px`` > 0: the beam drifts along acquisition order (:func:`fly_scan_drift`)
    — every frame sees a slightly different probe. ``slices`` ≥ 2: a thick sample of that
    many layers (:func:`make_layers`) ``slice_spacing_m`` apart (one value, or S−1), its
    frames from :func:`thick_intensities`."""
    spacings, (rng_obj, rng_pos, rng_det) = _checked_start(positions, probe_size, photons,
                                                            slices, slice_spacing_m, seed)
    m = probe_size
    dx = geometry.object_pixel_size_m(m)
    probe, defocus = make_probe(m, geometry)

    nominal_px = scan_positions_px(positions, PROBE_DIAMETER_FRACTION * m, overlap, pattern)
    nominal_m = nominal_px * dx
    true_m = nominal_m + rng_pos.normal(0.0, jitter_m, nominal_m.shape)
    centres = true_m / dx
    margin = _margin(m, slices)
    origin = margin - centres.min(axis=0)  # corner = centre/dx + origin
    corners = centres + origin
    shape = tuple(int(v) for v in np.ceil(corners.max(axis=0)) + m + margin)
    field_centre = (float(origin[0] + m / 2), float(origin[1] + m / 2))  # scan centre (0 m)
    # Features go where the probe reaches (scan radius + most of the probe's half width).
    field_radius = float(np.hypot(*(centres - centres.mean(0)).T).max() + 0.15 * m)
    pixel_mask, hot_rate = _bad_pixels(m, rng_det)
    drift = fly_scan_drift(len(corners), probe_drift_px)
    if slices > 1:
        obj = make_layers(shape, slices, rng_obj, seed, field_centre, field_radius)
        probe = _thick_probe_scale(probe, obj, spacings, corners, geometry.wavelength_m, dx,
                                   photons, Propagation(), drift)
    else:
        obj = make_object(shape, rng_obj, field_centre, field_radius)
        # Scale the probe so the mean total counts per frame equal `photons` (Parseval: the
        # unnormalised FFT gives Σ|F ψ|² = M² Σ|ψ|²).
        power = (
            sum(
                float(np.sum(np.abs(exit_waves(obj, probe, corners[s : s + 64],
                                               drift[s : s + 64])) ** 2))
                for s in range(0, len(corners), 64)  # bounded memory for long scans
            )
            * m
            * m
            / len(corners)
        )
        probe = (probe * np.sqrt(photons / power)).astype(np.complex64)
    return GroundTruth(
        object=obj,
        probe=probe,
        positions_px=corners,
        positions_m=true_m,
        nominal_positions_m=nominal_m,
        origin_px=np.asarray(origin, dtype=np.float64),
        object_pixel_size_m=dx,
        geometry=geometry,
        photons=float(photons),
        pixel_mask=pixel_mask,
        hot_rate=hot_rate,
        seed=int(seed),
        defocus_m=defocus,
        optics=zone_plate_optics(m, geometry, defocus),
        probe_drift_px=drift if probe_drift_px else None,
        object_layer_spacing_m=np.array(spacings),
    )


def _margin(m: int, slices: int) -> int:
    """Object pixels around the outermost probe windows: a thick sample's layers also fill
    the padded windows of :func:`thick_exit_waves` (M/2 more on each side)."""
    return _MARGIN_PX if slices == 1 else _MARGIN_PX + m // 2


def _thick_probe_scale(probe: np.ndarray, layers: np.ndarray, spacings: Sequence[float],
                       corners: np.ndarray, wavelength_m: float, dx: float, photons: float,
                       propagation: Propagation, drift: np.ndarray | None) -> np.ndarray:
    """``probe`` scaled so that the thick sample's mean counts per frame equal ``photons``
    (intensities are proportional to |probe|²)."""
    counts = sum(
        float(thick_intensities(layers, spacings, probe, corners[s : s + 64], wavelength_m, dx,
                                propagation, None if drift is None else drift[s : s + 64]
                                ).sum())
        for s in range(0, len(corners), 64)
    ) / len(corners)
    return (probe * np.sqrt(photons / counts)).astype(np.complex64)


#: A near-field cone-beam setup like PETRA III P25's (shared/data/README.md): 12.66 keV,
#: 55 µm pixels 1.12 m behind the sample, the focus 3.65 mm before it (magnification ≈ 308,
#: effective pixel ≈ 179 nm, effective distance ≈ 3.64 mm).
NEAR_FIELD_GEOMETRY = Geometry(energy_eV=12660.0, distance_m=1.12, detector_pixel_size_m=55e-6)
NEAR_FIELD_FOCUS_M = 3.65e-3


def make_near_field_ground_truth(
    positions: int = 100,
    probe_size: int = 64,
    photons: float = 1e7,
    seed: int = 0,
    *,
    focus_distance_m: float | None = NEAR_FIELD_FOCUS_M,
    geometry: Geometry = NEAR_FIELD_GEOMETRY,
    span_fraction: float = 0.5,
    jitter_m: float = 10e-9,
    slices: int = 1,
    slice_spacing_m: float | Sequence[float] | str | None = None,
) -> GroundTruth:
    """A near-field (Fresnel) scan: a broad structured illumination filling the window, the
    object moved over ``span_fraction`` of the field in a jittered random pattern (as
    near-field scans are: steps far below the field, random to avoid periodic artefacts),
    holograms with Poisson statistics. Cone beam with ``focus_distance_m`` (z1), or a
    parallel beam with None. Deterministic for ``seed``. ``slices`` ≥ 2: a thick sample as
    in :func:`make_ground_truth`; its layers and spacings are those of the effective
    (Fresnel-scaled) parallel-beam geometry, in which the engine works (a cone beam
    magnifies deeper layers a little more; the simulator does not model that)."""
    spacings, (rng_obj, rng_pos, rng_det) = _checked_start(positions, probe_size, photons,
                                                            slices, slice_spacing_m, seed)
    m = probe_size
    dx, z_eff, _ = near_field_geometry(geometry.detector_pixel_size_m, geometry.distance_m,
                                       focus_distance_m)
    propagation = Propagation(model="near-field", wavelength_m=geometry.wavelength_m,
                              distance_m=z_eff, pixel_size_m=dx)
    probe = make_near_field_probe(m, rng_obj, propagation)
    side = math.ceil(math.sqrt(positions))
    grid = (np.arange(side) - (side - 1) / 2) * (span_fraction * m / max(side - 1, 1))
    gy, gx = np.meshgrid(grid, grid, indexing="ij")
    nominal_px = np.stack([gy.ravel(), gx.ravel()], 1)[:positions]
    nominal_px = nominal_px + rng_pos.uniform(-0.3, 0.3, nominal_px.shape) * (
        span_fraction * m / max(side, 1))
    nominal_m = nominal_px * dx
    true_m = nominal_m + rng_pos.normal(0.0, jitter_m, nominal_m.shape)
    centres = true_m / dx
    margin = _margin(m, slices)
    origin = margin - centres.min(axis=0)
    corners = centres + origin
    shape = tuple(int(v) for v in np.ceil(corners.max(axis=0)) + m + margin)
    field_centre = (shape[0] / 2, shape[1] / 2)
    field_radius = 0.5 * min(shape) - margin
    pixel_mask, hot_rate = _bad_pixels(m, rng_det)
    if slices > 1:
        obj = make_layers(shape, slices, rng_obj, seed, field_centre, field_radius)
        probe = _thick_probe_scale(probe, obj, spacings, corners, geometry.wavelength_m, dx,
                                   photons, propagation, None)
    else:
        obj = make_object(shape, rng_obj, field_centre, field_radius)
        # Propagation is unitary: the counts of a frame are Σ|ψ|².
        power = sum(float(np.sum(np.abs(exit_waves(obj, probe, corners[s : s + 64])) ** 2))
                    for s in range(0, len(corners), 64)) / len(corners)
        probe = (probe * np.sqrt(photons / power)).astype(np.complex64)
    return GroundTruth(
        object=obj, probe=probe, positions_px=corners, positions_m=true_m,
        nominal_positions_m=nominal_m, origin_px=np.asarray(origin, dtype=np.float64),
        object_pixel_size_m=dx, geometry=geometry, photons=float(photons),
        pixel_mask=pixel_mask, hot_rate=hot_rate, seed=int(seed),
        propagation=propagation, focus_distance_m=focus_distance_m,
        object_layer_spacing_m=np.array(spacings),
    )


# ------------------------------------------------------------------------------ the scan


def detector_frames(gt: GroundTruth, start: int, stop: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson counts of frames ``start:stop`` with dead (0) and hot pixels, as uint32."""
    counts = rng.poisson(model_intensities(gt, start, stop))
    hot = gt.hot_rate > 0
    counts[:, hot] = rng.poisson(gt.hot_rate[hot], (counts.shape[0], int(hot.sum())))
    counts[:, (gt.pixel_mask & MASK_DEAD) != 0] = 0
    return np.minimum(counts, np.iinfo(np.uint32).max - 1).astype(np.uint32)


def simulate_scan(
    out_dir: str | Path,
    name: str,
    positions: int = 200,
    probe_size: int = 64,
    photons: float = 1e6,
    seed: int = 0,
    frames_per_file: int = 50,
    rate_hz: float | None = None,
    progress: Progress | None = None,
    *,
    overlap: float = 0.75,
    jitter_m: float = 10e-9,
    pattern: str = "spiral",
    geometry: Geometry = DEFAULT_GEOMETRY,
    stop_after: int | None = None,
    overwrite: bool = False,
    propagation: str = "far-field",
    probe_drift_px: float = 0.0,
    slices: int = 1,
    slice_spacing_m: float | Sequence[float] | str | None = None,
) -> Path:
    """Simulate a scan and write it as a detector would; returns the master file path.

    ``rate_hz``: frames per second of "acquisition" (data files appear every
    ``frames_per_file / rate_hz`` s); None writes as fast as possible. ``stop_after``: abort
    the scan after that many frames (the master still promises all of them), as a beamline
    does when a scan is interrupted. ``progress(frames_written, frames_total)`` is called
    after each data file. ``propagation="near-field"``: a near-field cone-beam scan
    (:func:`make_near_field_ground_truth`, its own geometry; ``overlap`` and ``pattern`` do
    not apply), its regime and focus distance recorded in the master file.
    ``probe_drift_px``: a fly scan whose beam drifts smoothly along acquisition order
    (far field; :func:`fly_scan_drift`). ``slices`` ≥ 2 with ``slice_spacing_m`` (one
    spacing or S−1, metres): a thick sample, its layers in the ground truth.
    """
    if frames_per_file < 1:
        raise ValueError("frames_per_file must be ≥ 1")
    if rate_hz is not None and rate_hz <= 0:
        raise ValueError("rate_hz must be > 0")
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"invalid scan name {name!r}")
    master = master_path(Path(out_dir), name)
    scan_dir = master.parent
    slice_spacings(slices, slice_spacing_m)  # refused before anything is written
    if master.exists() or (scan_dir / GROUND_TRUTH).exists():
        if not overwrite:
            raise FileExistsError(f"{scan_dir} already holds a scan named {name}")
        for p in [master, scan_dir / GROUND_TRUTH, *scan_dir.glob(f"{name}_data_*.h5")]:
            p.unlink(missing_ok=True)
    scan_dir.mkdir(parents=True, exist_ok=True)

    if propagation == "near-field" and probe_drift_px:
        raise ValueError("probe_drift_px applies to far-field scans only")
    if propagation == "near-field":
        gt = make_near_field_ground_truth(positions, probe_size, photons, seed,
                                          jitter_m=jitter_m, slices=slices,
                                          slice_spacing_m=slice_spacing_m)
    elif propagation == "far-field":
        gt = make_ground_truth(
            positions, probe_size, photons, seed,
            overlap=overlap, jitter_m=jitter_m, pattern=pattern, geometry=geometry,
            probe_drift_px=probe_drift_px, slices=slices, slice_spacing_m=slice_spacing_m,
        )  # fmt: skip
    else:
        raise ValueError(f"propagation must be far-field or near-field, not {propagation!r}")
    write_ground_truth(scan_dir / GROUND_TRUTH, gt)
    write_master(
        master,
        geometry=gt.geometry,
        frame_shape=(probe_size, probe_size),
        positions_m=gt.nominal_positions_m,
        frames_per_file=frames_per_file,
        pixel_mask=gt.pixel_mask,
        count_time_s=(1.0 / rate_hz) if rate_hz else 0.1,
        optics=gt.optics,
        propagation=gt.propagation.model if gt.propagation.near_field else None,
        focus_distance_m=gt.focus_distance_m,
    )
    noise = np.random.default_rng(np.random.SeedSequence(seed).spawn(4)[3])
    total = positions if stop_after is None else max(0, min(positions, stop_after))
    t0 = time.monotonic()
    for index, start in enumerate(range(0, total, frames_per_file), start=1):
        stop = min(start + frames_per_file, total)
        frames = detector_frames(gt, start, stop, noise)
        if rate_hz is not None:  # the file is complete when its last frame is acquired
            delay = t0 + stop / rate_hz - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        write_data_file(scan_dir / data_file_name(name, index), frames, start + 1)
        if progress is not None:
            progress(stop, positions)
    return master
