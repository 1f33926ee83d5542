"""Tests of the reconstruction engine (beamflow.ptycho core): convergence of every algorithm,
exact sub-pixel positions, masked pixels, probe modes, parameters, bit-identical resume.

The scans are small (32x32 px frames, 50-80 positions), simulated by the engine kit
(tests/kits/engine_kit.py) with a forward model of its own.
"""

from __future__ import annotations

import numpy as np
import pydantic
import pytest
from engine_kit import (
    M,
    data_of,
    make_probe,
    nrmse,
    reconstruct,
    region,
    simulate,
    straight_part_resumed,
)

from beamflow.ptycho import PtychoData, ReconParams, ReconState, Reconstructor, initial_state
from beamflow.ptycho.algorithms.batches import overlap_neighbours, sparse_batches
from beamflow.ptycho.arrays import ArrayBackendError, array_backend, cpu_ffts
from beamflow.ptycho.engine import counter_rng
from beamflow.ptycho.forward import Waves
from beamflow.ptycho.modes import orthogonalize_modes


@pytest.fixture(scope="module")
def scan():
    return simulate()


# ------------------------------------------------------------------------------------------
# convergence
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("algorithm", "extra", "iterations", "bound"),
    [
        ("epie", {}, 40, 0.12),
        ("rpie", {}, 40, 0.10),
        ("dm", {}, 40, 0.15),
        ("lsqml", {}, 40, 0.10),
        ("lsqml", {"noise_model": "poisson"}, 40, 0.10),
    ],
)
def test_algorithm_converges(scan, algorithm, extra, iterations, bound):
    data = data_of(scan)
    state = reconstruct(data, iterations, algorithm=algorithm, **extra)
    loss = state.loss_history
    assert len(loss) == iterations and state.iteration == iterations
    assert loss[-1] < loss[0] / 10, f"{algorithm}: loss {loss[0]:.3g} -> {loss[-1]:.3g}"
    err = nrmse(state.object, scan["object"], region(scan))
    assert err < bound, f"{algorithm}: object NRMSE {err:.3f} >= {bound}"
    assert state.object.dtype == np.complex64 and state.probe.dtype == np.complex64


def test_subpixel_positions_matter():
    sim = simulate(photons=1e8, poisson=False)
    exact = reconstruct(data_of(sim), 40, algorithm="rpie")
    rounded = reconstruct(data_of(sim, positions=np.round(sim["positions"])), 40,
                          algorithm="rpie")
    where = region(sim)
    e_exact = nrmse(exact.object, sim["object"], where)
    e_round = nrmse(rounded.object, sim["object"], where)
    assert e_exact < 0.6 * e_round, (e_exact, e_round)
    assert exact.loss_history[-1] < 0.5 * rounded.loss_history[-1]


