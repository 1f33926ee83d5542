"""The simulator's thick samples: distinct layers, exact propagation between them on a padded
window (not the engine's periodic frame), the truth per layer in ground_truth.h5, the CLI."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from beamflow.formats import load_scan
from beamflow.ground_truth import read_ground_truth
from beamflow.ptycho.forward.propagation import transfer_function
from beamflow.ptycho.forward.slices import separation_frequency, slice_transfer
from beamflow.simulate import (
    diffraction,
    holograms,
    make_ground_truth,
    make_near_field_ground_truth,
    model_intensities,
    shift_probe,
    simulate_scan,
    thick_intensities,
)

SPACING = 4e-4  # the sample: 400 µm, 16 depths of field at 58.7 nm and 8.8 keV


@pytest.fixture(scope="module")
def thick():
    return make_ground_truth(40, 32, 1e6, seed=3, slices=2, slice_spacing_m=SPACING)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def high_pass(a: np.ndarray, cut: float) -> np.ndarray:
    k = np.hypot(np.fft.fftfreq(a.shape[0])[:, None], np.fft.fftfreq(a.shape[1])[None, :])
    return np.fft.ifft2(np.fft.fft2(a - a.mean()) * (k >= cut)).real


def test_layers_are_distinct_weak_phase_objects():
    gt = make_ground_truth(200, 64, 1e6, seed=0, slices=3, slice_spacing_m=[SPACING, 2e-4])
    assert gt.object.shape[0] == 3 and gt.n_layers == 3
    np.testing.assert_array_equal(gt.object_layer_spacing_m, [SPACING, 2e-4])
    cut = separation_frequency(gt.geometry.wavelength_m, 2e-4) * gt.object_pixel_size_m
    phases = []
    for layer in gt.layers:
        amp, phase = np.abs(layer), np.angle(layer)
        assert amp.min() > 0.8 and amp.max() <= 1 + 1e-6
        assert phase.min() >= 0 and 0.6 < phase.max() < 1.2
        phases.append(high_pass(phase, cut))  # what the per-layer score sees
    # different features in every layer: their fine detail is uncorrelated
    for i in range(3):
        for j in range(i + 1, 3):
            r = np.sum(phases[i] * phases[j]) / np.linalg.norm(phases[i]) / np.linalg.norm(
                phases[j])
            assert abs(r) < 0.2, (i, j, r)
    np.testing.assert_allclose(gt.projection, np.prod(gt.layers, axis=0), rtol=1e-6)
    # the layers fill the padded windows (M/2 beyond each frame window)
    assert (gt.positions_px >= 32).all()
    assert (gt.positions_px + 64 + 32 <= np.array(gt.object.shape[1:])).all()


def test_counts_match_the_photon_setting(thick):
    model = model_intensities(thick)
    assert model.shape == (40, 32, 32)
    assert model.sum(axis=(1, 2)).mean() == pytest.approx(1e6, rel=1e-4)


def test_layers_an_infinitesimal_distance_apart_are_their_product(thick):
    """Nothing propagates between the layers: the thick model is the one-layer model of the
    projection — in the far field exactly the simulator's thin frames (folding the padded
    wave adds nothing); in the near field the hologram of the projection on a window four
    times the frame, cropped (the thin simulator's holograms are periodic in the frame).
    Near field at whole-pixel positions: a sub-pixel shift of the hard-edged probe window
    rings differently on windows of different sizes, and a little of the light that the
    probe window's edges diffract wraps around twice the frame (0.1 %)."""
    args = (thick.probe, thick.positions_px, thick.geometry.wavelength_m,
            thick.object_pixel_size_m)
    flat = thick_intensities(thick.layers, [1e-15], *args)
    np.testing.assert_allclose(flat, diffraction(thick.projection, thick.probe,
                                                 thick.positions_px), rtol=1e-4, atol=1e-2)
    near = make_near_field_ground_truth(12, 32, 1e7, seed=2, slices=2, slice_spacing_m=1e-3)
    near.positions_px = np.floor(near.positions_px)
    flat = thick_intensities(near.layers, [1e-15], near.probe, near.positions_px,
                             near.geometry.wavelength_m, near.object_pixel_size_m,
                             near.propagation)
    m, pad = 32, 4
    big, lo = pad * m, (pad * m - m) // 2
    projection = np.pad(near.projection, big, mode="edge")
    prop = near.propagation
    h = transfer_function(big, prop.wavelength_m, prop.distance_m, prop.pixel_size_m)
    for j, c in enumerate(near.positions_px.astype(int) + big):
        psi = np.zeros((big, big), complex)
        psi[lo : lo + m, lo : lo + m] = near.probe
        wave = psi * projection[c[0] - lo : c[0] - lo + big, c[1] - lo : c[1] - lo + big]
        hologram = np.fft.ifft2(np.fft.fft2(wave) * h)[lo : lo + m, lo : lo + m]
        assert rel(flat[j], np.abs(hologram) ** 2) < 3e-3, j
    periodic = holograms(near.projection, near.probe, near.positions_px, prop)
    assert rel(flat, periodic) > 5e-3  # the thin simulator's hologram wraps around


def independent_far_field(gt, pad: int) -> np.ndarray:
    """The two-layer far field computed here from scratch on a window ``pad`` times the
    frame (exact angular spectrum, the far field of the whole exit wave)."""
    m = gt.probe_size
    big, lo = pad * m, (pad * m - m) // 2
    layers = np.stack([np.pad(t, big, mode="edge") for t in gt.layers])
    h = transfer_function(big, gt.geometry.wavelength_m, SPACING, gt.object_pixel_size_m)
    out = []
    for p in gt.positions_px + big:
        c = np.floor(p).astype(int)
        window = (slice(c[0] - lo, c[0] - lo + big), slice(c[1] - lo, c[1] - lo + big))
        psi = np.zeros((big, big), complex)
        psi[lo : lo + m, lo : lo + m] = shift_probe(gt.probe, (p - c)[None])[0]
        wave = np.fft.ifft2(np.fft.fft2(psi * layers[0][window]) * h) * layers[1][window]
        # the far field at the detector's frequencies k/(MΔx): every pad-th DFT sample
        far = np.fft.fft2(np.roll(wave, (-lo, -lo), axis=(0, 1)))[::pad, ::pad]
        out.append(np.abs(np.fft.fftshift(far)) ** 2)
    return np.array(out)


def engine_like(gt, nyquist_fraction: float | None) -> np.ndarray:
    """What an engine computes: the frame-sized periodic window, band-limited propagator."""
    m = gt.probe_size
    h = slice_transfer(m, gt.geometry.wavelength_m, SPACING, gt.object_pixel_size_m,
                       nyquist_fraction=nyquist_fraction)
    out = []
    for p in gt.positions_px:
        c = np.floor(p).astype(int)
        window = (slice(c[0], c[0] + m), slice(c[1], c[1] + m))
        wave = shift_probe(gt.probe, (p - c)[None])[0] * gt.layers[0][window]
        wave = np.fft.ifft2(np.fft.fft2(wave) * h) * gt.layers[1][window]
        out.append(np.abs(np.fft.fftshift(np.fft.fft2(wave))) ** 2)
    return np.array(out)


def test_propagation_between_layers_is_exact_and_not_the_engines_model(thick):
    sim = model_intensities(thick)
    # a window four times the frame gives the same frames: nothing wraps at twice the frame
    assert rel(sim, independent_far_field(thick, 4)) < 1e-4
    amp = np.sqrt(sim)
    noise = 0.5 * np.sqrt(amp.size) / np.linalg.norm(amp)  # Poisson: σ(√N) ≈ ½
    # the layers matter: one layer (their product) misses the data by more than the noise
    thin = diffraction(thick.projection, thick.probe, thick.positions_px)
    assert rel(np.sqrt(thin), amp) > 1.5 * noise
    # and an engine's frame-sized periodic window does not reproduce the frames exactly
    periodic = engine_like(thick, None)
    assert 1e-3 < rel(np.sqrt(periodic), amp) < noise
    # the 2/3-Nyquist disc cuts the first layer's wide-angle scattering off the detector
    assert rel(np.sqrt(engine_like(thick, 2 / 3)), amp) > noise


def test_thick_scan_on_disk_with_its_layers(tmp_path):
    master = simulate_scan(tmp_path, "t", positions=24, probe_size=32, photons=1e5, seed=4,
                           frames_per_file=12, slices=3, slice_spacing_m="4e-4,2e-4")
    gt = read_ground_truth(master.parent)
    ref = make_ground_truth(24, 32, 1e5, seed=4, slices=3, slice_spacing_m=[4e-4, 2e-4])
    np.testing.assert_array_equal(gt.object, ref.object)
    np.testing.assert_array_equal(gt.object_layer_spacing_m, [4e-4, 2e-4])
    assert gt.object.shape[0] == 3 and gt.n_layers == 3
    with h5py.File(master.parent / "ground_truth.h5") as f:
        assert f["object"].shape == gt.object.shape
        assert f["object_layer_spacing_m"].shape == (2,)
    scan = load_scan(master)  # the detector's files are those of any scan
    assert (scan.n_frames, scan.frame_shape) == (24, (32, 32))
    frames = scan.frames()
    model = model_intensities(gt)
    sel = (model >= 5) & gt.mask[None]
    assert ((frames - model) ** 2 / model)[sel].mean() == pytest.approx(1.0, abs=0.1)
    # a thin truth keeps its 2-D object and no spacing dataset
    thin = simulate_scan(tmp_path, "one", positions=8, probe_size=16, seed=4)
    with h5py.File(thin.parent / "ground_truth.h5") as f:
        assert f["object"].ndim == 2 and "object_layer_spacing_m" not in f
    assert read_ground_truth(thin.parent).n_layers == 1


def test_near_field_thick_scan():
    gt = make_near_field_ground_truth(16, 32, 1e7, seed=1, slices=2, slice_spacing_m=2e-3)
    assert gt.n_layers == 2 and gt.propagation.near_field
    model = model_intensities(gt)
    assert model.sum(axis=(1, 2)).mean() == pytest.approx(1e7, rel=1e-4)
    thin = holograms(gt.projection, gt.probe, gt.positions_px, gt.propagation)
    assert rel(thin, model) > 1e-3  # the layers change the holograms


def test_bad_layer_settings_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="2 slices need a slice spacing"):
        simulate_scan(tmp_path, "x", positions=4, probe_size=16, slices=2)
    with pytest.raises(ValueError, match="finite and > 0"):
        make_ground_truth(4, 16, slices=2, slice_spacing_m=-1e-4)
    assert not (tmp_path / "x").exists()


