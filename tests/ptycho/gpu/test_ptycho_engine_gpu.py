"""The cupy path of the reconstruction engine agrees with numpy (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_kit import DEVICE_SETUP_IDS, DEVICE_SETUPS, data_of, nrmse, region, simulate

from beamflow.ptycho import ReconParams, Reconstructor, array_backend, initial_state
from beamflow.ptycho.algorithms import opr as opr_module
from beamflow.ptycho.arrays import cuda_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs cupy and a visible CUDA device"),
]


@pytest.mark.parametrize("extra", DEVICE_SETUPS, ids=DEVICE_SETUP_IDS)
def test_cuda_matches_numpy(extra, monkeypatch):
    monkeypatch.setattr(opr_module, "LEARNING_DELAY", 0)  # OPR learns within the 6 iterations
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


def _waves(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


def test_fused_modulus_kernel_matches_the_plain_expression():
    backend = array_backend("cuda")
    rng = np.random.default_rng(1)
    shape = (6, 32, 32)
    psi = _waves(rng, *shape)
    counts = rng.poisson(4.0, shape).astype(np.uint16)
    mask = (rng.random(shape[1:]) > 0.1).astype(np.float32)
    eps = np.float32(1e-6)
    amp = np.sqrt(counts.astype(np.float32))
    d = (amp - np.abs(psi)) * mask
    expected = psi * (d / (np.abs(psi) + eps))
    # float32 amplitudes, or uint16 counts; the inverse FFT's 1/M² folded in, or not; the
    # frames as rows of a larger stack, or in order
    rows = np.array([5, 0, 3, 1, 4, 2], np.int64)
    for data, scale, order in ((amp, 1.0, None), (counts, 1.0, rows), (counts, 1 / 32**2, rows)):
        got = backend.to_device(psi)
        stack = data
        if order is not None:  # the stack holds data[j] at row order[j], among others
            stack = np.zeros((8,) + shape[1:], data.dtype)
            stack[order] = data
        loss = backend.kernels.modulus(got, backend.to_device(stack),
                                       None if order is None else backend.to_device(order),
                                       backend.to_device(mask), eps, scale)
        np.testing.assert_allclose(backend.to_host(got), expected * np.float32(scale),
                                   rtol=1e-5, atol=1e-6 * scale)
        assert float(loss) == pytest.approx(float((d.astype(np.float64) ** 2).sum()), rel=1e-5)


@pytest.mark.parametrize("modes, shared_probe, exact",
                         [(1, False, False), (1, True, False), (3, False, False),
                          (2, False, True)])
def test_object_terms_kernel_adds_what_the_array_code_adds(modes, shared_probe, exact):
    """The kernel itself on the card (tests/ptycho/gpu/test_gpu_kernels.py runs its source on
    the CPU)."""
    backend = array_backend("cuda")
    rng = np.random.default_rng(7)
    b, m, h, w = 40, 32, 150, 161
    iy, ix = rng.integers(0, h - m + 1, b), rng.integers(0, w - m + 1, b)
    pd, chi = _waves(rng, 1 if shared_probe else b, modes, m, m), _waves(rng, b, modes, m, m)
    inten = rng.random((m, m)).astype(np.float32)
    buf, num, den = backend.stacked_pair((h, w), zeroed=True)
    most = backend.kernels.object_terms(buf, backend.to_device(pd), backend.to_device(chi),
                                        None if exact else backend.to_device(inten),
                                        backend.to_device((iy * w + ix).astype(np.int64)), h,
                                        w, maxima=True)
    terms = np.broadcast_to((np.conj(pd) * chi).sum(axis=1), (b, m, m))
    illum = np.broadcast_to((np.square(pd.real) + np.square(pd.imag)).sum(axis=1) if exact
                            else inten, (b, m, m))
    want_num = np.zeros((h, w), np.complex64)
    want_den = np.zeros((h, w), np.float32)
    for j in range(b):
        want_num[iy[j] : iy[j] + m, ix[j] : ix[j] + m] += terms[j]
        want_den[iy[j] : iy[j] + m, ix[j] : ix[j] + m] += illum[j]
    np.testing.assert_allclose(backend.to_host(num), want_num, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(backend.to_host(den), want_den, rtol=1e-5, atol=1e-5)
    # the maximum the adds took on the way is the accumulator's own, to the bit
    assert float(most.max()) == float(den.max())


def _ramps(rng, b, m):
    """Random sub-pixel ramps of ``b`` positions: their (b, 2, M) factors, as a GPU keeps
    them, and the (b, M, M) ramps they make."""
    e = np.exp(-2j * np.pi * rng.uniform(-0.5, 0.5, (b, 2, 1)) * np.fft.fftfreq(m)).astype(
        np.complex64)
    return e, e[:, 0, :, None] * e[:, 1, None, :]


def _accumulator(backend, rng, h, w, reached):
    """An accumulator pair holding a batch's sums where ``reached`` (zeros elsewhere), and
    its largest denominator (a 0-d float32 on the device)."""
    num = np.where(reached, _waves(rng, h, w), 0).astype(np.complex64)
    den = np.where(reached, rng.random((h, w)) + 0.1, 0).astype(np.float32)
    buf, dnum, dden = backend.stacked_pair((h, w))
    dnum[...] = backend.to_device(num)
    dden[...] = backend.to_device(den)
    top = backend.to_device(np.float32(den.max()))
    return num, den, buf, top


@pytest.mark.parametrize("lsqml", [False, True], ids=["rpie", "lsqml"])
def test_apply_step_kernel_adds_the_array_codes_step_and_clears_the_pair(lsqml):
    """rPIE's step (and LSQ-ML's, times its step length on the device) over a box of the
    object from the accumulator pair; the pair is all zeros after, the object outside the
    box and where no window reached is untouched."""
    backend = array_backend("cuda")
    rng = np.random.default_rng(8)
    h, w = 150, 161
    reached = np.zeros((h, w), bool)
    reached[20:90, 30:120] = True
    reached[60:140, 100:150] = True
    num, den, buf, top = _accumulator(backend, rng, h, w, reached)
    obj = _waves(rng, h, w)
    a = 0.1
    c_den, c_max = (1.0, a) if lsqml else (1 - a, a)
    step = np.float32(0.7)
    box = (slice(10, 145), slice(25, 155))
    want = obj.copy()
    want[box] += ((step if lsqml else 1) * num / (c_den * den + c_max * den.max()))[box]
    do = backend.to_device(obj)
    backend.kernels.apply_step(do, buf, top, box, c_den, c_max,
                               backend.to_device(step) if lsqml else None)
    np.testing.assert_allclose(backend.to_host(do), want, rtol=1e-5, atol=1e-6)
    assert not backend.to_host(buf).any()
    got = backend.to_host(do)
    np.testing.assert_array_equal(got[~reached], obj[~reached])


@pytest.mark.parametrize("ramps", [True, False], ids=["ramps", "plain"])
def test_position_sum_kernel_sums_the_array_codes_terms(ramps):
    backend = array_backend("cuda")
    rng = np.random.default_rng(12)
    b, m, modes = 37, 64, 2
    e, r = _ramps(rng, b, m)
    a = _waves(rng, b, modes, m, m)
    before = _waves(rng, modes, m, m)
    want = before + ((r[:, None] * a) if ramps else a).sum(axis=0)
    out = backend.to_device(before)
    backend.kernels.position_sum(backend.to_device(e) if ramps else None,
                                 backend.to_device(a), out)
    np.testing.assert_allclose(backend.to_host(out), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("upd_obj, upd_probe", [(True, True), (True, False), (False, True)])
def test_step_systems_kernel_sums_what_the_array_code_sums(upd_obj, upd_probe):
    """LSQ-ML's step-length systems on the card against numpy's array code."""
    from beamflow.ptycho.algorithms.lsqml import _systems

    backend = array_backend("cuda")
    rng = np.random.default_rng(11)
    b, m, h, w, modes, alpha = 30, 32, 120, 131, 2, 0.1
    iy, ix = rng.integers(0, h - m + 1, b), rng.integers(0, w - m + 1, b)
    pd, sp = _waves(rng, b, modes, m, m), _waves(rng, b, modes, m, m)
    oj, chi = _waves(rng, b, m, m), _waves(rng, b, modes, m, m)
    num, den, buf, top = _accumulator(backend, rng, h, w, np.ones((h, w), bool))
    d_obj = num / (den + alpha * den.max())  # LSQ-ML's object direction
    dev = backend.to_device
    got = backend.to_host(backend.kernels.step_systems(
        dev(pd), buf if upd_obj else None, top if upd_obj else None, alpha,
        dev((iy * w + ix).astype(np.int64)), dev(oj), dev(sp) if upd_probe else None,
        dev(chi), h, w))
    patches = np.stack([d_obj[y : y + m, x : x + m] for y, x in zip(iy, ix, strict=True)])
    d0 = pd * patches[:, None] if upd_obj else np.zeros_like(chi)
    d1 = oj[:, None] * sp if upd_probe else np.zeros_like(chi)
    gram, rhs = _systems(np.ascontiguousarray(np.stack([d0, d1], axis=1)), chi, np)
    want = np.stack([gram[:, 0, 0], gram[:, 0, 1], gram[:, 1, 1], rhs[:, 0], rhs[:, 1]], 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("modes, shared_probe", [(1, False), (1, True), (3, False)])
def test_exit_wave_kernel_matches_the_array_code(modes, shared_probe):
    backend = array_backend("cuda")
    rng = np.random.default_rng(5)
    b, m, h, w = 40, 32, 150, 161
    iy, ix = rng.integers(0, h - m + 1, b), rng.integers(0, w - m + 1, b)
    obj, pd = _waves(rng, h, w), _waves(rng, 1 if shared_probe else b, modes, m, m)
    oj, psi = backend.kernels.exit_wave(backend.to_device(obj),
                                        backend.to_device((iy * w + ix).astype(np.int64)),
                                        backend.to_device(pd))
    want = np.stack([obj[y : y + m, x : x + m] for y, x in zip(iy, ix, strict=True)])
    np.testing.assert_array_equal(backend.to_host(oj), want)
    np.testing.assert_allclose(backend.to_host(psi), pd * want[:, None], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("conj", [False, True])
def test_ramp_product_kernel_matches_the_array_code(conj):
    backend = array_backend("cuda")
    rng = np.random.default_rng(2)
    b, m, modes = 9, 64, 2
    e, r = _ramps(rng, b, m)
    a = _waves(rng, b, modes, m, m)
    want = (np.conj(r) if conj else r)[:, None] * a
    got = backend.kernels.ramp_product(backend.to_device(e), backend.to_device(a), conj=conj)
    np.testing.assert_allclose(backend.to_host(got), want, rtol=1e-5, atol=1e-6)


def test_preconditioned_step_kernel_matches_the_array_code():
    """rPIE's step on a strided box of the accumulators, with a 0-d device maximum."""
    backend = array_backend("cuda")
    rng = np.random.default_rng(4)
    num, den = _waves(rng, 50, 60), rng.random((50, 60)).astype(np.float32)
    a = 0.1
    want = num[5:40, 7:50] / ((1 - a) * den[5:40, 7:50] + a * den.max())
    dn, dd = backend.to_device(num), backend.to_device(den)
    box = dn[5:40, 7:50]
    backend.kernels.preconditioned_step(box, dd[5:40, 7:50], dd.max(), 1 - a, a)
    np.testing.assert_allclose(backend.to_host(box), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(backend.to_host(dn)[:5], num[:5])  # outside the box
    # added into the object's box instead (rPIE's update), and LSQ-ML's scaled direction
    obj = _waves(rng, 50, 60)
    do = backend.to_device(obj)
    backend.kernels.preconditioned_step(backend.to_device(num)[5:40, 7:50], dd[5:40, 7:50],
                                        dd.max(), 1 - a, a, into=do[5:40, 7:50])
    np.testing.assert_allclose(backend.to_host(do)[5:40, 7:50], obj[5:40, 7:50] + want,
                               rtol=1e-5, atol=1e-5)
    backend.kernels.axpy(do[5:40, 7:50], backend.to_device(np.float32(0.5)), box)
    np.testing.assert_allclose(backend.to_host(do)[5:40, 7:50],
                               obj[5:40, 7:50] + want + 0.5 * want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(backend.to_host(do)[:5], obj[:5])


@pytest.mark.parametrize("both", [True, False])
def test_step_lengths_kernel_matches_the_array_code(both):
    import types

    from beamflow.ptycho.algorithms.lsqml import LSQML

    backend = array_backend("cuda")
    tot = np.array([4.0, 1.0, 3.0, 2.0, -1.5])
    got = backend.to_host(backend.kernels.step_lengths(backend.to_device(tot), both, 0.9))
    alg = LSQML.__new__(LSQML)
    alg.params = ReconParams(algorithm="lsqml")
    alg.core = types.SimpleNamespace(backend=array_backend("cpu", threads=1), xp=np)
    np.testing.assert_allclose(got, alg._step_lengths(tot, both), rtol=1e-6)


def test_intensity_sum_kernel_matches_the_array_code():
    backend = array_backend("cuda")
    rng = np.random.default_rng(4)
    oj = _waves(rng, 37, 48, 48)
    before = rng.random((48, 48)).astype(np.float32)
    out = backend.to_device(before)
    backend.kernels.intensity_sum(backend.to_device(oj), out)
    want = before + (np.abs(oj.astype(np.complex128)) ** 2).sum(axis=0)
    np.testing.assert_allclose(backend.to_host(out), want, rtol=1e-5)


def test_conj_product_kernel_matches_the_array_code():
    backend = array_backend("cuda")
    rng = np.random.default_rng(3)
    oj, chi = _waves(rng, 7, 1, 32, 32), _waves(rng, 7, 3, 32, 32)
    want = np.conj(chi) * oj
    x = backend.to_device(chi)
    backend.kernels.conj_product(backend.to_device(oj), x, x)  # in place, modes broadcast
    np.testing.assert_allclose(backend.to_host(x), want, rtol=1e-5, atol=1e-6)


def test_cuda_streams_frames_and_snapshots_without_changing_the_result():
    import dataclasses

    sim = simulate()
    params = ReconParams(iterations=4, algorithm="rpie")
    cuda = array_backend("cuda")
    runs = {}
    for name, backend in (("resident", cuda),
                          ("streamed", dataclasses.replace(cuda, memory_limit_bytes=2 * 2**20))):
        data = data_of(sim)
        with Reconstructor(data, initial_state(data, params), backend) as rec:
            runs[name] = rec.run()
            assert rec.core.frames.resident == (name == "resident")
            pending = rec.snapshot_async()
            rec.iterate()
            assert pending.result().iteration == 4
    np.testing.assert_allclose(runs["streamed"].loss_history, runs["resident"].loss_history,
                               rtol=1e-4)


@pytest.mark.parametrize("extra", [
    {"algorithm": "rpie"},
    {"algorithm": "lsqml"},
    {"algorithm": "lsqml", "noise_model": "poisson"},
    # two modes; the probe fixed for two iterations, then updated: new graphs mid-run
    {"algorithm": "rpie", "probe_modes": 2, "probe_update_start": 2},
], ids=["rpie", "lsqml", "lsqml-poisson", "rpie-modes-probe-start"])
def test_cuda_graphs_replay_the_batches_as_python_launches_them(extra):
    """graphs.py: the batches replayed from CUDA graphs reconstruct as the same batches
    launched from Python (float atomics add in another order: not bit for bit)."""
    sim = simulate(n=62)
    data = data_of(sim)
    # 4 random batches an iteration: 16, 16, 15 and 15 positions (two graphs)
    params = ReconParams(iterations=6, batch_size=16, batch_selection="random", **extra)
    out, graphs, held = {}, None, 0
    for on in (False, True):
        with Reconstructor(data, initial_state(data, params),
                           array_backend("cuda", graphs=on)) as rec:
            out[on] = rec.run()
            if on:
                graphs = rec.algorithm.graphs
                assert graphs is not None and graphs.enabled  # no capture failed
                held = len(graphs._blocks)
    assert graphs.captures >= 2 and graphs.replays >= 12
    # the graphs' temporaries came from their own pool, given back when the run closed
    assert held > 0 and graphs._blocks == [] and not graphs.enabled
    np.testing.assert_allclose(out[True].loss_history, out[False].loss_history, rtol=1e-4)
    scale = np.abs(out[False].object).max()
    assert np.abs(out[True].object - out[False].object).max() < 1e-4 * scale
    assert (np.abs(out[True].probe - out[False].probe).max()
            < 1e-4 * np.abs(out[False].probe).max())