def test_masked_pixels_are_free(scan):
    rng = np.random.default_rng(3)
    mask = rng.random((M, M)) > 0.1
    mask[M // 2 - 2 : M // 2 + 2, M // 2 - 2 : M // 2 + 2] = False  # a beam stop on the DC
    garbage = scan["intensities"].copy()
    garbage[:, ~mask] = rng.uniform(0, 1e9, (garbage.shape[0], int((~mask).sum())))
    other = garbage.copy()
    other[:, ~mask] = np.nan  # invalid pixels may hold anything, NaN included
    a = reconstruct(data_of(scan, mask=mask, intensities=garbage), 40, algorithm="rpie",
                    batch_size=4)
    b = reconstruct(data_of(scan, mask=mask, intensities=other), 40, algorithm="rpie",
                    batch_size=4)
    np.testing.assert_array_equal(a.object, b.object)  # masked values are never read
    assert a.loss_history[-1] < a.loss_history[0] / 10
    assert nrmse(a.object, scan["object"], region(scan)) < 0.12


def test_two_probe_modes():
    p1 = make_probe()
    p2 = make_probe(defocus=-8.0, width=4.0)
    p2 = p2 - np.vdot(p1, p2) / np.vdot(p1, p1) * p1  # an incoherent, orthogonal 2nd mode
    p2 *= np.sqrt(0.35 * (np.abs(p1) ** 2).sum() / (np.abs(p2) ** 2).sum())
    sim = simulate(modes=np.stack([p1, p2]), n=70, photons=1e7)
    data = data_of(sim)
    one = reconstruct(data, 50, algorithm="rpie", probe_modes=1, batch_size=4)
    two = reconstruct(data, 50, algorithm="rpie", probe_modes=2, batch_size=4)
    assert two.probe.shape == (2, M, M)
    assert two.loss_history[-1] < 0.5 * one.loss_history[-1]
    assert nrmse(two.object, sim["object"], region(sim)) < 0.12
    powers = (np.abs(two.probe) ** 2).sum(axis=(1, 2))
    assert powers[0] > powers[1] > 0.1 * powers[0]  # ordered by power, second mode found
    overlap = abs(np.vdot(two.probe[0], two.probe[1])) / np.prod(np.sqrt(powers))
    assert overlap < 1e-3  # orthogonal


@pytest.mark.parametrize("algorithm", ["rpie", "lsqml", "dm"])
def test_position_correction_reduces_position_errors(algorithm):
    sim = simulate(n=70, photons=1e7)
    rng = np.random.default_rng(5)
    err0 = rng.uniform(-1.2, 1.2, sim["positions"].shape)
    err0 -= err0.mean(axis=0)  # a pure translation is invisible; errors have zero mean
    data = data_of(sim, positions=sim["positions"] + err0)
    state = reconstruct(data, 60, algorithm=algorithm, position_correction=True,
                        position_correction_start=5)
    err1 = state.positions_px - sim["positions"]
    err1 -= err1.mean(axis=0)
    rms0, rms1 = np.sqrt((err0**2).mean()), np.sqrt((err1**2).mean())
    assert rms1 < 0.5 * rms0, (rms0, rms1)


# ------------------------------------------------------------------------------------------
# continuation
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra",
    [
        {"algorithm": "rpie"},
        {"algorithm": "epie"},
        {"algorithm": "dm", "probe_modes": 2},
        {"algorithm": "lsqml", "noise_model": "poisson"},
        {"algorithm": "rpie", "probe_modes": 2, "position_correction": True,
         "position_correction_start": 2, "probe_update_start": 1, "orthogonalize_every": 2},
    ],
    ids=["rpie", "epie", "dm-2modes", "lsqml-poisson", "rpie-modes-poscorr"],
)
def test_resume_is_bit_identical(scan, extra):
    data = data_of(scan)
    params = ReconParams(iterations=8, **extra)
    straight, _, resumed = straight_part_resumed(data, params, 3)
    assert resumed.iteration == straight.iteration == 8
    np.testing.assert_array_equal(resumed.object, straight.object)
    np.testing.assert_array_equal(resumed.probe, straight.probe)
    np.testing.assert_array_equal(resumed.positions_px, straight.positions_px)
    assert resumed.loss_history == straight.loss_history
    assert resumed.rng_counter == straight.rng_counter
    for k in straight.extras:
        np.testing.assert_array_equal(resumed.extras[k], straight.extras[k])


@pytest.mark.parametrize("algorithm", ["rpie", "dm"])
def test_append_frames_and_continue(scan, algorithm):
    full = data_of(scan)
    first = PtychoData(full.intensities[:40], full.positions_px[:40], full.object_shape)
    params = ReconParams(algorithm=algorithm, iterations=10)
    with Reconstructor(first, initial_state(first, params), "cpu") as rec:
        state = rec.run()
    more = first.append(full.intensities[40:], full.positions_px[40:])
    assert more.n_positions == full.n_positions
    with pytest.raises(ValueError, match="extend_positions"):
        Reconstructor(more, state, "cpu")
    state.extend_positions(full.positions_px[40:])
    np.testing.assert_array_equal(state.positions_px[40:], full.positions_px[40:])
    state.params = state.params.model_copy(update={"iterations": 30})
    with Reconstructor(more, state, "cpu") as rec:
        final = rec.run()
    assert final.iteration == 30 and len(final.loss_history) == 30
    assert final.loss_history[-1] < final.loss_history[10]
    if algorithm == "dm":
        assert final.extras["dm_exit_waves"].shape[0] == full.n_positions
    assert nrmse(final.object, scan["object"], region(scan)) < 0.15


