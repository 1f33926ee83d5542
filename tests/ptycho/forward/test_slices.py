"""Multislice geometry (beamflow.ptycho.forward.slices): spacings, the band-limited propagator
between layers, the depth of field and the frequency that a spacing separates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from beamflow.ptycho.forward.propagation import transfer_function
from beamflow.ptycho.forward.slices import (
    NYQUIST_FRACTION,
    depth_of_field,
    separation_frequency,
    slice_spacings,
    slice_transfer,
)

LAMBDA = 1.239842e-6 / 8800.0  # 8.8 keV
DX = 58.7e-9


# ----------------------------------------------------------------------------- spacings


def test_one_spacing_broadcasts_and_a_list_is_taken_as_is():
    assert slice_spacings(3, 4e-4) == (4e-4, 4e-4)
    assert slice_spacings(3, [1e-4, 2e-4]) == (1e-4, 2e-4)
    assert slice_spacings(2, np.array([5e-6])) == (5e-6,)
    assert slice_spacings(np.int64(2), np.float32(1e-3)) == (pytest.approx(1e-3),)
    assert slice_spacings(3, np.array(2e-4)) == (2e-4, 2e-4)
    # what --slice-spacing gives: one number, or S−1 comma-separated numbers
    assert slice_spacings(3, "4e-4") == (4e-4, 4e-4)
    assert slice_spacings(3, "1e-4, 2e-4") == (1e-4, 2e-4)


def test_one_layer_has_no_gaps():
    assert slice_spacings(1, None) == ()
    assert slice_spacings(1, 4e-4) == ()  # one value for every gap: there are none
    assert slice_spacings(1, []) == ()
    with pytest.raises(ValueError, match="1 slices need 0 slice spacings"):
        slice_spacings(1, [4e-4])


@pytest.mark.parametrize(("slices", "spacing", "message"), [
    (2, None, "2 slices need a slice spacing"),
    (3, [1e-4], "3 slices need 2 slice spacings .*got 1"),
    (2, [1e-4, 2e-4], "2 slices need 1 slice spacing .*got 2"),
    (3, "1e-4,2e-4,3e-4", "3 slices need 2 slice spacings .*got 3"),
    (2, 0.0, "finite and > 0"),
    (3, [1e-4, -2e-4], "finite and > 0 metres, got -0.0002"),
    (2, float("nan"), "finite and > 0"),
    (2, math.inf, "finite and > 0"),
    (2, "400um", "not a number of metres"),
    (2, ["a"], "must be numbers of metres"),
    (2, object(), "must be a number of metres"),
    (3, [[1e-4, 2e-4]], "3 slices need 2"),
    (0, None, "whole number ≥ 1"),
    (True, None, "whole number ≥ 1"),
    (2.0, 1e-4, "whole number ≥ 1"),
])
def test_bad_spacings_are_refused_with_the_reason(slices, spacing, message):
    with pytest.raises(ValueError, match=message):
        slice_spacings(slices, spacing)


# ----------------------------------------------------------------------------- propagator


def test_transfer_is_the_exact_angular_spectrum_inside_its_band():
    m, dz = 64, 4e-4
    h = slice_transfer(m, LAMBDA, dz, DX)
    assert h.shape == (m, m) and h.dtype == np.complex64
    band = h != 0
    exact = transfer_function(m, LAMBDA, dz, DX)
    np.testing.assert_allclose(h[band], exact[band], atol=1e-6)
    np.testing.assert_allclose(np.abs(h[band]), 1.0, atol=1e-6)  # unitary on its band
    # paraxially exp(−iπλΔz f²): the sign of a wave travelling towards +z (PTYCHO_MATH.md)
    f = np.fft.fftfreq(m) / DX
    paraxial = np.exp(-1j * np.pi * LAMBDA * dz * (f[:, None] ** 2 + f[None, :] ** 2))
    np.testing.assert_allclose(h[band], paraxial[band], atol=2e-3)
    # H(a)·H(b) = H(a + b) and conj(H) goes back: propagation composes exactly
    h1, h2 = slice_transfer(m, LAMBDA, 1e-4, DX), slice_transfer(m, LAMBDA, 3e-4, DX)
    np.testing.assert_allclose(h1 * h2, h, atol=1e-5)
    np.testing.assert_allclose(np.conj(h) * h, band.astype(np.float32), atol=1e-6)


def test_two_thirds_of_nyquist_disc_at_small_spacings():
    m = 64
    h = slice_transfer(m, LAMBDA, 4e-4, DX)
    k = np.fft.fftfreq(m)  # cycles per pixel
    radius = np.hypot(k[:, None], k[None, :])
    assert abs(NYQUIST_FRACTION - 2 / 3) < 1e-12
    np.testing.assert_array_equal(h != 0, radius <= 0.5 * NYQUIST_FRACTION)
    # a spacing of 0 propagates nothing but keeps the band limit
    h0 = slice_transfer(m, LAMBDA, 0.0, DX)
    np.testing.assert_array_equal(h0, (radius <= 1 / 3).astype(np.complex64))
    # without the disc (a simulator's padded window) every frequency passes at this spacing
    assert (slice_transfer(m, LAMBDA, 4e-4, DX, nyquist_fraction=None) != 0).all()


@pytest.mark.parametrize("dz", [1e-2, 3e-2])
def test_matsushima_limit_keeps_the_phase_of_h_sampled(dz):
    """Beyond f_lim the phase of H changes by more than π between neighbouring frequency
    samples (its local frequency exceeds the sampling: the propagated wave wraps around the
    periodic window); the band limit keeps exactly the frequencies where it does not."""
    m = 64
    h = slice_transfer(m, LAMBDA, dz, DX, nyquist_fraction=None)
    f = np.fft.fftfreq(m)[: m // 2] / DX  # 0 … Nyquist along one axis
    phase = 2 * np.pi * dz * np.sqrt(1 / LAMBDA**2 - f**2)
    step = np.abs(np.diff(phase))  # between f[i] and f[i+1]
    kept = h[0, : m // 2] != 0
    n = int(kept.sum())
    assert 1 < n < m // 2  # the limit binds at these spacings
    assert kept[:n].all() and not kept[n:].any()
    assert step[: n - 1].max() <= np.pi  # sampled between kept frequencies
    assert step[n] > np.pi  # and not from the first dropped one on
    df = 1 / (m * DX)
    f_lim = 1 / (LAMBDA * math.sqrt((2 * df * dz) ** 2 + 1))
    assert f[n - 1] < f_lim <= f[n]
    # per axis: the kept set is a square (below 2/3 Nyquist, which no longer binds here)
    band = slice_transfer(m, LAMBDA, dz, DX) != 0
    np.testing.assert_array_equal(band, np.outer(h[:, 0] != 0, h[0, :] != 0))


def test_transfer_refuses_bad_geometry():
    with pytest.raises(ValueError, match="spacing_m must be finite and ≥ 0"):
        slice_transfer(16, LAMBDA, -1e-4, DX)
    with pytest.raises(ValueError, match="wavelength_m"):
        slice_transfer(16, 0.0, 1e-4, DX)
    with pytest.raises(ValueError, match="nyquist_fraction"):
        slice_transfer(16, LAMBDA, 1e-4, DX, nyquist_fraction=1.5)


# ----------------------------------------------------------------------------- scales


def test_depth_of_field_and_separation_frequency():
    # the numbers: 24 µm at 58.7 nm pixels and 8.8 keV; 1 µm at 10 nm
    assert depth_of_field(LAMBDA, DX) == pytest.approx(24.4e-6, rel=0.01)
    assert depth_of_field(LAMBDA, 10e-9) == pytest.approx(0.71e-6, rel=0.01)
    f = separation_frequency(LAMBDA, 4e-4)
    assert math.pi * LAMBDA * 4e-4 * f**2 == pytest.approx(1.0)
    assert 0.1 < f * DX < 0.2  # 400 µm apart: separable above ~0.14 cycles per pixel
    with pytest.raises(ValueError, match="pixel size"):
        depth_of_field(LAMBDA, 0.0)
    with pytest.raises(ValueError, match="spacing"):
        separation_frequency(LAMBDA, 0.0)
