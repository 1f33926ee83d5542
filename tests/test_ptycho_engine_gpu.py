"""The cupy path of the reconstruction engine agrees with numpy (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from test_ptycho_engine import DEVICE_SETUP_IDS, DEVICE_SETUPS, data_of, nrmse, region, simulate

from beamflow.ptycho import ReconParams, Reconstructor, array_backend, initial_state
from beamflow.ptycho.arrays import cuda_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs cupy and a visible CUDA device"),
]


@pytest.mark.parametrize("extra", DEVICE_SETUPS, ids=DEVICE_SETUP_IDS)
def test_cuda_matches_numpy(extra):
    sim = simulate()
    data = data_of(sim)
    params = ReconParams(iterations=6, **extra)
    out = {}
    for device in ("cpu", "cuda"):
        backend = array_backend(device, threads=1) if device == "cpu" else array_backend(device)
        with Reconstructor(data, initial_state(data, params), backend) as rec:
            out[device] = rec.run()
    cpu, gpu = out["cpu"], out["cuda"]
    assert array_backend("cuda").name.startswith("cuda:")
    assert isinstance(gpu.object, np.ndarray) and gpu.object.dtype == np.complex64
    # Same algorithm, same batches; only float32 rounding differs between the devices.
    np.testing.assert_allclose(gpu.loss_history, cpu.loss_history, rtol=2e-3)
    scale = np.abs(cpu.object).max()
    assert np.abs(gpu.object - cpu.object).max() < 2e-3 * scale
    assert np.abs(gpu.probe - cpu.probe).max() < 2e-3 * np.abs(cpu.probe).max()
    np.testing.assert_allclose(gpu.positions_px, cpu.positions_px, atol=1e-3)


def test_cuda_converges():
    sim = simulate()
    data = data_of(sim)
    params = ReconParams(algorithm="rpie", iterations=40)
    with Reconstructor(data, initial_state(data, params), "cuda") as rec:
        state = rec.run()
    assert state.loss_history[-1] < state.loss_history[0] / 10
    assert nrmse(state.object, sim["object"], region(sim)) < 0.1
