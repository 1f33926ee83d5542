"""The engine keeps a GPU busy: checked without one, on a counting stand-in for CuPy.

A GPU runs the engine's kernels from a queue; the host only enqueues them. Every read of a
device value on the host (``float()``, ``.item()``, a copy to the host) and every
synchronisation waits for the queue to drain, and a kernel launch costs ~5-10 µs of host
time whatever its size. So the speed of an iteration on a GPU rests on two properties that
numpy cannot show but this stand-in can:

* an iteration reads the device a fixed, small number of times (the loss, and the position
  steps when positions are corrected), not once per batch or chunk;
* the kernels launched per batch do not grow with the batch size (no per-position loops).

The stand-in (``tests/kits/counting_cupy.py``) is numpy memory behind the GPU code path of
:class:`ArrayBackend`: its arrays count element-wise and reduction kernels, fancy-index
gathers, FFTs and scatters, uploads, and every conversion to a host value. The launches per
batch of rPIE and LSQ-ML are also held under a ceiling: at 5-10 µs each they are a floor of
their own on a GPU (docs/performance.md, "Launches per batch").
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import numpy as np
import pytest
from counting_cupy import COUNTS, counting_backend, counting_modules
from engine_kit import data_of, simulate

from beamflow.ptycho import ReconParams, Reconstructor, initial_state
from beamflow.ptycho.accumulators import ObjectSteps
from beamflow.ptycho.algorithms import opr as opr_module
from beamflow.ptycho.arrays import ArrayBackend
from beamflow.ptycho.forward import Waves


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> ArrayBackend:
    for name, mod in counting_modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    # The variable probe learns from the first iteration, so that what it does on the device
    # is counted (the counts are per iteration, whatever the schedule).
    monkeypatch.setattr(opr_module, "LEARNING_DELAY", 0)
    return counting_backend()


def _reconstructor(backend: ArrayBackend, n: int = 64, **kw: Any) -> Reconstructor:
    data = data_of(simulate(n=n))
    params = ReconParams(iterations=10, **kw)
    return Reconstructor(data, initial_state(data, params), backend)


def _count_iteration(rec: Reconstructor) -> tuple[Counter[str], list[Counter[str]]]:
    """Counts over one iteration, and per batch."""
    per_batch: list[Counter[str]] = []
    run_batch = rec.algorithm.run_batch

    def counted(idx: np.ndarray, it: int) -> list[Any]:
        before = COUNTS.copy()
        out = run_batch(idx, it)
        per_batch.append(COUNTS - before)
        return out

    rec.algorithm.run_batch = counted  # type: ignore[method-assign]
    COUNTS.clear()
    rec.iterate()
    return COUNTS.copy(), per_batch


# Host reads per iteration: the loss, and the position steps when positions are corrected.
SETUPS = [
    ({"algorithm": "rpie"}, 1),
    ({"algorithm": "rpie", "batch_selection": "compact"}, 1),
    ({"algorithm": "rpie", "probe_modes": 2, "position_correction": True,
      "position_correction_start": 0}, 2),
    ({"algorithm": "epie"}, 1),
    ({"algorithm": "lsqml", "noise_model": "poisson"}, 1),
    ({"algorithm": "lsqml", "position_correction": True, "position_correction_start": 0}, 2),
    # DM re-centres its probe after every iteration: one more read.
    ({"algorithm": "dm"}, 2),
    ({"algorithm": "mpie", "momentum_every": 1}, 1),
    # The variable probe solves its weights' systems, the gauge and the eigen-probes' power
    # step on the device: no read of its own, per batch or per iteration.
    ({"algorithm": "rpie", "opr_modes": 3}, 1),
    ({"algorithm": "rpie", "opr_modes": 1}, 1),
    ({"algorithm": "lsqml", "opr_modes": 3, "probe_modes": 2}, 1),
]


@pytest.mark.parametrize("extra, reads", SETUPS,
                         ids=["rpie", "rpie-compact", "rpie-modes-poscorr", "epie", "lsqml",
                              "lsqml-poscorr", "dm", "mpie", "rpie-opr", "rpie-opr1",
                              "lsqml-opr-modes"])
def test_an_iteration_reads_the_device_a_fixed_number_of_times(device, extra, reads):
    with _reconstructor(device, **extra) as rec:
        rec.iterate()  # caches and plans of the first iteration
        total, per_batch = _count_iteration(rec)
    assert len(per_batch) >= 1
    assert all(b["read"] == 0 for b in per_batch), [b["read"] for b in per_batch]
    assert total["read"] == reads, total


@pytest.mark.parametrize("extra", [{"algorithm": "rpie"}, {"algorithm": "lsqml"},
                                   # every batch takes mPIE's momentum step, the same kernels
                                   {"algorithm": "mpie", "momentum_every": 1},
                                   {"algorithm": "rpie", "opr_modes": 3},
                                   {"algorithm": "lsqml", "opr_modes": 3}],
                         ids=["rpie", "lsqml", "mpie", "rpie-opr", "lsqml-opr"])
def test_kernels_per_batch_do_not_grow_with_the_batch(device, extra):
    launches, uploads = {}, {}
    for size in (8, 32):
        with _reconstructor(device, batch_size=size, batch_selection="random", **extra) as rec:
            rec.iterate()
            _, per_batch = _count_iteration(rec)
        assert len(per_batch) == 64 // size
        launches[size] = {b["launch"] for b in per_batch}
        uploads[size] = {b["upload"] for b in per_batch}
    # The same kernels for 8 positions as for 32: one chunk each, no loop over positions,
    # and one upload (the chunk's indices and corners together).
    assert launches[8] == launches[32], launches
    assert uploads[8] == uploads[32] == {1}, uploads


# Kernel launches per batch on the stand-in (one chunk per batch, 2026-11-25): rPIE was 90
# and LSQ-ML 158 before the launch cuts of docs/performance.md, 56 and 95 after their first
# round, 50 and 81 after the second, 30 and 39 with the fused kernels (kernels.py), 30 and
# 38 once the stand-in counted CuPy's scaling kernel after an inverse FFT (folded away) and
# no launch for ``empty_like``, 26 and 35 with the illumination in one kernel
# (intensity_sum) and rPIE's probe step added in its kernel, and 27 and 36 with the object
# update's maximum taken row by row (2026-11-26: the one-value reduction of the strided box
# ran on one block, 1 ms at 4000 x 128² on an H100), and 23 and 31 with the maximum taken by
# the scatter (a value per block of threads, then one reduction of those), the object step
# one kernel that clears the accumulator, LSQ-ML's direction made where it is read, and the
# probe terms' ramps and sum one kernel (2026-11-26, sixth session); a change that adds a
# launch to every batch fails here, and one that removes launches lowers the ceiling with it.
LAUNCH_CEILINGS = {"rpie": 23, "lsqml": 31}
# Device traffic per batch, in passes over the batch's (b, K, M, M) complex64 stack, counted
# by the stand-in (its docstring: what a memory-bound kernel reads and writes): rPIE 27.3,
# LSQ-ML 36.1 on this small scan (29.3 and 38.0 before the sixth session; object- and
# probe-sized work weighs more here than at 4000 x 128²). The object step is counted as if
# every pixel of the box were reached: the card skips the rest.
PASS_CEILINGS = {"rpie": 27.3, "lsqml": 36.1}


@pytest.mark.parametrize("algorithm", list(LAUNCH_CEILINGS))
def test_launches_per_batch_stay_under_their_ceiling(device, algorithm):
    with _reconstructor(device, algorithm=algorithm, batch_size=32,
                        batch_selection="random") as rec:
        rec.iterate()
        _, per_batch = _count_iteration(rec)
    launches = {b["launch"] for b in per_batch}
    assert len(per_batch) == 2 and rec.core.subpixel  # the sub-pixel path: the most kernels
    assert max(launches) <= LAUNCH_CEILINGS[algorithm], launches
    stack = 8 * 32 * rec.core.K * rec.core.M**2
    passes = [b["bytes"] / stack for b in per_batch]
    assert max(passes) <= PASS_CEILINGS[algorithm], passes


@pytest.mark.parametrize("algorithm", ["epie", "rpie", "lsqml", "dm"])
def test_no_iteration_reduces_a_strided_view_to_one_value(device, algorithm):
    """CuPy reduces a non-contiguous view to one value on a single block of threads (CUB,
    which spreads it over the card, takes contiguous input only): the object update's
    maximum over its box took 1 ms of an H100 per batch that way, three quarters of an
    rPIE iteration at 4000 x 128². The engine reduces such views along their rows first."""
    with _reconstructor(device, algorithm=algorithm) as rec:
        rec.iterate()
        COUNTS.clear()
        rec.iterate()
    assert COUNTS["launch"] > 0
    assert COUNTS["strided_reduce"] == 0


def test_epie_sparse_batches_cost_the_same_kernels_whatever_their_size(device):
    with _reconstructor(device, algorithm="epie") as rec:
        rec.iterate()
        _, per_batch = _count_iteration(rec)
        sizes = [len(b) for b in rec.algorithm.batches(np.random.default_rng(0))]
    assert max(sizes) > 1  # non-overlapping sets: several positions per launch sequence
    launches = {b["launch"] for b in per_batch}
    assert len(launches) == 1, [b["launch"] for b in per_batch]
    # ePIE launches its sequence once per set (168 sets at 4000 x 128²): 72 kernels before
    # the launch cuts, 46 after the first round, 42 after the second, 36 with the kernels,
    # 33 with the illumination kernel (2026-11-25, third session), 32 with the probe terms'
    # sum in one kernel (2026-11-26, sixth session).
    assert launches.pop() <= 32


@pytest.mark.parametrize("extra, memory", [
    ({"algorithm": "dm"}, {"dm_exit_waves"}),
    ({"algorithm": "rpie", "opr_modes": 3}, {"opr_eigen_probes", "opr_weights"}),
    ({"algorithm": "mpie", "momentum_every": 1},
     {"mpie_object_ref", "mpie_object_velocity", "mpie_probe_ref", "mpie_probe_velocity"}),
], ids=["dm", "rpie-opr", "mpie"])
def test_a_snapshot_reads_the_device_only_when_its_result_is_asked_for(device, extra, memory):
    """snapshot_async copies the object, the probe and the algorithm's memory device→device
    and returns without a host read (the job's loop goes on); .result() reads them, and gives
    the state as it was when the snapshot was taken, though iterations ran in between."""
    with _reconstructor(device, **extra) as rec:
        rec.iterate()
        expected = rec.snapshot()
        COUNTS.clear()
        pending = rec.snapshot_async()
        assert COUNTS["read"] == 0, COUNTS
        rec.iterate()  # changes every array the snapshot holds
        COUNTS.clear()
        got = pending.result()
        assert COUNTS["read"] == 2 + len(memory), COUNTS  # one read per device array
    assert memory <= set(got.extras)
    assert set(got.extras) == set(expected.extras)
    np.testing.assert_array_equal(got.object, expected.object)
    np.testing.assert_array_equal(got.probe, expected.probe)
    for k in expected.extras:
        assert type(got.extras[k]) is np.ndarray, k
        np.testing.assert_array_equal(got.extras[k], expected.extras[k], err_msg=k)


def test_the_stand_in_attributes_every_launch_to_an_engine_line(device):
    """bench_gpu.py --sites: every launch and byte of an iteration lands on the engine line
    that asked for it (the fused kernels on their callers), none unattributed."""
    from counting_cupy import by_site

    with _reconstructor(device, algorithm="lsqml") as rec:
        rec.iterate()
        COUNTS.clear()
        with by_site() as sites:
            rec.iterate()
    assert sum(n for n, _ in sites.values()) == COUNTS["launch"]
    assert sum(b for _, b in sites.values()) == COUNTS["bytes"]
    assert "?" not in sites and all(k.split(":")[0].endswith(".py") for k in sites)
    assert any(k.startswith("lsqml.py:") for k in sites)  # step_systems, on its caller


def test_the_stand_in_counts_what_it_should(device):
    """The counts that the tests above rely on are real: a read, an upload, a kernel."""
    COUNTS.clear()
    a = device.to_device(np.ones(4, np.float32))
    b = device.xp.sqrt(a) * 2
    assert COUNTS["upload"] == 1 and COUNTS["launch"] == 2 and COUNTS["read"] == 0
    assert float(b.sum()) == 8.0 and COUNTS["read"] == 1
    device.to_host(b)
    device.synchronize()
    assert COUNTS["read"] == 3



@pytest.mark.parametrize("n", [1, 2])
def test_lsqml_step_systems_are_the_normal_equations(n):
    """The CPU's step-length sums (the array code the step_systems kernel is checked
    against in tests/ptycho/gpu/test_gpu_kernels.py): Re Σ conj(d_s)·d_t and Re Σ conj(d_s)·χ."""
    from beamflow.ptycho.arrays.ops import step_system_sums

    rng = np.random.default_rng(3)

    def waves(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(
            np.complex64)

    dirs, chi = waves(5, n, 2, 16, 16), waves(5, 2, 16, 16)
    gram, rhs = step_system_sums(dirs, chi, np)
    assert gram.shape == (5, n, n) and rhs.shape == (5, n)
    want = np.einsum("bskyx,btkyx->bst", dirs.conj(), dirs).real
    np.testing.assert_allclose(gram, want, rtol=1e-4)
    np.testing.assert_allclose(rhs, np.einsum("bskyx,bkyx->bs", dirs.conj(), chi).real,
                               rtol=1e-4)


def test_device_ramp_factors_follow_the_positions(device):
    """A GPU keeps each position's two ramp factors (N, 2, M) on the device, not the
    (N, M, M) ramps, and the kernels make the ramps from them: with position correction the
    factors are remade as the positions move, and the losses are the CPU's, whose ramps are
    made from the positions directly."""
    from beamflow.ptycho import array_backend

    kw = {"algorithm": "rpie", "position_correction": True, "position_correction_start": 0}
    data = data_of(simulate(n=64))
    params = ReconParams(iterations=6, **kw)
    with Reconstructor(data, initial_state(data, params), device) as rec:
        core = rec.core
        assert core.subpixel and core._ramps.shape == (core.N, 2, core.M)
        gpu = rec.run().loss_history
        moved = np.abs(core.pos - core.nominal).max()
        factors = np.exp(-2j * np.pi * (core.frac[:, :, None] * core.kfreq)).astype(np.complex64)
        np.testing.assert_array_equal(device.to_host(core._ramps), factors)
    with Reconstructor(data, initial_state(data, params), array_backend("cpu", threads=1)) as rec:
        cpu = rec.run().loss_history
    assert moved > 0.01  # the positions (and their sub-pixel ramps) changed
    np.testing.assert_allclose(gpu, cpu, rtol=1e-5)


@pytest.mark.parametrize("modes, shifted", [(1, False), (2, True)], ids=["pie", "dm-modes"])
def test_gpu_object_terms_of_a_chunk_are_one_kernel(device, modes, shifted):
    """On a GPU a chunk's object numerators and illumination are made and added into the
    accumulator pair (two views of one buffer) by one fused kernel, and sum to what the
    array code gives: Σ_j conj(P_j)·χ_j and Σ_j |P_j|² (shifted probes, DM) or the probe
    intensity (PIE), window by window, bit for bit."""
    with _reconstructor(device, probe_modes=modes) as rec:
        core, be = rec.core, device
        assert core.subpixel
        c = core.chunk(np.arange(5, 29))
        rng = np.random.default_rng(1)
        shape = (len(c.idx), modes, core.M, core.M)
        chi = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
        model = rec.algorithm.model
        pd = model.shifted_probe(c)
        pd_h = be.to_host(pd).copy()
        inten_h = be.to_host(core.probe_intensity())
        acc = rec.algorithm.objects.accumulators(1)[0][0]
        acc.num[...] = 0
        acc.den[...] = 0
        chi_d = be.to_device(chi)
        COUNTS.clear()
        model.accumulate_object(acc, Waves([pd], [None], None), [chi_d], c, 0, keep=shifted,
                                exact=shifted)
        launches = COUNTS["launch"]
        num, den = be.to_host(acc.num), be.to_host(acc.den)
    assert launches == 1
    want_num = np.zeros(num.shape, np.complex64)
    want_den = np.zeros(den.shape, np.float32)
    terms = (pd_h.conj() * chi).sum(axis=1)
    illum = (np.square(pd_h.real) + np.square(pd_h.imag)).sum(axis=1) if shifted else (
        np.broadcast_to(inten_h, terms.shape))
    m = core.M
    for j, (y, x) in enumerate(zip(c.iy, c.ix, strict=True)):
        want_num[y : y + m, x : x + m] += terms[j]
        want_den[y : y + m, x : x + m] += illum[j]
    assert np.abs(want_num).max() > 0
    np.testing.assert_array_equal(num, want_num)
    np.testing.assert_array_equal(den, want_den)


@pytest.mark.parametrize("extra", [{"algorithm": "rpie"}, {"algorithm": "lsqml"},
                                   {"algorithm": "dm"}, {"algorithm": "epie"},
                                   {"algorithm": "rpie", "probe_modes": 2},
                                   {"algorithm": "lsqml", "noise_model": "poisson"}],
                         ids=["rpie", "lsqml", "dm", "epie", "rpie-modes", "lsqml-poisson"])
def test_the_gpu_code_path_reconstructs_as_the_cpu_does(device, extra):
    """The GPU code path — its fused kernels (here their numpy references), device ramps,
    batched sums — and the CPU's give the same losses up to float32 rounding."""
    from beamflow.ptycho import array_backend

    data = data_of(simulate(n=64))
    params = ReconParams(iterations=4, **extra)
    losses = []
    for backend in (device, array_backend("cpu", threads=1)):
        with Reconstructor(data, initial_state(data, params), backend) as rec:
            losses.append(rec.run().loss_history)
    np.testing.assert_allclose(losses[0], losses[1], rtol=2e-5)