def test_cli_simulate_a_thick_sample(tmp_path):
    from beamflow.cli import app

    runner = CliRunner()
    args = ["--positions", "12", "--probe-size", "16", "--frames-per-file", "6", "--seed", "3"]
    res = runner.invoke(app, ["simulate", str(tmp_path), "--name", "thick", *args,
                              "--slices", "3", "--slice-spacing", "4e-4,2e-4"])
    assert res.exit_code == 0, res.output
    assert "3, 400, 200 µm apart" in res.output
    assert "--slices 3 --slice-spacing 0.0004,0.0002" in res.output
    gt = read_ground_truth(tmp_path / "thick")
    np.testing.assert_array_equal(gt.object_layer_spacing_m, [4e-4, 2e-4])
    for extra, message in (
        (["--slices", "2"], "2 slices need a slice spacing"),
        (["--slice-spacing", "4e-4"], "--slice-spacing needs --slices 2 or more"),
        (["--slices", "2", "--slice-spacing", "400um"], "not a number of metres"),
        (["--slices", "3", "--slice-spacing", "1e-4,2e-4,3e-4"], "3 slices need 2"),
        (["--slices", "2", "--slice-spacing", "0"], "finite and > 0"),
    ):
        bad = runner.invoke(app, ["simulate", str(tmp_path), "--name", "bad", *args, *extra])
        assert bad.exit_code == 2, (extra, bad.output)
        lines = bad.output.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (extra, lines)
    assert not (tmp_path / "bad").exists()
