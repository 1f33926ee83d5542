"""Tests for beamflow.ptycho.probe: probe files, zone-plate optics, data guess, scale, modes."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from beamflow.ptycho import probe as P

E_EV = 8800.0
DX = 12.5e-9
M = 128
ZP = P.ZonePlate(diameter_m=100e-6, outer_zone_width_m=50e-9, central_stop_fraction=0.5)


def _k2(m: int, dx: float) -> np.ndarray:
    k = np.fft.fftfreq(m, dx)
    return k[:, None] ** 2 + k[None, :] ** 2


def _radial(m: int) -> np.ndarray:
    n = np.arange(m) - m // 2
    return np.hypot(*np.meshgrid(n, n, indexing="ij"))


# --------------------------------------------------------------------------- files


def _rand_probe(shape, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


@pytest.mark.parametrize("shape", [(32, 32), (3, 32, 32)])
def test_load_npy_returns_modes(tmp_path, shape):
    arr = _rand_probe(shape)
    path = tmp_path / "probe.npy"
    np.save(path, arr)
    got = P.load_probe(path, frame_size=32)
    assert got.shape == (1 if len(shape) == 2 else 3, 32, 32)
    assert got.dtype == np.complex64
    assert np.array_equal(got.reshape(shape), arr)


def test_load_product_h5_layouts(tmp_path):
    arr = _rand_probe((2, 16, 16))
    path = tmp_path / "product.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("probe", data=arr[None])  # Ptychodus: [OPR, modes, H, W]
        ds.attrs["pixel_width_m"] = DX
    got = P.load_probe(path, frame_size=16, pixel_size_m=DX)
    assert np.array_equal(got, arr)
    # Requesting fewer modes keeps the strongest (first); the engine makes any missing ones.
    assert np.array_equal(P.load_probe(path, n_modes=1), arr[:1])
    assert P.load_probe(path, n_modes=4).shape == (2, 16, 16)


def test_load_ground_truth_style_2d_h5(tmp_path):
    arr = _rand_probe((16, 16))
    path = tmp_path / "ground_truth.h5"
    with h5py.File(path, "w") as f:
        f["probe"] = arr
    assert P.load_probe(path).shape == (1, 16, 16)


@pytest.mark.parametrize(
    "writer,kwargs,match",
    [
        (
            lambda p: np.save(p.with_suffix(".npy"), _rand_probe((32, 32))),
            {"frame_size": 64},
            r"probe is 32×32 px but the scan's frames are 64×64",
        ),
        (
            lambda p: np.save(p.with_suffix(".npy"), np.ones((32, 32), np.int32)),
            {},
            "expected a complex array",
        ),
        (lambda p: np.save(p.with_suffix(".npy"), _rand_probe((2, 16, 8))), {}, "square"),
        (lambda p: np.save(p.with_suffix(".npy"), np.full((8, 8), np.nan, complex)), {}, "NaN"),
        (lambda p: np.save(p.with_suffix(".npy"), _rand_probe((2, 2, 8, 8))), {}, "2 OPR modes"),
    ],
)
def test_bad_npy_files_fail_naming_the_file(tmp_path, writer, kwargs, match):
    base = tmp_path / "bad"
    writer(base)
    path = base.with_suffix(".npy")
    with pytest.raises(P.ProbeFileError, match=match) as err:
        P.load_probe(path, **kwargs)
    assert str(path) in str(err.value)


def test_bad_h5_files_fail_naming_the_file(tmp_path):
    no_probe = tmp_path / "noprobe.h5"
    with h5py.File(no_probe, "w") as f:
        f["object"] = np.ones((4, 4), complex)
    with pytest.raises(P.ProbeFileError, match="no 'probe' dataset") as err:
        P.load_probe(no_probe)
    assert "noprobe.h5" in str(err.value)

    wrong_px = tmp_path / "px.h5"
    with h5py.File(wrong_px, "w") as f:
        f.create_dataset("probe", data=_rand_probe((8, 8))).attrs["pixel_width_m"] = 2 * DX
    with pytest.raises(P.ProbeFileError, match="pixel size"):
        P.load_probe(wrong_px, pixel_size_m=DX)

    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"not hdf5 at all")
    with pytest.raises(P.ProbeFileError, match="not a readable HDF5"):
        P.load_probe(garbage)
    with pytest.raises(P.ProbeFileError, match="no such file"):
        P.load_probe(tmp_path / "missing.npy")
    with pytest.raises(P.ProbeFileError, match="unknown probe file type"):
        P.load_probe(garbage.rename(tmp_path / "probe.txt"))


# --------------------------------------------------------------------------- optics


def test_zone_plate_focus_has_airy_first_zero_at_1_22_dr():
    zp = P.ZonePlate(diameter_m=100e-6, outer_zone_width_m=50e-9)
    assert zp.focal_length_m(E_EV) == pytest.approx(100e-6 * 50e-9 / P.wavelength_m(E_EV))
    p = P.zone_plate_probe(M, DX, E_EV, zp, 0.0)
    assert p.shape == (1, M, M) and p.dtype == np.complex64
    assert np.sum(np.abs(p) ** 2) == pytest.approx(1.0, rel=1e-5)
    prof = np.abs(p[0, M // 2, M // 2 :]) ** 2
    first_min = int(np.argmax(np.diff(prof) > 0))
    assert first_min * DX == pytest.approx(1.22 * 50e-9, abs=DX)  # Rayleigh: 1.22 d_r


@pytest.mark.parametrize("defocus", [0.3e-3, -0.4e-3])
def test_zone_plate_defocused_beam_fills_geometric_cone(defocus):
    p = P.zone_plate_probe(M, DX, E_EV, ZP, defocus)[0]
    f = ZP.focal_length_m(E_EV)
    outer_px = ZP.diameter_m * abs(defocus) / f / 2 / DX
    inner_px = ZP.central_stop_fraction * outer_px
    intensity = np.abs(p) ** 2
    r = _radial(M)
    ring = (r > inner_px * 0.8) & (r < outer_px * 1.15)
    assert intensity[ring].sum() / intensity.sum() > 0.85


def test_zone_plate_defocus_matches_angular_spectrum_propagation():
    # Independent check of sign and scale: the focus propagated by Δz with the Fresnel
    # transfer function is the probe computed at Δz.
    dz = 0.3e-3
    focus = P.zone_plate_probe(M, DX, E_EV, ZP, 0.0)[0]
    lam = P.wavelength_m(E_EV)
    prop = np.fft.ifft2(np.fft.fft2(focus) * np.exp(-1j * np.pi * lam * dz * _k2(M, DX)))
    direct = P.zone_plate_probe(M, DX, E_EV, ZP, dz)[0]
    overlap = abs(np.vdot(prop, direct)) / (np.linalg.norm(prop) * np.linalg.norm(direct))
    assert overlap > 0.99
    wrong = P.zone_plate_probe(M, DX, E_EV, ZP, -dz)[0]
    assert abs(np.vdot(prop, wrong)) / np.linalg.norm(prop) / np.linalg.norm(wrong) < 0.9


def test_zone_plate_rejects_beam_larger_than_window():
    with pytest.raises(ValueError, match="does not fit"):
        P.zone_plate_probe(M, DX, E_EV, ZP, 1e-3)
    with pytest.raises(ValueError):
        P.ZonePlate(diameter_m=100e-6, outer_zone_width_m=50e-9, central_stop_fraction=1.2)


# --------------------------------------------------------------------------- data, scale


def _frames_of(probe: np.ndarray, n: int, rng) -> np.ndarray:
    far = np.abs(np.fft.fftshift(np.fft.fft2(probe))) ** 2
    return rng.poisson(np.broadcast_to(far, (n, *far.shape))).astype(np.float32)


def test_probe_from_diffraction_recovers_far_field_modulus_and_counts():
    rng = np.random.default_rng(4)
    truth = P.scale_probe(P.zone_plate_probe(64, 25e-9, E_EV, ZP, 0.3e-3), 1e5)[0]
    frames = _frames_of(truth, 20, rng)
    mask = np.ones((64, 64), bool)
    mask[30:32, 10:40] = False  # a dead strip through the bright field
    frames[:, ~mask] = 0
    guess = P.probe_from_diffraction(frames, pixel_size_m=25e-9, energy_eV=E_EV, mask=mask)
    assert guess.shape == (1, 64, 64)
    far_guess = np.abs(np.fft.fftshift(np.fft.fft2(guess[0])))
    far_true = np.abs(np.fft.fftshift(np.fft.fft2(truth)))
    # Modulus matches (Poisson noise, and the strip filled from neighbours).
    err = np.linalg.norm(far_guess - far_true) / np.linalg.norm(far_true)
    assert err < 0.05
    counts = P.mean_counts_per_frame(frames, mask)
    assert np.sum(far_guess[mask] ** 2) == pytest.approx(counts, rel=1e-4)


def test_probe_from_diffraction_curvature_spreads_the_probe():
    # A bright-field disc of radius 10 px: with Δz = 0.5 mm the geometric beam is
    # 2·λ·Δz·k_max ≈ 35 px across, against an Airy core of ~2 px without curvature.
    far = np.zeros((64, 64))
    far[np.hypot(*(np.indices((64, 64)) - 32)) < 10] = 100.0
    flat = P.probe_from_diffraction(far, pixel_size_m=25e-9, energy_eV=E_EV)[0]
    curved = P.probe_from_diffraction(far, pixel_size_m=25e-9, energy_eV=E_EV, defocus_m=0.5e-3)[0]

    def half_power_radius(p):
        w = (np.abs(p) ** 2).ravel()
        r = _radial(64).ravel()
        order = np.argsort(r)
        return r[order][np.searchsorted(np.cumsum(w[order]), 0.5 * w.sum())]

    assert half_power_radius(flat) < 3
    assert 10 < half_power_radius(curved) < 20


def test_scale_probe_matches_counts_with_and_without_mask():
    p = _rand_probe((2, 16, 16))
    scaled = P.scale_probe(p, 1e6)
    assert np.sum(np.abs(np.fft.fft2(scaled)) ** 2) == pytest.approx(1e6, rel=1e-5)
    mask = np.ones((16, 16), bool)
    mask[:, :4] = False
    scaled = P.scale_probe(p, 5e5, mask=mask)
    valid = np.fft.ifftshift(mask)
    assert np.sum((np.abs(np.fft.fft2(scaled)) ** 2)[:, valid]) == pytest.approx(5e5, rel=1e-5)
    with pytest.raises(ValueError, match="positive"):
        P.scale_probe(p, 0)


def test_mean_counts_per_frame():
    frames = np.ones((3, 4, 4))
    frames[1] *= 3
    assert P.mean_counts_per_frame(frames) == pytest.approx(16 * 5 / 3)
    mask = np.zeros((4, 4), bool)
    mask[0] = True
    assert P.mean_counts_per_frame(frames, mask) == pytest.approx(4 * 5 / 3)