def _near_field_scan() -> tuple[Any, Any]:
    """(PtychoData, Propagation) of a small simulated near-field scan."""
    from beamflow.ptycho import PtychoData
    from beamflow.simulate import detector_frames, make_near_field_ground_truth

    gt = make_near_field_ground_truth(positions=16, probe_size=32, photons=1e7, seed=1)
    frames = detector_frames(gt, 0, gt.n_positions, np.random.default_rng(5))
    data = PtychoData(intensities=frames.astype(np.float32), positions_px=gt.positions_px,
                      object_shape=gt.object.shape, mask=gt.mask)
    return data, gt.propagation


@pytest.mark.parametrize("algorithm", ["rpie", "lsqml", "dm"])
def test_the_gpu_code_path_reconstructs_near_field_scans_as_the_cpu_does(device, algorithm):
    """Near field: the propagator G_j = H·conj(r_j) and its adjoint, which a GPU makes from
    the ramp factors in a kernel, give the CPU's losses."""
    from beamflow.ptycho import array_backend

    data, propagation = _near_field_scan()
    params = ReconParams(algorithm=algorithm, iterations=4, propagation=propagation)
    losses = []
    for backend in (device, array_backend("cpu", threads=1)):
        with Reconstructor(data, initial_state(data, params), backend) as rec:
            assert rec.core.subpixel and rec.algorithm.model.detector.transfer is not None
            losses.append(rec.run().loss_history)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