def test_callback_snapshot_and_stop(scan):
    data = data_of(scan)
    seen = []

    def cb(view, info):
        assert set(info) >= {"iteration", "loss", "seconds"}
        snap = view.snapshot()
        assert snap.iteration == info["iteration"] == view.iteration
        assert snap.loss_history[-1] == info["loss"]
        seen.append(info["iteration"])
        if info["iteration"] == 4:
            view.stop()

    params = ReconParams(algorithm="rpie", iterations=10)
    with Reconstructor(data, initial_state(data, params), "cpu") as rec:
        state = rec.run(callback=cb)
    assert seen == [1, 2, 3, 4] and state.iteration == 4


# ------------------------------------------------------------------------------------------
# parameters, inputs, helpers
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"algorithm": "pie"}, "algorithm"),
        ({"iterations": -1}, "iterations"),
        ({"batch_size": 0}, "batch_size"),
        ({"probe_modes": 0}, "probe_modes"),
        ({"algorithm": "rpie", "alpha": 1.5}, "alpha=1.5 is out of range for algorithm 'rpie'"),
        ({"algorithm": "epie", "beta": 0.0}, "beta=0.0 is out of range"),
        ({"algorithm": "dm", "alpha": float("nan")}, "alpha=nan"),
        ({"algorithm": "rpie", "noise_model": "poisson"}, "only implemented by algorithm"),
        ({"algorithm": "dm", "batch_selection": "sparse"}, "does not apply to 'dm'"),
        ({"orthogonalize_every": 0}, "orthogonalize_every"),
        ({"colour": 3}, "colour"),
    ],
)
def test_bad_parameters_fail_clearly(kwargs, needle):
    with pytest.raises(pydantic.ValidationError, match=needle):
        ReconParams(**kwargs)


def test_bad_data_fails_clearly(scan):
    inten, pos, shape = scan["intensities"], scan["positions"], scan["shape"]
    with pytest.raises(ValueError, match="positions_px: expected shape"):
        PtychoData(inten, pos[:-1], shape)
    with pytest.raises(ValueError, match="outside the"):
        PtychoData(inten, pos + shape[0], shape)
    bad = inten.copy()
    bad[3, 5, 5] = np.nan
    with pytest.raises(ValueError, match="non-finite value .* frame 3"):
        PtychoData(bad, pos, shape)
    with pytest.raises(ValueError, match="mask: expected shape"):
        PtychoData(inten, pos, shape, mask=np.ones((M + 1, M), bool))
    with pytest.raises(ValueError, match="negative value"):
        PtychoData(-inten - 1, pos, shape)
    data = data_of(scan)
    params = ReconParams(probe_modes=2)
    with pytest.raises(ValueError, match="probe has shape"):
        initial_state(data, params, probe=np.ones((M + 2, M + 2), np.complex64))
    state = initial_state(data, params)
    state.params = ReconParams(probe_modes=1)
    with pytest.raises(ValueError, match="probe_modes"):
        Reconstructor(data, state, "cpu")
    state.params = ReconParams(probe_modes=2)
    state.params = state.params.model_copy(update={"alpha": 7.0})  # skips validation
    with pytest.raises(pydantic.ValidationError, match="alpha=7.0 is out of range"):
        Reconstructor(data, state, "cpu")
    with pytest.raises(ValueError, match="meta 'format'"):
        ReconState.from_arrays(state.to_host_arrays(), {"format": "other"})
    meta = state.meta()
    arrays = state.to_host_arrays()
    del arrays["probe"]
    with pytest.raises(ValueError, match="array 'probe' is missing"):
        ReconState.from_arrays(arrays, meta)


