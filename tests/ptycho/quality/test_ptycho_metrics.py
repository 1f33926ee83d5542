"""Tests for beamflow.ptycho.quality.metrics: registration, ramp removal, NRMSE, FRC."""

from __future__ import annotations

import numpy as np
import pytest

from beamflow.ptycho.quality import metrics as M

N = 96


def _blob_object(rng: np.random.Generator, n_blobs: int = 40):
    """An analytic complex object: obj(y, x) can be evaluated at any (shifted) coordinate,
    so a shifted copy carries no interpolation error of its own."""
    cy, cx = rng.uniform(0, N, (2, n_blobs))
    height = rng.normal(0, 1, n_blobs)
    width = rng.uniform(2, 5, n_blobs)

    def obj(y, x):
        phase = np.zeros_like(y)
        amp = np.ones_like(y)
        for i in range(n_blobs):
            g = np.exp(-((y - cy[i]) ** 2 + (x - cx[i]) ** 2) / (2 * width[i] ** 2))
            phase += height[i] * g
            amp -= 0.1 * abs(height[i]) * g
        return amp * np.exp(1j * phase)

    return obj


@pytest.fixture
def scene():
    rng = np.random.default_rng(7)
    obj = _blob_object(rng)
    y, x = np.indices((N, N)).astype(float)
    mask = np.zeros((N, N), bool)
    mask[20:-20, 20:-20] = True
    return obj, y, x, mask


@pytest.mark.parametrize(
    "shift,ramp,scale",
    [
        ((0.0, 0.0), (0.0, 0.0), 1.0),
        ((2.3, -1.7), (0.0, 0.0), 0.6 * np.exp(2j)),
        ((0.4, 0.35), (0.3, -0.5), 1.7 * np.exp(-1j)),
        ((-4.5, 3.25), (-0.02, 0.04), 0.2j),
    ],
)
def test_shifted_ramped_scaled_copy_has_zero_nrmse(scene, shift, ramp, scale):
    obj, y, x, mask = scene
    truth = obj(y, x)
    rec = scale * obj(y - shift[0], x - shift[1]) * np.exp(1j * (ramp[0] * y + ramp[1] * x))
    # Garbage outside the scanned region must not matter.
    outside = np.ones((N, N), bool)
    outside[12:-12, 12:-12] = False
    rec[outside] = np.random.default_rng(0).normal(1, 0.5, outside.sum())

    res = M.compare(rec, truth, mask)

    assert res.nrmse < 2e-3
    assert res.phase_nrmse < 5e-3
    # The shift returned moves the reconstruction onto the truth: the opposite of `shift`.
    assert res.shift == pytest.approx((-shift[0], -shift[1]), abs=0.03)
    # Ramp multiplied onto the reconstruction undoes the one put in.
    assert res.ramp == pytest.approx((-ramp[0], -ramp[1]), abs=1e-3)
    assert abs(abs(res.scale) - 1 / abs(scale)) < 1e-2 / abs(scale)
    assert M.complex_nrmse(rec, truth, mask) == pytest.approx(res.nrmse)


def test_without_correction_the_same_copy_is_far_off(scene):
    obj, y, x, mask = scene
    truth = obj(y, x)
    rec = obj(y - 1.5, x + 2.0) * np.exp(1j * 0.2 * x)
    raw = M.compare(rec, truth, mask, register=False, remove_ramp=False).nrmse
    assert raw > 0.5
    assert M.compare(rec, truth, mask).nrmse < 2e-3


@pytest.mark.parametrize("sigma", [0.02, 0.1])
def test_noise_gives_expected_nrmse(scene, sigma):
    obj, y, x, mask = scene
    truth = obj(y, x)
    rng = np.random.default_rng(3)
    noise = sigma * (rng.standard_normal((N, N)) + 1j * rng.standard_normal((N, N)))
    res = M.compare(truth + noise, truth, mask)
    # E‖noise‖² = 2σ² per pixel; the fitted nuisances absorb a negligible share of it.
    expected = np.sqrt(2) * sigma / np.sqrt(np.mean(np.abs(truth[mask]) ** 2))
    assert res.nrmse == pytest.approx(expected, rel=0.1)
    assert res.shift == pytest.approx((0.0, 0.0), abs=0.05)


def test_phase_nrmse_of_unrelated_phase_is_order_one(scene):
    obj, y, x, mask = scene
    truth = obj(y, x)
    other = _blob_object(np.random.default_rng(99))(y, x)
    assert M.phase_nrmse(other, truth, mask) > 0.7


