"""The device-only branches of the engine (flat-index gathers, fused kernels, device
copies, one chunk per batch), run on the CPU through a numpy stand-in for cupy.

These machines have no GPU, so `tests/ptycho/gpu/test_ptycho_engine_gpu.py` skips here. The stand-in
runs every `is_gpu` branch of `beamflow.ptycho` with numpy arrays: what it cannot check is
cupy itself (kernels, streams, memory), which the `gpu` tests do on a device.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import scipy.fft
from engine_kit import DEVICE_SETUP_IDS, DEVICE_SETUPS, data_of, simulate
from reference_kernels import ReferenceKernels

from beamflow.ptycho import ReconParams, Reconstructor, array_backend, initial_state
from beamflow.ptycho.algorithms import opr as opr_module
from beamflow.ptycho.arrays import ArrayBackend, ArrayBackendError


def _fake_cupy() -> types.SimpleNamespace:
    stream = types.SimpleNamespace(synchronize=lambda: None)
    return types.SimpleNamespace(
        ndarray=np.ndarray,
        # host <-> device always copies, as it does on a GPU
        asarray=lambda a, dtype=None: np.array(a, dtype=dtype),
        asnumpy=lambda a: np.array(a),
        iscomplexobj=np.iscomplexobj,
        float32=np.float32,
        cuda=types.SimpleNamespace(get_current_stream=lambda: stream),
    )


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> ArrayBackend:
    """An ArrayBackend that takes the GPU branches, on numpy. The variable probe learns from
    the first iteration, so that its device path runs within the short runs compared here."""
    monkeypatch.setattr(opr_module, "LEARNING_DELAY", 0)

    def fft2(a, axes=(-2, -1), overwrite_x=False, norm="backward"):
        return scipy.fft.fft2(a, axes=axes, overwrite_x=overwrite_x, norm=norm, workers=1)

    def ifft2(a, axes=(-2, -1), overwrite_x=False, norm="backward"):
        return scipy.fft.ifft2(a, axes=axes, overwrite_x=overwrite_x, norm=norm, workers=1)

    cupyx = types.ModuleType("cupyx")
    scipy_mod = types.ModuleType("cupyx.scipy")
    fft_mod = types.ModuleType("cupyx.scipy.fft")
    fft_mod.fft2, fft_mod.ifft2 = fft2, ifft2
    cupyx.scipy, scipy_mod.fft = scipy_mod, fft_mod
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setitem(sys.modules, "cupyx.scipy", scipy_mod)
    monkeypatch.setitem(sys.modules, "cupyx.scipy.fft", fft_mod)
    backend = ArrayBackend(name="cuda:0", xp=np, threads=1, kernels=ReferenceKernels(),
                           _cupy=_fake_cupy())
    assert backend.is_gpu
    return backend


def test_gather_and_window_writes_agree_with_the_cpu_path(device: ArrayBackend) -> None:
    rng = np.random.default_rng(3)
    cpu = array_backend("cpu", threads=1)
    m, iy, ix = 8, np.array([0, 3, 3, 10, 12]), np.array([1, 1, 9, 0, 12])
    obj = (rng.standard_normal((20, 21)) + 1j * rng.standard_normal((20, 21))).astype(
        np.complex64)
    patches = (rng.standard_normal((5, m, m)) + 1j * rng.standard_normal((5, m, m))).astype(
        np.complex64)
    np.testing.assert_array_equal(device.gather(obj, iy, ix, m), cpu.gather(obj, iy, ix, m))
    disjoint_y, disjoint_x = np.array([0, 10]), np.array([0, 10])
    a, b = obj.copy(), obj.copy()
    device.scatter_set(a, patches[:2], disjoint_y, disjoint_x)
    cpu.scatter_set(b, patches[:2], disjoint_y, disjoint_x)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ArrayBackendError, match="CPU's"):  # a GPU adds with its kernels
        device.scatter_add(a, patches, iy, ix)


@pytest.mark.parametrize("extra", DEVICE_SETUPS, ids=DEVICE_SETUP_IDS)
def test_device_path_matches_the_cpu_path(device: ArrayBackend, extra: dict) -> None:
    sim = simulate()
    params = ReconParams(iterations=6, **extra)
    out = {}
    # The CPU reference uses pocketfft, like the stand-in's FFTs: Poisson LSQ-ML amplifies
    # the rounding differences between FFT libraries (see test_cpu_fft_implementations_agree).
    cpu_backend = array_backend("cpu", threads=1, fft="pocketfft")
    for name, backend in (("cpu", cpu_backend), ("device", device)):
        data = data_of(sim, intensities=sim["intensities"].copy())
        # consume_data on a device copies the frames to it and must leave them alone
        with Reconstructor(data, initial_state(data, params), backend, consume_data=True) as rec:
            out[name] = rec.run()
    cpu, dev = out["cpu"], out["device"]
    assert isinstance(dev.object, np.ndarray) and dev.object.dtype == np.complex64
    # Same algorithm and batches; the chunking and summation order differ.
    np.testing.assert_allclose(dev.loss_history, cpu.loss_history, rtol=2e-3)
    assert np.abs(dev.object - cpu.object).max() < 2e-3 * np.abs(cpu.object).max()
    assert np.abs(dev.probe - cpu.probe).max() < 2e-3 * np.abs(cpu.probe).max()
    np.testing.assert_allclose(dev.positions_px, cpu.positions_px, atol=1e-3)
    if extra.get("opr_modes"):  # the weights' solves, gauge and power step on the device
        w_dev, w_cpu = dev.extras["opr_weights"], cpu.extras["opr_weights"]
        assert type(w_dev) is np.ndarray and np.abs(w_cpu[:, 1:]).max() > 1e-3
        assert np.abs(w_dev - w_cpu).max() < 2e-3 * np.abs(w_cpu).max()
        assert np.abs(dev.extras["opr_eigen_probes"] - cpu.extras["opr_eigen_probes"]).max() < (
            2e-3 * np.abs(cpu.extras["opr_eigen_probes"]).max())
