"""A verdict on a reconstruction, from the physics and the data: ``trusted`` or ``suspect``.

An engine always returns an object; whether it means anything is a separate question. The
checks below answer it from what was measured and what was recovered, never from the engine's
own say-so. Each failing check adds one short sentence to the reasons; any reason makes the
result suspect. Findings that suggest a better model without showing this one wrong are
notes: they are told beside the verdict and do not change it.

1. **Regime.** Before anything runs, the frames say which propagation regime they are in
   (:func:`measure_data`). A near-field hologram is a shadow of the sample: its features move
   across the detector as the sample moves (:func:`content_motion`). A far-field pattern
   stays in place, with most of its counts in a stationary bright central peak (the
   unscattered beam) far above the median pixel (``peak_fraction``: the share of the counts
   in the brightest 5 % of the pixels; ``peak_to_median``). A model applied to data of the
   other regime is suspect.
2. **Misfit.** The normalised amplitude misfit Σ(√I_model − √I)²/ΣI must fall and end within
   a factor of the Poisson noise floor: for counts λ the expected (√I − √λ)² is ≈ 1/4 (λ ≳ 1)
   or ≈ λ (dark pixels), so a perfect model scores Σ min(λ, 1/4)/Σλ (:func:`noise_floor`).
3. **Object.** Inside the illuminated region the object must not be blank: a uniform object
   is what the engine starts from and what it returns when the model cannot explain the data.
4. **Overlap.** The probe's width against the scan's step: ptychography needs the
   illuminated areas of neighbouring positions to overlap (Bunk et al., Ultramicroscopy 108,
   481, 2008: ≳ 60 % linear overlap for robust phasing).
5. **Health.** Everything finite; the probe neither collapsed into a few pixels nor carries a
   power far from what the data's counts call for.
6. **Modes.** Incoherent probe modes beyond the first that hold a real share of the power
   while the misfit stays well above the noise floor are absorbing something they cannot
   model — typically a probe that varies along the scan (use ``opr_modes``). In the near
   field a note only: there a second mode is also how the iterations leave the probe
   guess's local minimum, and real holograms stay far above the floor anyway.
7. **Thickness** (a note). One object layer whose misfit has settled well above the noise
   floor may be a sample thicker than the depth of field Δx²/λ, which one layer cannot
   explain (use ``slices``); real data also stay above the floor for other reasons (the
   PETRA III near-field scan settles at 18×), so it does not make the result suspect. With
   layers, the object judged is their product (the projection).

The thresholds are module constants, documented in docs/reconstruction.md with the scans they
were calibrated on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..forward.propagation import Propagation
from .metrics import fit_phase_ramp, illumination_mask

__all__ = ["DataRegime", "Verdict", "judge", "measure_data", "noise_floor", "regime_findings"]

#: Brightest share of the pixels whose counts make the peak fraction.
PEAK_PIXELS = 0.05
#: Far-field data: the brightest 5 % of the pixels hold at least this share of the counts,
#: and the brightest pixel is at least this many times the median one.
FAR_FIELD_PEAK_FRACTION = 0.3
FAR_FIELD_PEAK_TO_MEDIAN = 30.0
#: The frames' content moves with the scan (holograms) when the shifts between frame pairs
#: follow a linear map of their position differences with R² at least this, by at least
#: this many pixels (median).
MOVING_R2 = 0.7
MOVING_MIN_PX = 1.0
#: Frame pairs compared for :func:`content_motion`.
MOTION_PAIRS = 64
#: The final misfit may be at most this many times the Poisson noise floor.
MAX_MISFIT_OVER_FLOOR = 25.0
#: ... and must have fallen to at most this fraction of the first iteration's.
MAX_FINAL_OVER_FIRST = 0.9
#: Blank object: the amplitude's relative spread and the phase's spread (rad, after removing
#: the global phase and ramp) inside the illuminated region both below these.
BLANK_AMPLITUDE_CONTRAST = 0.01
BLANK_PHASE_SPREAD_RAD = 0.02
#: Linear overlap 1 − step/width below this is too little to phase reliably.
MIN_OVERLAP = 0.3
#: Modes absorbing a varying probe: the modes beyond the first hold at least this share of
#: the power while the misfit ends at least this many times the noise floor.
MODES_MIN_POWER = 0.02
MODES_MAX_MISFIT = 3.0
#: A single layer whose misfit ends at least this many times the noise floor may be a thick
#: sample: measured on a simulated sample of two layers 400 µm apart (400 positions, 64²
#: frames, 8.8 keV, 58.7 nm pixels), single-layer rPIE ends at 4.8× the floor; two layers
#: reach the floor.
THICK_MISFIT = 3.0
#: ... once it has settled: fallen by less than this share over the last tenth of the run,
#: at least this many iterations (the single-layer run above: 2.4 % over its last 15 of
#: 150).
SETTLED_FALL = 0.05
SETTLED_ITERATIONS = 10
#: Probe collapse: more than this share of its power in its brightest 1 % of pixels ...
COLLAPSED_PROBE_FRACTION = 0.9
#: ... and the model's counts over the measured ones outside [1/x, x].
MAX_POWER_RATIO = 5.0


@dataclass(frozen=True)
class DataRegime:
    """What the measured frames say of the regime, and the noise floor."""

    peak_fraction: float
    peak_to_median: float
    counts_per_frame: float
    noise_floor: float
    #: how well the frames' content follows the scan (R² of shift = A·Δposition), and the
    #: median shift in pixels between the compared frames (see :func:`content_motion`)
    motion_r2: float = math.nan
    motion_px: float = math.nan

    @property
    def content_moves(self) -> bool:
        return self.motion_r2 >= MOVING_R2 and self.motion_px >= MOVING_MIN_PX

    @property
    def looks_far_field(self) -> bool:
        return (not self.content_moves and self.peak_fraction >= FAR_FIELD_PEAK_FRACTION
                and self.peak_to_median >= FAR_FIELD_PEAK_TO_MEDIAN)

    @property
    def looks_near_field(self) -> bool:
        return self.content_moves


@dataclass
class Verdict:
    verdict: Literal["trusted", "suspect"]
    reasons: list[str] = field(default_factory=list)
    metrics: dict[str, float | None] = field(default_factory=dict)
    #: findings that suggest a better model without making the result suspect
    notes: list[str] = field(default_factory=list)


def noise_floor(mean_frame: ArrayLike, mask: ArrayLike | None = None) -> float:
    """The normalised amplitude misfit a perfect model scores on Poisson counts."""
    lam = np.asarray(mean_frame, np.float64)
    valid = np.ones(lam.shape, bool) if mask is None else np.asarray(mask, bool)
    lam = np.maximum(lam[valid], 0.0)
    total = float(lam.sum())
    return float(np.minimum(lam, 0.25).sum()) / total if total > 0 else math.nan


def measure_data(frames: ArrayLike, positions: ArrayLike, mean_frame: ArrayLike,
                 mask: ArrayLike | None = None) -> DataRegime:
    """Regime indicators and noise floor of a scan: its (N, M, M) frames as recorded, the
    (N, 2) positions (any unit, any linear frame), their mean frame and the valid pixels."""
    lam = np.asarray(mean_frame, np.float64)
    valid = np.ones(lam.shape, bool) if mask is None else np.asarray(mask, bool)
    v = np.maximum(lam[valid], 0.0)
    total = float(v.sum())
    if v.size == 0 or total <= 0:
        return DataRegime(math.nan, math.nan, 0.0, math.nan)
    k = max(1, int(round(PEAK_PIXELS * v.size)))
    top = np.partition(v, v.size - k)[v.size - k:]
    median = float(np.median(v))
    r2, shift = content_motion(frames, positions, lam, valid)
    return DataRegime(
        peak_fraction=float(top.sum()) / total,
        peak_to_median=float(v.max()) / max(median, 1e-3),
        counts_per_frame=total,
        noise_floor=noise_floor(lam, valid),
        motion_r2=r2,
        motion_px=shift,
    )


def content_motion(frames: ArrayLike, positions: ArrayLike, mean_frame: np.ndarray,
                   valid: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """Does the frames' content translate with the scan? ``(R², median shift in px)``.

    A near-field hologram is a (Fresnel-blurred, magnified) shadow of the sample: moving the
    sample moves the hologram's features across the detector. A far-field pattern does not
    translate when the sample moves; its speckle changes in place. For pairs of frames at
    nearby positions, the shift that best aligns their departures from the mean frame
    (phase correlation) is fitted as a linear map of the positions' difference; holograms
    follow it (R² near 1, shifts of pixels), far-field patterns do not.
    """
    f = np.asarray(frames)
    pos = np.asarray(positions, np.float64)
    n = len(f)
    if n < 4:
        return math.nan, math.nan
    m = f.shape[-1]
    window = np.outer(np.hanning(m), np.hanning(m)) * valid
    rng = np.random.default_rng(seed)
    picks = rng.choice(n, size=min(MOTION_PAIRS, n), replace=False)
    shifts, deltas = [], []
    spectra: dict[int, np.ndarray] = {}

    def spectrum(j: int) -> np.ndarray:
        if j not in spectra:
            spectra[j] = np.fft.fft2((np.asarray(f[j], np.float64) - mean_frame) * window)
        return spectra[j]

    for j in picks.tolist():
        d = np.hypot(*(pos - pos[j]).T)
        d[j] = np.inf
        k = int(np.argsort(d)[min(2, n - 2)])  # a near, not the nearest, neighbour
        cross = spectrum(j) * np.conj(spectrum(k))
        corr = np.fft.ifft2(cross / (np.abs(cross) + 1e-12)).real
        peak = np.unravel_index(int(np.argmax(corr)), corr.shape)
        s = [(p + m // 2) % m - m // 2 for p in peak]
        shifts.append(s)
        deltas.append(pos[j] - pos[k])
    s_arr = np.asarray(shifts, np.float64)
    d_arr = np.asarray(deltas, np.float64)
    total = float(np.sum(s_arr**2))
    median = float(np.median(np.hypot(s_arr[:, 0], s_arr[:, 1])))
    if total == 0:
        return 0.0, median
    a, *_ = np.linalg.lstsq(d_arr, s_arr, rcond=None)
    residual = float(np.sum((s_arr - d_arr @ a) ** 2))
    return 1.0 - residual / total, median


def regime_findings(propagation: Propagation, data: DataRegime,
                    loose: bool = False) -> list[str]:
    """What the frames say against the propagation model used (none when they agree): the
    regime check of :func:`judge`, also the cause a failed or diverged run names. With
    ``loose``, data that look like neither regime (content that moves only loosely with the
    scan, no dominant central peak: a cone beam's holograms are such) reconstructed as far
    field are named too: far-field patterns have their peak."""
    if not propagation.near_field and data.looks_near_field:
        return [
            f"The data look like near-field holograms (their content moves with the scan, "
            f"R² {data.motion_r2:.2f}; no stationary central diffraction peak), but a "
            "far-field model was used: try --propagation near-field."]
    if loose and not propagation.near_field and not data.looks_far_field:
        moves = ("" if not math.isfinite(data.motion_r2) else
                 f"; their content follows the scan with R² {data.motion_r2:.2f}")
        return [
            f"The data do not look like far-field diffraction patterns (the brightest 5 % of "
            f"the pixels hold {data.peak_fraction:.0%} of the counts, the peak is "
            f"{data.peak_to_median:.3g}× the median pixel; a far-field pattern's central peak "
            f"holds at least {FAR_FIELD_PEAK_FRACTION:.0%}, at least "
            f"{FAR_FIELD_PEAK_TO_MEDIAN:g}×{moves}): if they are near-field holograms, try "
            "--propagation near-field (and --focus-distance for a cone beam)."]
    if propagation.near_field and data.looks_far_field:
        return [
            f"The data look like far-field diffraction patterns (a stationary central peak "
            f"{data.peak_to_median:.3g}× the median pixel holding {data.peak_fraction:.0%} "
            "of the counts), but a near-field model was used: try --propagation far-field."]
    return []


def _median_step(positions_px: np.ndarray) -> float:
    """Median distance from each position to its nearest neighbour (pixels)."""
    p = np.asarray(positions_px, np.float64)
    if len(p) < 2:
        return math.nan
    best = np.full(len(p), np.inf)
    for s in range(0, len(p), 256):  # bounded memory for long scans
        d = np.hypot(*(p[s:s + 256, None, :] - p[None, :, :]).transpose(2, 0, 1))
        d[np.arange(d.shape[0]), np.arange(s, s + d.shape[0])] = np.inf
        best[s:s + 256] = d.min(axis=1)
    return float(np.median(best))


def _probe_width(probe: np.ndarray) -> float:
    """Diameter (pixels) of the disc whose area is that of the fewest pixels holding 90 % of
    the probe's power (robust to rings, tails and fringes, unlike a threshold on the peak)."""
    inten = np.sort(np.sum(np.abs(probe) ** 2, axis=0).ravel())[::-1]
    total = float(inten.sum())
    if total <= 0:
        return 0.0
    area = int(np.searchsorted(np.cumsum(inten) / total, 0.9)) + 1
    return 2.0 * math.sqrt(area / math.pi)


def judge(
    *,
    obj: ArrayLike,
    probe: ArrayLike,
    positions_px: ArrayLike,
    loss_history: Sequence[float],
    propagation: Propagation,
    data: DataRegime,
) -> Verdict:
    """Judge a finished reconstruction. ``positions_px``: the windows' top-left corners."""
    o = np.asarray(obj)
    layers = 1 if o.ndim == 2 else o.shape[0]
    if o.ndim == 3:  # layers: the projection is what the probe and the data see
        o = np.prod(o, axis=0)
    p = np.asarray(probe)
    if p.ndim == 2:
        p = p[None]
    pos = np.asarray(positions_px, np.float64)
    losses = np.asarray(list(loss_history), np.float64)
    reasons: list[str] = []
    metrics: dict[str, float | None] = {
        "peak_fraction": data.peak_fraction, "peak_to_median": data.peak_to_median,
        "content_motion_r2": data.motion_r2, "content_motion_px": data.motion_px,
        "noise_floor": data.noise_floor}

    # 5. Health first: nothing below means anything on non-finite arrays; the regime may
    # still say why it diverged.
    finite = bool(np.all(np.isfinite(o)) and np.all(np.isfinite(p)) and np.all(
        np.isfinite(losses)))
    if not finite:
        reasons.append("The reconstruction holds non-finite values (NaN or infinity): it "
                       "diverged.")
        reasons += regime_findings(propagation, data, loose=True)
        return Verdict("suspect", reasons, metrics)

    # 1. Regime.
    near = propagation.near_field
    reasons += regime_findings(propagation, data)
    notes = [f for f in regime_findings(propagation, data, loose=True) if f not in reasons]

    # 2. Misfit.
    if len(losses):
        final, first = float(losses[-1]), float(losses[0])
        metrics.update(final_misfit=final, first_misfit=first)
        ratio = final / data.noise_floor if data.noise_floor > 0 else math.inf
        metrics["misfit_over_noise_floor"] = ratio
        if len(losses) >= 5 and not final <= MAX_FINAL_OVER_FIRST * first:
            reasons.append(f"The data misfit did not fall ({first:.3g} at the first "
                           f"iteration, {final:.3g} at the last).")
        if ratio > MAX_MISFIT_OVER_FLOOR:
            reasons.append(f"The data misfit ends at {ratio:.3g}× the Poisson noise floor "
                           f"(at most {MAX_MISFIT_OVER_FLOOR:g}×): the model does not explain "
                           "the data.")
        if layers == 1 and ratio >= THICK_MISFIT and _settled(losses):
            notes.append(_thick_sample_note(ratio, propagation))
    else:
        reasons.append("No iteration ran: there is no misfit to judge.")

    # 3. Object inside the illuminated region.
    corners = np.clip(np.rint(pos), 0, None)
    m = p.shape[-1]
    inside = (corners[:, 0] + m <= o.shape[0]) & (corners[:, 1] + m <= o.shape[1])
    region = illumination_mask(o.shape, p, corners[inside], fraction=0.3)
    if region.sum() >= 16:
        z = o[region].astype(np.complex128)
        amp = np.abs(z)
        contrast = float(amp.std() / max(amp.mean(), 1e-30))
        phase_spread = _phase_spread(o, region)
        metrics.update(amplitude_contrast=contrast, phase_spread_rad=phase_spread)
        if contrast < BLANK_AMPLITUDE_CONTRAST and phase_spread < BLANK_PHASE_SPREAD_RAD:
            reasons.append(
                f"The object is blank inside the illuminated region (amplitude contrast "
                f"{contrast:.2%}, phase spread {phase_spread:.3g} rad): nothing was recovered.")
    else:
        reasons.append("The probe illuminates (almost) nothing of the object.")

    # 4. Overlap.
    step = _median_step(pos)
    width = _probe_width(p)
    overlap = 1.0 - step / width if width > 0 and math.isfinite(step) else None
    metrics.update(step_px=step if math.isfinite(step) else None, probe_width_px=width,
                   overlap=overlap)
    if overlap is not None and overlap < MIN_OVERLAP:
        reasons.append(f"The scan's step ({step:.3g} px) leaves {max(overlap, 0):.0%} "
                       f"linear overlap for a probe {width:.3g} px wide (at least "
                       f"{MIN_OVERLAP:.0%} needed): the phase is not constrained.")

    # 5. Probe collapse and power.
    inten = np.sum(np.abs(p) ** 2, axis=0).ravel()
    total = float(inten.sum())
    k = max(1, inten.size // 100)
    concentrated = float(np.partition(inten, inten.size - k)[inten.size - k:].sum()) / total \
        if total > 0 else 1.0
    metrics["probe_top1pct_power"] = concentrated
    if total <= 0 or concentrated > COLLAPSED_PROBE_FRACTION:
        reasons.append(f"The probe collapsed: {concentrated:.0%} of its power sits in 1 % "
                       "of its pixels.")
    if data.counts_per_frame > 0 and total > 0 and region.any():
        # Expected counts per frame for the recovered probe and object.
        scale = 1.0 if near else float(m * m)
        mean_t = float(np.mean(np.abs(o[region]) ** 2))
        ratio = total * scale * mean_t / data.counts_per_frame
        metrics["model_over_measured_counts"] = ratio
        if not 1.0 / MAX_POWER_RATIO <= ratio <= MAX_POWER_RATIO:
            reasons.append(f"The model's counts are {ratio:.3g}× the measured ones: the "
                           "probe blew up or faded away.")
    # 6. Incoherent modes that absorb a varying probe. In the near field only a note: there
    # a second mode also carries the iterations out of the probe guess's local minimum and
    # takes 8-40 % of the power from a fully coherent simulated beam, and real holograms
    # stay far above the floor with one mode or two (PETRA III: 16x and 14x).
    reason = _modes_absorb_a_varying_probe(p, metrics.get("misfit_over_noise_floor"), metrics)
    if reason:
        (notes if near else reasons).append(reason)
    return Verdict("suspect" if reasons else "trusted", reasons, metrics, notes)


def _settled(losses: np.ndarray) -> bool:
    """Whether the misfit has stopped falling: by less than :data:`SETTLED_FALL` over the
    last tenth of the run (at least :data:`SETTLED_ITERATIONS` iterations) — what a model
    that cannot explain the data does; a short run still on its way down is not judged."""
    span = max(SETTLED_ITERATIONS, len(losses) // 10)
    if len(losses) <= span:
        return False
    return bool(losses[-1] >= (1.0 - SETTLED_FALL) * losses[-1 - span])


def _thick_sample_note(ratio: float, propagation: Propagation) -> str:
    """The thickness finding, with the depth of field Δx²/λ of the geometry when known."""
    dof = ""
    lam, dx = propagation.wavelength_m, propagation.pixel_size_m
    if lam and dx:
        dof = (f" (Δx²/λ = {_length(dx * dx / lam)} at {_length(dx)} pixels and "
               f"{1.239842e-6 / lam / 1e3:.3g} keV)")
    return (f"The data misfit stays at {ratio:.3g}× the Poisson noise floor (at least "
            f"{THICK_MISFIT:g}×) with one object layer: the sample may be thicker than the "
            f"depth of field{dof}, which one layer cannot explain; try layers, e.g. --slices 2 "
            "--slice-spacing set to half the sample's thickness.")


def _length(metres: float) -> str:
    for unit, scale in (("nm", 1e-9), ("µm", 1e-6), ("mm", 1e-3)):
        if abs(metres / scale) < 1000:
            return f"{metres / scale:.3g} {unit}"
    return f"{metres:.3g} m"


def _modes_absorb_a_varying_probe(p: np.ndarray, misfit_over_floor: float | None,
                                  metrics: dict[str, float | None]) -> str | None:
    """A reason when the probe modes beyond the first hold a real share of the power and the
    misfit still stays well above the noise floor.

    Incoherent modes model a beam that is the same mixture at every position; a partially
    coherent beam is explained by them down to the noise floor. When the beam varies along
    the scan (a fly scan's drift), extra modes take up power — blurring the object — without
    bringing the misfit down: that combination is the sign of a variable probe, which
    ``opr_modes`` models."""
    powers = np.sum(np.abs(p.reshape(p.shape[0], -1)) ** 2, axis=1)
    total = float(powers.sum())
    share = float(powers[1:].sum()) / total if total > 0 and len(powers) > 1 else 0.0
    metrics["minor_modes_power"] = share
    if misfit_over_floor is None or not math.isfinite(misfit_over_floor):
        return None
    if share >= MODES_MIN_POWER and misfit_over_floor >= MODES_MAX_MISFIT:
        return (f"The probe modes beyond the first hold {share:.1%} of the power, yet the "
                f"misfit stays at {misfit_over_floor:.3g}× the noise floor (at most "
                f"{MODES_MAX_MISFIT:g}× with modes): the modes may be absorbing a probe that "
                "varies along the scan (beam drift, vibration); try a variable probe "
                "(opr_modes).")
    return None


def _phase_spread(o: np.ndarray, region: np.ndarray) -> float:
    """Standard deviation (rad) of the phase inside ``region`` after removing the global
    phase and the best linear ramp (which ptychography cannot determine)."""
    c, gy, gx = fit_phase_ramp(o, region)
    yy, xx = np.indices(o.shape)
    flat = o * np.exp(-1j * (gy * yy + gx * xx + c))
    z = flat[region]
    ph = np.angle(z * np.conj(np.mean(z) / max(abs(np.mean(z)), 1e-30)))
    return float(np.std(ph))