@pytest.mark.parametrize("shift", [(3.0, -2.0), (0.25, 0.6), (-7.4, 5.1)])
def test_register_shift_matches_fourier_shift(shift):
    rng = np.random.default_rng(1)
    img = rng.standard_normal((64, 64)) + 1j * rng.standard_normal((64, 64))
    moved = M.fourier_shift(img, shift)
    est = M.register_shift(img, moved, upsample=100)
    assert est == pytest.approx((-shift[0], -shift[1]), abs=0.011)
    back = M.fourier_shift(moved, est)
    assert np.allclose(back, img, atol=0.05 * np.abs(img).max())


def test_fit_phase_ramp_recovers_steep_plane():
    y, x = np.indices((50, 70)).astype(float)
    z = 2.0 * np.exp(1j * (0.7 + 1.1 * y - 2.5 * x))  # steeper than ±π over a few pixels
    a, gy, gx = M.fit_phase_ramp(z)
    assert (gy, gx) == pytest.approx((1.1, -2.5), abs=1e-9)
    assert np.angle(np.exp(1j * (a - 0.7))) == pytest.approx(0.0, abs=1e-9)


def test_frc_identical_is_one_and_noise_is_zero():
    rng = np.random.default_rng(5)
    img = rng.standard_normal((128, 128))
    same = M.frc(img, img)
    assert np.allclose(same.curve, 1.0)
    assert same.resolution is None  # resolved up to Nyquist

    a, b = rng.standard_normal((2, 128, 128))
    indep = M.frc(a, b, threshold="half-bit")
    # Independent noise: ring averages scatter around 0 with σ ≈ 1/√(ring pixels).
    assert abs(indep.curve[5:].mean()) < 0.02
    assert np.all(np.abs(indep.curve[5:]) < 5 / np.sqrt(indep.n_pixels[5:]))
    assert indep.threshold[5] > indep.threshold[-1] > 0.17  # half-bit falls towards 0.17


def test_frc_finds_resolution_of_low_pass_signal():
    # Signal shared up to 0.2 cycles/px, independent noise above: FRC crosses near 0.2,
    # i.e. a 5-pixel period (1 µm at 200 nm pixels).
    rng = np.random.default_rng(2)
    n = 256
    k = np.hypot(*np.meshgrid(np.fft.fftfreq(n), np.fft.fftfreq(n), indexing="ij"))
    signal = np.fft.ifft2(np.fft.fft2(rng.standard_normal((n, n))) * (k < 0.2)).real
    noise = 0.05
    im1 = signal + noise * rng.standard_normal((n, n))
    im2 = signal + noise * rng.standard_normal((n, n))
    # The signal is periodic, so no apodization is needed; a window would smear the sharp
    # spectral edge of this synthetic signal over several rings.
    res = M.frc(im1, im2, pixel_size=200e-9, apodization=0.0)
    assert res.resolution == pytest.approx(1e-6, rel=0.08)
    assert res.frequency[-1] == pytest.approx(0.5 / 200e-9)


def test_illumination_mask_covers_scanned_region():
    probe = np.zeros((16, 16), complex)
    probe[4:12, 4:12] = 1
    corners = np.array([[10, 10], [10, 18], [18, 10], [18, 18]])  # 8-px steps tile the 8-px disc
    m = M.illumination_mask((48, 48), probe, corners, fraction=0.5)
    assert m[14:30, 14:30].all()
    assert not m[:10].any() and not m[:, 40:].any()
    with pytest.raises(ValueError, match="outside the object"):
        M.illumination_mask((30, 30), probe, corners)


@pytest.mark.parametrize(
    "args,match",
    [
        ((np.full((8, 8), np.nan), np.ones((8, 8))), "reconstruction: contains NaN"),
        ((np.ones((8, 8)), np.ones((8, 9))), "differs from truth shape"),
        ((np.ones((8, 8)), np.zeros((8, 8))), "truth: zero"),
        ((np.ones(8), np.ones(8)), "expected a 2-D image"),
    ],
)
def test_bad_input_fails_clearly(args, match):
    with pytest.raises(ValueError, match=match):
        M.compare(*args)


def test_bad_mask_and_threshold_fail_clearly():
    with pytest.raises(ValueError, match="mask: shape"):
        M.compare(np.ones((8, 8)), np.ones((8, 8)), np.ones((4, 4), bool))
    with pytest.raises(ValueError, match="threshold"):
        M.frc(np.ones((8, 8)), np.ones((8, 8)), threshold="2/3")  # type: ignore[arg-type]
