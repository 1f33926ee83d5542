"""The multislice forward model (beamflow/ptycho/forward/multislice.py) and what the engine
does with layers: the model against an independent simulation, its adjoint, every
algorithm's updates, the GPU code path, and the state with layers.

The scans here are this file's own: two layers of smooth random features, a Gaussian probe
with a defocus curvature, a jittered raster, and the propagation between layers made on a
padded window (twice the frame, nothing wraps) with the exact angular spectrum — not the
engine's periodic frame-sized window.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest
from counting_cupy import installed
from engine_kit import straight_part_resumed, through_a_checkpoint
from pydantic import ValidationError

from beamflow.ptycho import (
    PtychoData,
    ReconParams,
    Reconstructor,
    array_backend,
    initial_state,
)
from beamflow.ptycho.forward.propagation import Propagation, transfer_function

M = 32
WAVELENGTH = 1.239842e-6 / 8800  # 8.8 keV
PIXEL = 58.7e-9
SPACING = 400e-6  # many depths of field (Δx²/λ = 24 µm)
GEOMETRY = Propagation(wavelength_m=WAVELENGTH, pixel_size_m=PIXEL)


def _smooth(rng: np.random.Generator, shape: tuple[int, int], width: float) -> np.ndarray:
    k = np.hypot(*np.meshgrid(np.fft.fftfreq(shape[0]), np.fft.fftfreq(shape[1]),
                              indexing="ij"))
    a = np.real(np.fft.ifft2(np.fft.fft2(rng.standard_normal(shape)) * np.exp(-(k * width) ** 2)))
    return a / a.std()


def thick_scan(n_side: int = 9, layers: int = 2, seed: int = 0,
               photons: float = 1e6) -> dict[str, Any]:
    """A far-field scan of ``layers`` layers SPACING apart (Poisson counts)."""
    rng = np.random.default_rng(seed)
    step = 5.0
    grid = np.stack(np.meshgrid(np.arange(n_side), np.arange(n_side), indexing="ij"), -1)
    pos = grid.reshape(-1, 2) * step + rng.uniform(-1.0, 1.0, (n_side * n_side, 2)) + 4
    h = w = int(pos.max()) + M + 6
    truth = np.stack([
        ((0.9 + 0.08 * np.tanh(_smooth(rng, (h, w), 4.0)))
         * np.exp(0.5j * np.tanh(_smooth(rng, (h, w), 3.0)))) for _ in range(layers)
    ]).astype(np.complex64)
    yy, xx = np.mgrid[:M, :M] - M / 2
    probe = np.exp(-(yy**2 + xx**2) / (2 * 5.0**2) + 0.03j * (yy**2 + xx**2))
    prop = transfer_function(2 * M, WAVELENGTH, SPACING, PIXEL)
    kf = np.fft.fftfreq(M)
    inten = np.zeros((len(pos), M, M))
    lo, hi = M // 2, M // 2 + M
    for j, (py, px) in enumerate(pos):
        ny, nx = int(np.rint(py)), int(np.rint(px))
        ramp = np.exp(-2j * np.pi * (kf[:, None] * (py - ny) + kf[None] * (px - nx)))
        wave = np.fft.ifft2(np.fft.fft2(probe) * ramp)
        for s in range(layers):
            wave = wave * truth[s, ny : ny + M, nx : nx + M]
            if s + 1 < layers:
                pad = np.zeros((2 * M, 2 * M), complex)
                pad[lo:hi, lo:hi] = wave
                wave = np.fft.ifft2(np.fft.fft2(pad) * prop)[lo:hi, lo:hi]
        inten[j] = np.abs(np.fft.fft2(wave)) ** 2
    scale = photons / inten.sum(axis=(1, 2)).mean()
    counts = rng.poisson(inten * scale).astype(np.float32)
    return {"intensities": np.fft.fftshift(counts, axes=(-2, -1)), "positions": pos,
            "shape": (h, w), "truth": truth, "probe": (probe * np.sqrt(scale)).astype(np.complex64)}


@pytest.fixture(scope="module")
def scan() -> dict[str, Any]:
    return thick_scan()


def data_of(scan: dict[str, Any]) -> PtychoData:
    return PtychoData(scan["intensities"], scan["positions"], scan["shape"])


def params(**kw: Any) -> ReconParams:
    kw.setdefault("slices", 2)
    kw.setdefault("slice_spacing_m", SPACING)
    return ReconParams(propagation=GEOMETRY, **kw)


def _frozen_loss(scan: dict[str, Any], obj: np.ndarray, slices: int) -> float:
    """The loss of ``obj`` with the true probe, nothing updated."""
    data = data_of(scan)
    p = params(slices=slices, object_update_start=9, probe_update_start=9,
               slice_spacing_m=SPACING if slices > 1 else None)
    state = initial_state(data, p, probe=scan["probe"], obj=obj)
    state.probe[:] = scan["probe"]  # as simulated, not rescaled
    with Reconstructor(data, state, array_backend("cpu", threads=1)) as rec:
        return rec.iterate()


def test_the_model_explains_a_thick_sample_that_one_layer_cannot(scan):
    """With the true layers the multislice model reaches the data's Poisson floor; the true
    projection in one layer, the thin model, stays well above it."""
    truth = scan["truth"]
    layered = _frozen_loss(scan, truth, 2)
    thin = _frozen_loss(scan, truth[0] * truth[1], 1)
    # the Poisson floor of the amplitude loss: ≈ (1/4 per pixel) · pixels / counts per frame
    floor = 0.25 * M * M / 1e6
    assert layered < 2.5 * floor
    assert thin > 5 * layered


def test_the_way_back_is_the_adjoint_of_the_way_forward(scan):
    """The layers' corrections are the chain rule's: for a linear functional of the last
    exit wave, Re⟨e_S, y⟩, a change δ of the first layer changes it by Re⟨δ, conj(ψ_1)·χ_1⟩,
    χ_1 the model's correction of the first layer brought back from y."""
    data = data_of(scan)
    rng = np.random.default_rng(5)
    with Reconstructor(data, initial_state(data, params(), obj=scan["truth"]),
                       array_backend("cpu", threads=1)) as rec:
        model, core = rec.algorithm.model, rec.core
        c = core.chunk(np.arange(4))

        def exit_wave() -> np.ndarray:
            w = model.forward(model.shifted_probe(c), c)
            return np.fft.ifft2(w.detector)  # far field: back to the last exit wave

        y = (rng.standard_normal((4, 1, M, M)) + 1j * rng.standard_normal((4, 1, M, M)))
        y = y.astype(np.complex64)
        w = model.forward(model.shifted_probe(c), c)
        chis = model.backward(w, y.copy(), c)
        base = exit_wave()
        delta = (1e-3 * (rng.standard_normal((M, M)) + 1j * rng.standard_normal((M, M))))
        iy, ix = c.iy[0], c.ix[0]
        core.obj[0, iy : iy + M, ix : ix + M] += delta.astype(np.complex64)
        changed = exit_wave()
        predicted = np.vdot(delta, np.conj(w.incident[0][0, 0]) * chis[0][0, 0]).real
        measured = np.vdot(changed[0, 0] - base[0, 0], y[0, 0]).real
    assert predicted == pytest.approx(measured, rel=2e-3)