def test_backend_selection(monkeypatch):
    cpu = array_backend("cpu")
    assert cpu.name == "cpu" and cpu.xp is np and cpu.threads >= 1
    with pytest.raises(ArrayBackendError, match="unknown device"):
        array_backend("tpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    # "auto" falls back to the CPU when no device is visible; "cuda" says why it cannot.
    from beamflow.ptycho import arrays as bmod

    if not bmod.cuda_available():
        assert array_backend("auto").name == "cpu"
        with pytest.raises(ArrayBackendError, match="cuda"):
            array_backend("cuda")


def test_gather_and_scatter_match_naive():
    """The CPU scatter adds overlapping patches exactly like a naive loop, in patch order,
    for complex and real accumulators, broadcast patches and a trailing axis."""
    be = array_backend("cpu")
    rng = np.random.default_rng(0)
    obj = (rng.random((50, 60)) + 1j * rng.random((50, 60))).astype(np.complex64)
    iy, ix = rng.integers(0, 50 - 8, 20), rng.integers(0, 60 - 8, 20)
    patches = be.gather(obj, iy, ix, 8)
    for j in range(20):
        np.testing.assert_array_equal(patches[j], obj[iy[j] : iy[j] + 8, ix[j] : ix[j] + 8])
    real = rng.random((8, 8)).astype(np.float32)
    tail = rng.random((20, 8, 8, 3)).astype(np.float32)
    cases = [(obj, patches), (obj.real.copy(), np.broadcast_to(real, (20, 8, 8))),
             (np.zeros((50, 60, 3), np.float32), tail)]
    for start, add in cases:
        acc = start.copy()
        be.scatter_add(acc, add, iy, ix)
        ref = start.copy()
        for j in range(20):
            ref[iy[j] : iy[j] + 8, ix[j] : ix[j] + 8] += add[j]
        np.testing.assert_array_equal(acc, ref)


@pytest.mark.parametrize("fft", cpu_ffts())
@pytest.mark.parametrize("modes", [1, 2])
def test_shifted_probe_and_probe_adjoint_match_naive(scan, fft, modes):
    """The forward sub-pixel shift S_j P = F⁻¹[F[P]·exp(−2πi k·δ_j)] and the probe update's
    adjoint Σ_j S_j^H[conj(O_j)·χ_j], as the engine computes them (folded scaling and
    conjugations, unnormalised inverse FFTs), against a plain complex128 evaluation — on an
    even frame, where the Nyquist row and column are where shortcuts go wrong."""
    data = data_of(scan)
    params = ReconParams(iterations=1, probe_modes=modes)
    with Reconstructor(data, initial_state(data, params), array_backend("cpu", fft=fft)) as rec:
        core = rec.core
        c = core.chunk(np.arange(7))
        assert c.ramp is not None
        kf = np.fft.fftfreq(M)
        ramps = np.exp(-2j * np.pi * (core.frac[c.idx, 0][:, None, None] * kf[None, :, None]
                                      + core.frac[c.idx, 1][:, None, None] * kf[None, None, :]))
        probe = core.probe.astype(np.complex128)
        want_pd = np.fft.ifft2(np.fft.fft2(probe)[None] * ramps[:, None])
        model = rec.algorithm.model
        got_pd = model.shifted_probe(c)
        assert np.abs(got_pd - want_pd).max() < 1e-5 * np.abs(want_pd).max()

        rng = np.random.default_rng(2)
        oj = model.object_patches(c, 0)
        chi = (rng.standard_normal((7, modes, M, M))
               + 1j * rng.standard_normal((7, modes, M, M))).astype(np.complex64)
        g = np.conj(oj.astype(np.complex128))[:, None] * chi
        want = np.fft.ifft2(np.fft.fft2(g) * np.conj(ramps)[:, None]).sum(axis=0)
        pnum = np.zeros((modes, M, M), np.complex64)
        pden = np.zeros((M, M), np.float32)
        model.probe_terms(Waves([], [oj.copy()], None), [chi.copy()], c, pnum, pden)
        got = model.probe_from_terms(pnum)
        assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()
        np.testing.assert_allclose(pden, (np.abs(oj) ** 2).sum(axis=0), rtol=1e-5)


@pytest.mark.parametrize("algorithm, sizes", [
    ("rpie", {100: 16, 200: 32, 400: 128, 4000: 128, 10000: 128}),
    ("mpie", {400: 128, 10000: 128}),
    # LSQ-ML: 256 from twelve batches of them on (measured better than 128 per iteration)
    ("lsqml", {100: 16, 400: 128, 3071: 128, 3072: 256, 4000: 256, 10000: 256}),
])
def test_default_batch_size_by_scan_size(algorithm, sizes):
    from beamflow.ptycho.forward.propagation import Propagation

    for n, want in sizes.items():
        assert ReconParams(algorithm=algorithm).batch_size_for(n) == want, n
    # a batch size asked for is kept, whatever the scan
    assert ReconParams(algorithm=algorithm, batch_size=64).batch_size_for(10000) == 64
    # the near field keeps 128 (measured better there than 256)
    near = Propagation(model="near-field", distance_m=1e-3, pixel_size_m=1e-7,
                       wavelength_m=1e-10)
    assert ReconParams(algorithm=algorithm, propagation=near).batch_size_for(10000) == 128


def test_sparse_batches_do_not_overlap(scan):
    corner = np.rint(scan["positions"]).astype(np.int64)
    nb = overlap_neighbours(corner, M)
    batches = sparse_batches(counter_rng(0, 0), nb, max_size=None)
    allidx = np.sort(np.concatenate(batches))
    np.testing.assert_array_equal(allidx, np.arange(len(corner)))
    for b in batches:
        d = np.abs(corner[b][:, None, :] - corner[b][None, :, :])
        overlap = (d[..., 0] < M) & (d[..., 1] < M)
        assert overlap.sum() == len(b)  # only each window with itself


@pytest.mark.parametrize("columns", [256, 3], ids=["table", "table-full"])
def test_sparse_batches_colour_greedily_in_a_random_order(scan, monkeypatch, columns):
    """The sets are the greedy colouring of the windows in the iteration's random order
    (each window takes the smallest colour none of its coloured neighbours has), however
    many colours the table holds: with 3 columns most windows find theirs the slow way."""
    from beamflow.ptycho.algorithms import batches as batches_mod

    monkeypatch.setattr(batches_mod, "COLOUR_COLUMNS", columns)
    corner = np.rint(scan["positions"]).astype(np.int64)
    nb = overlap_neighbours(corner, M)
    colour = np.full(len(nb), -1)
    for j in counter_rng(0, 0).permutation(len(nb)):  # sparse_batches' first draw
        used = set(colour[nb[j]].tolist())
        colour[j] = next(c for c in range(len(nb)) if c not in used)
    assert colour.max() + 1 > 3  # more colours than the narrow table holds
    batches = sparse_batches(counter_rng(0, 0), nb, max_size=None)
    assert sorted(sorted(b.tolist()) for b in batches) == sorted(
        np.flatnonzero(colour == c).tolist() for c in range(colour.max() + 1))


def test_orthogonalize_modes_keeps_coherence_function():
    rng = np.random.default_rng(1)
    p = (rng.standard_normal((3, 8, 8)) + 1j * rng.standard_normal((3, 8, 8))).astype(
        np.complex64)
    q, t = orthogonalize_modes(p, np, return_transform=True)
    a, b = p.reshape(3, -1).astype(np.complex128), q.reshape(3, -1).astype(np.complex128)
    np.testing.assert_allclose(a.conj().T @ a, b.conj().T @ b, atol=1e-3)
    gram = b.conj() @ b.T
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0, atol=1e-3)
    assert np.all(np.diff(np.real(np.diag(gram))) <= 0)
    np.testing.assert_allclose(t @ a, b, atol=1e-3)