@pytest.mark.parametrize("field", ["far", "near"])
@pytest.mark.parametrize("algorithm", ["rpie", "lsqml", "epie"])
def test_a_gpu_batch_folds_the_inverse_ffts_scale_into_its_kernels(device, algorithm, field):
    """CuPy scales an inverse FFT in a kernel of its own, a read and a write of the stack:
    the sweep's inverse FFTs take their 1/M² in the products before them instead (the
    modulus kernel, the propagator, the probe's conjugate), and give the CPU's losses."""
    from beamflow.ptycho import array_backend

    if field == "near":
        data, propagation = _near_field_scan()
        extra = {"propagation": propagation}
    else:
        data, extra = data_of(simulate(n=64)), {}
    params = ReconParams(algorithm=algorithm, iterations=3, **extra)
    with Reconstructor(data, initial_state(data, params), device) as rec:
        rec.iterate()
        totals, per_batch = _count_iteration(rec)
        rec.iterate()
        gpu = rec.snapshot().loss_history
    assert rec.core.subpixel and len(per_batch) > 1 and totals["launch"] > 0
    assert totals["fft_scale"] == 0, totals["fft_scale"]
    with Reconstructor(data, initial_state(data, params), array_backend("cpu", threads=1)) as rec:
        cpu = rec.run().loss_history
    np.testing.assert_allclose(gpu, cpu, rtol=2e-5)