@pytest.mark.parametrize("algorithm", ["rpie", "mpie", "epie", "lsqml"])
def test_every_pie_and_lsqml_engine_reconstructs_layers(scan, algorithm):
    """Every algorithm that models layers lowers the loss towards the thick sample's floor,
    below where the thin model can go."""
    data = data_of(scan)
    p = params(algorithm=algorithm, iterations=25)
    with Reconstructor(data, initial_state(data, p), array_backend("cpu")) as rec:
        out = rec.run()
    assert out.object.shape == (2,) + tuple(scan["shape"])
    thin_best = _frozen_loss(scan, scan["truth"][0] * scan["truth"][1], 1)
    assert out.loss_history[-1] < 0.6 * out.loss_history[0]
    assert out.loss_history[-1] < thin_best


@pytest.mark.parametrize("kw", [
    {},
    {"probe_modes": 2, "position_correction": True, "position_correction_start": 1},
    {"algorithm": "lsqml", "noise_model": "poisson", "opr_modes": 2},
    {"algorithm": "epie"},
    {"layer_regularization": 1.0, "batch_selection": "compact"},
], ids=["rpie", "modes-positions", "lsqml-poisson-opr", "epie-sparse", "regularised"])
def test_layers_on_the_gpu_code_path_are_the_cpus(scan, kw):
    """The GPU code path (the tests' CuPy stand-in: the fused kernels as their array code)
    gives the CPU's losses with layers."""
    data = data_of(scan)
    p = params(iterations=3, **kw)
    losses = []
    for gpu in (False, True):
        with (installed() if gpu else contextlib.nullcontext(array_backend("cpu", threads=1))
              ) as be, Reconstructor(data, initial_state(data, p), be) as rec:
            losses.append(rec.run().loss_history)
    np.testing.assert_allclose(losses[1], losses[0], rtol=2e-5)


def test_a_resumed_run_with_layers_continues_bit_for_bit(scan):
    """Four iterations in one go, or two, a state through its checkpoint arrays, and two
    more: the same layers, probe and losses, bit for bit (CPU)."""
    data = data_of(scan)
    p = params(algorithm="mpie", iterations=4, momentum_every=1, layer_regularization=0.5)
    whole, half, resumed = straight_part_resumed(data, p, 2, array_backend("cpu", threads=2))
    assert through_a_checkpoint(half).object.shape == (2,) + tuple(scan["shape"])
    np.testing.assert_array_equal(resumed.object, whole.object)
    np.testing.assert_array_equal(resumed.probe, whole.probe)
    assert resumed.loss_history == whole.loss_history


def test_layer_settings_are_checked_with_the_reason():
    with pytest.raises(ValidationError, match="does not model thick samples"):
        params(algorithm="dm")
    with pytest.raises(ValidationError, match="need a slice spacing"):
        ReconParams(slices=3, propagation=GEOMETRY)
    with pytest.raises(ValidationError, match="need 2 slice spacings"):
        params(slices=3, slice_spacing_m=[1e-4, 2e-4, 3e-4])
    with pytest.raises(ValidationError, match="finite and > 0"):
        params(slice_spacing_m=-1e-4)
    assert params(slices=3, slice_spacing_m=[1e-4, 2e-4]).slice_spacings == (1e-4, 2e-4)
    assert params(slices=3).slice_spacings == (SPACING, SPACING)


def test_a_state_and_its_settings_must_agree_on_the_layers(scan):
    data = data_of(scan)
    state = initial_state(data, params())
    state.params = ReconParams(propagation=GEOMETRY)
    with pytest.raises(ValueError, match="2 layer"):
        Reconstructor(data, state, "cpu")
    with pytest.raises(ValueError, match=r"expected \(3, "):
        initial_state(data, params(slices=3), obj=scan["truth"])
    bare = ReconParams(slices=2, slice_spacing_m=SPACING)  # no wavelength, no pixel size
    with pytest.raises(ValueError, match="wavelength_m and pixel_size_m"):
        Reconstructor(data, initial_state(data, bare), "cpu")