def test_initial_state_probe_scaling_and_modes(scan):
    data = data_of(scan)
    state = initial_state(data, ReconParams(probe_modes=3))
    assert state.probe.shape == (3, M, M)
    far = np.abs(np.fft.fft2(state.probe.astype(np.complex128))) ** 2
    counts = data.intensities.sum(axis=(1, 2)).mean()
    assert far.sum() == pytest.approx(counts, rel=1e-3)
    given = initial_state(data, ReconParams(), probe=scan["probe"][0] * 7)
    assert np.allclose(np.abs(given.probe[0]) / np.abs(given.probe[0]).max(),
                       np.abs(scan["probe"][0]) / np.abs(scan["probe"][0]).max(), atol=1e-4)
    np.testing.assert_array_equal(given.object, np.ones(scan["shape"], np.complex64))


def test_threads_agree_with_single_thread(scan):
    data = data_of(scan)
    params = ReconParams(algorithm="rpie", iterations=5)
    out = []
    for threads in (1, 3):
        with Reconstructor(data, initial_state(data, params),
                           array_backend("cpu", threads=threads)) as rec:
            out.append(rec.run())
    np.testing.assert_allclose(out[0].object, out[1].object, rtol=0, atol=2e-4)
    np.testing.assert_allclose(out[0].loss_history, out[1].loss_history, rtol=1e-4)