def test_a_gpu_backend_without_its_kernels_is_refused():
    with pytest.raises(ValueError, match="fused kernels"):
        ArrayBackend(name="cuda:0", xp=np, _cupy=object())


class _Graphs:
    """Stands in for :class:`~beamflow.ptycho.gpu.graphs.BatchGraphs` on the counting stand-in:
    runs each batch's body as a capture would record it, and counts what the body does."""

    enabled = True

    def __init__(self) -> None:
        self.keys: list[Any] = []
        self.bodies: list[Counter[str]] = []

    def run(self, key: Any, body: Any) -> list[Any]:
        self.keys.append(key)
        before = COUNTS.copy()
        out = body()
        self.bodies.append(COUNTS - before)
        return out


@pytest.mark.parametrize("extra", [
    {"algorithm": "rpie"}, {"algorithm": "lsqml"}, {"algorithm": "epie"},
    {"algorithm": "lsqml", "noise_model": "poisson"}, {"algorithm": "rpie", "probe_modes": 2},
    {"algorithm": "epie", "batch_selection": "sparse"},
], ids=["rpie", "lsqml", "epie", "lsqml-poisson", "rpie-modes", "epie-sparse"])
def test_a_batch_bound_for_a_cuda_graph_reconstructs_as_an_unbound_one(device, extra):
    """What a CUDA graph replays (graphs.py): a batch bound to its device index buffer, swept
    over the whole object's box, gives the same numbers as the ordinary batch, and its body
    uploads, reads and calls cuBLAS not once (a graph would replay a stale upload; a capture
    refuses cuBLAS — the H100 showed it for the last two setups here); the keys of one
    iteration's batches are at most two (batches of ⌊N/b⌋ and ⌈N/b⌉ positions)."""
    kw = {"batch_size": 12, "batch_selection": "random", **extra}
    sparse = kw["batch_selection"] == "sparse"
    plain, bound = _reconstructor(device, n=62, **kw), _reconstructor(device, n=62, **kw)
    graphs = _Graphs()
    bound.algorithm.graphs = graphs  # type: ignore[assignment]
    bound.core.graphable = lambda b: True  # type: ignore[method-assign]
    for it in range(3):
        graphs.keys.clear()
        assert bound.iterate() == plain.iterate()
        if sparse:  # sets of non-overlapping windows, a key per set size
            assert len(graphs.keys) > 6 and len({k[0] for k in graphs.keys}) == len(
                set(graphs.keys)), it
        else:
            assert len(graphs.keys) == 6 and len(set(graphs.keys)) == 2, it
    for a, b in ((bound.core.obj, plain.core.obj), (bound.core.probe, plain.core.probe)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert all(c["upload"] == 0 and c["read"] == 0 and c["blas"] == 0 for c in graphs.bodies)
    assert all(c["launch"] > 0 for c in graphs.bodies)


@pytest.mark.parametrize("algorithm, selection", [("rpie", "random"), ("rpie", "compact"),
                                                  ("lsqml", "random"), ("mpie", "random")])
def test_a_gpu_batch_clears_the_object_accumulator_it_filled(device, algorithm, selection):
    """A GPU's object step adds the batch's sums to the object and clears them in the same
    pass, so no batch zeroes the object-sized accumulator before it (12 bytes a pixel of the
    object, every batch): after every batch the accumulator holds zeros and says so."""
    with _reconstructor(device, algorithm=algorithm, batch_size=16,
                        batch_selection=selection) as rec:
        run_batch = rec.algorithm.run_batch
        states = []

        def checked(idx: np.ndarray, it: int) -> list[Any]:
            out = run_batch(idx, it)
            acc = rec.algorithm.objects._acc[0][0]
            states.append((acc.clean, bool(np.asarray(acc.buffer).any())))
            return out

        rec.algorithm.run_batch = checked  # type: ignore[method-assign]
        COUNTS.clear()
        rec.iterate()
    assert len(states) >= 4 and all(s == (True, False) for s in states), states


def test_an_accumulator_left_dirty_is_zeroed_whole(device):
    """DM replaces the object from its sums and leaves them: the next batch zeroes the GPU
    accumulator whole, since a later step clears only its own box."""
    with _reconstructor(device, algorithm="dm") as rec:
        rec.iterate()
        acc = rec.algorithm.objects._acc[0][0]
        assert not acc.clean and np.asarray(acc.buffer).any()
        np.asarray(acc.buffer)[:] = 7.0  # what an earlier box left, anywhere
        ObjectSteps.start(acc, (slice(0, 4), slice(0, 4)))
        assert not np.asarray(acc.buffer).any() and acc.maxima == []