def test_center_probe_moves_probe_and_object_together(scan):
    """Re-centring shifts probe and object alike: the model's far field does not change."""
    from beamflow.ptycho.core import Core

    data = data_of(scan)
    params = ReconParams(algorithm="dm", object_update_start=99, probe_update_start=99)
    state = initial_state(data, params, obj=scan["object"])
    p = scan["probe"][0].astype(np.complex128)
    k = np.fft.fftfreq(M)
    shift = (1.3, -0.8)  # move the probe off centre by (+1.3, -0.8) px
    ramp = np.exp(-2j * np.pi * (k[:, None] * shift[0] + k[None] * shift[1]))
    state.probe[0] = np.fft.ifft2(np.fft.fft2(p) * ramp).astype(np.complex64)
    core = Core(data, state, array_backend("cpu"))
    s = core.center_probe()
    assert s is not None and abs(s[0] - shift[0]) < 0.1 and abs(s[1] - shift[1]) < 0.1
    assert core.center_probe() is None  # now centred
    with Reconstructor(data, state, "cpu") as before:
        loss0 = before.iterate()
    state2 = ReconState(object=core.obj, probe=core.probe, positions_px=state.positions_px,
                        params=params.model_copy(update={"center_probe": False}))
    with Reconstructor(data, state2, "cpu") as after:
        loss1 = after.iterate()
    assert loss1 == pytest.approx(loss0, rel=0.05)


def test_consuming_the_data_gives_the_same_result_and_spends_the_data(scan):
    # beamflow reconstruct lets the engine turn the frames into amplitudes in place, so a
    # scan is never held twice; the reconstruction must not change, and the spent data
    # must refuse to be used again rather than feed amplitudes in as intensities.
    params = ReconParams(iterations=4)
    kept = data_of(scan, intensities=scan["intensities"].copy())
    with Reconstructor(kept, initial_state(kept, params), "cpu") as rec:
        expected = rec.run()
    frames = scan["intensities"].copy()
    spent = data_of(scan, intensities=frames)
    state = initial_state(spent, params)
    with Reconstructor(spent, state, "cpu", consume_data=True) as rec:
        got = rec.run()
    np.testing.assert_array_equal(got.object, expected.object)
    np.testing.assert_array_equal(got.probe, expected.probe)
    assert spent.n_positions == kept.n_positions  # the shape is still known
    # the array itself now holds the (ifftshifted) amplitudes: the engine wrote in place
    first = np.fft.ifftshift(scan["intensities"][0])
    valid = np.fft.ifftshift(spent.mask)
    np.testing.assert_allclose(frames[0][valid], np.sqrt(first[valid]), rtol=1e-6)
    with pytest.raises(ValueError, match="consumed"):
        Reconstructor(spent, initial_state(kept, params), "cpu")
    with pytest.raises(ValueError, match="consumed"):
        spent.append(scan["intensities"][:2], scan["positions"][:2])


def test_fft_and_dct_without_the_private_binding_match(monkeypatch):
    """The engine's FFTs and the previews' DCT give the same results through scipy's private
    pocketfft binding (loaded without the scipy.fft package) and through scipy.fft's public
    functions, which take over if the binding cannot be loaded."""
    from beamflow.ptycho import arrays as bmod

    assert bmod._pocketfft() is not None, "the binding no longer loads: check _pocketfft"
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 16, 16)) + 1j * rng.standard_normal((3, 16, 16))).astype(
        np.complex64)
    r = rng.standard_normal((9, 12))
    be = array_backend("cpu", threads=2, fft="pocketfft")
    fast = (be.fft2(x.copy()), be.ifft2(x.copy()), be.ifft2(x.copy(), scale=False),
            bmod.dct2(r), bmod.dct2(r, inverse=True))
    monkeypatch.setattr(bmod, "_pocketfft", lambda: None)
    public = (be.fft2(x.copy()), be.ifft2(x.copy()), be.ifft2(x.copy(), scale=False),
              bmod.dct2(r), bmod.dct2(r, inverse=True))
    for a, b in zip(fast, public, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast[0], np.fft.fft2(x), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(fast[2], np.fft.ifft2(x) * 256, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(bmod.dct2(fast[3], inverse=True), r, atol=1e-12)


def test_reconstruction_modules_do_not_import_scipy_fft():
    """scipy.fft's package costs ~28 MB of resident memory (it imports scipy.special): the
    reconstruction process must not load it (its peak is budgeted against the frames)."""
    import subprocess
    import sys

    code = ("import sys, beamflow.cli, beamflow.job.run, beamflow.ptycho.engine, "
            "beamflow.ptycho.quality.previews; print(sorted(m for m in sys.modules "
            "if m.startswith(('scipy.fft', 'scipy.special'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", out
