"""The CPU FFTs through FFTW (beamflow.ptycho.fftw) and the choice between FFTW and pocketfft."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
from engine_kit import data_of, simulate

from beamflow.ptycho import ReconParams, Reconstructor, array_backend, fftw, initial_state
from beamflow.ptycho import arrays as bmod
from beamflow.ptycho.arrays import ArrayBackendError

FFTW = bmod._fftw()
needs_fftw = pytest.mark.skipif(FFTW is None, reason="no libfftw3f (pip install 'beamflow[fftw]')")


def _stack(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    # float32 FFTs: errors of ~1e-7 relative to the largest coefficient, times log N
    assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max()


@needs_fftw
@pytest.mark.parametrize("shape", [(5, 64, 64), (3, 2, 32, 48), (2, 7, 9), (16, 16)])
def test_fftw_matches_numpy_forward_and_inverse(shape):
    x = _stack(shape)
    fwd = FFTW.transform(x.copy(), True)
    inv = FFTW.transform(x.copy(), False)
    _close(fwd, np.fft.fft2(x))
    _close(inv, np.fft.ifft2(x))
    _close(FFTW.transform(fwd, False), x)  # the round trip, in place
    assert fwd.dtype == np.complex64


@needs_fftw
def test_fftw_plans_for_each_alignment():
    """A plan is only valid for arrays of the SIMD alignment it was made for: a stack that
    starts one complex64 (8 bytes) into a buffer gets its own plan and the right answer —
    the same bits at every alignment, so a run repeats exactly wherever malloc puts arrays."""
    x0 = _stack((4, 32, 32))
    buf = np.zeros(x0.size + 8, np.complex64)
    results = []
    for offset in range(8):
        x = buf[offset : offset + x0.size].reshape(x0.shape)
        x[...] = x0
        results.append(FFTW.transform(x, True).copy())
    _close(results[0], np.fft.fft2(x0))
    assert len({FFTW._alignment_of(buf[o:].ctypes.data) for o in range(8)}) > 1
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


@needs_fftw
def test_fftw_from_several_threads_at_once():
    """The engine's threads share plans and execute them concurrently."""
    inputs = [_stack((6, 64, 64), seed) for seed in range(4)]
    wanted = [np.fft.fft2(x) for x in inputs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(25):
                y = FFTW.transform(inputs[i].copy(), True)
                _close(y, wanted[i])
        except BaseException as exc:  # noqa: BLE001 - reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@needs_fftw
def test_fftw_refuses_what_it_cannot_transform_in_place():
    x = _stack((2, 8, 8))
    for bad in (x.astype(np.complex128), x[:, :, ::2], x.real.copy()):
        with pytest.raises(ValueError, match="C-contiguous complex64"):
            FFTW.transform(bad, True)
    ro = x.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        FFTW.transform(ro, True)
    empty = np.zeros((0, 8, 8), np.complex64)
    assert FFTW.transform(empty, True) is empty


def test_no_usable_library_means_pocketfft(monkeypatch):
    """A library that fails to load is skipped; without one, the CPU backend uses pocketfft
    and asking for FFTW says how to get it."""
    monkeypatch.setattr(fftw, "library_candidates", lambda: ["/nonexistent/libfftw3f.so"])
    assert fftw.load() is None
    monkeypatch.setattr(bmod, "_fftw", lambda: None)
    assert bmod.cpu_ffts() == ("pocketfft",)
    assert array_backend("cpu").fft == "pocketfft"
    with pytest.raises(ArrayBackendError, match=r"beamflow\[fftw\]"):
        array_backend("cpu", fft="fftw")
    with pytest.raises(ArrayBackendError, match="expected one of pocketfft"):
        array_backend("cpu", fft="mkl")


@needs_fftw
def test_fftw_is_the_default_and_backends_agree():
    be_fftw, be_pocket = array_backend("cpu"), array_backend("cpu", fft="pocketfft")
    assert be_fftw.fft == "fftw" and be_pocket.fft == "pocketfft"
    x = _stack((3, 1, 24, 24))
    _close(be_fftw.fft2(x.copy()), be_pocket.fft2(x.copy()))
    _close(be_fftw.ifft2(x.copy()), be_pocket.ifft2(x.copy()))
    unscaled = np.fft.ifft2(x) * (24 * 24)
    for be in (be_fftw, be_pocket):
        _close(be.ifft2(x.copy(), scale=False), unscaled)
    # what FFTW does not take (complex128, views) goes to pocketfft, with the same result
    x128 = x.astype(np.complex128)
    np.testing.assert_allclose(be_fftw.fft2(x128.copy()), np.fft.fft2(x128), rtol=1e-10,
                               atol=1e-9)


@needs_fftw
@pytest.mark.parametrize("extra", [
    {"algorithm": "rpie"},
    {"algorithm": "epie"},
    {"algorithm": "dm"},
    {"algorithm": "lsqml", "noise_model": "gaussian"},
    {"algorithm": "rpie", "probe_modes": 2, "position_correction": True,
     "position_correction_start": 1},
], ids=["rpie", "epie", "dm", "lsqml-gaussian", "rpie-modes-poscorr"])
def test_reconstructions_agree_across_fft_libraries(extra):
    """FFTW and pocketfft round differently; the algorithms must not care."""
    sim = simulate()
    params = ReconParams(iterations=6, **extra)
    out = {}
    for impl in ("fftw", "pocketfft"):
        data = data_of(sim)
        with Reconstructor(data, initial_state(data, params),
                           array_backend("cpu", threads=2, fft=impl)) as rec:
            out[impl] = rec.run()
    a, b = out["fftw"], out["pocketfft"]
    np.testing.assert_allclose(a.loss_history, b.loss_history, rtol=1e-4)
    assert np.abs(a.object - b.object).max() < 1e-3 * np.abs(b.object).max()
    assert np.abs(a.probe - b.probe).max() < 1e-3 * np.abs(b.probe).max()


@needs_fftw
def test_poisson_lsqml_converges_alike_on_both_libraries():
    """Poisson LSQ-ML divides by the model intensity, which in dark pixels is rounding noise;
    without its floor (lsqml.POISSON_FLOOR) the two libraries' trajectories drifted apart
    (~2-10 % in the loss after 30 iterations). With it they agree to rounding."""
    sim = simulate()
    params = ReconParams(iterations=30, algorithm="lsqml", noise_model="poisson")
    final = {}
    for impl in ("fftw", "pocketfft"):
        data = data_of(sim)
        with Reconstructor(data, initial_state(data, params),
                           array_backend("cpu", threads=1, fft=impl)) as rec:
            state = rec.run()
        assert state.loss_history[-1] < 0.5 * state.loss_history[0]
        final[impl] = state.loss_history[-1]
    assert abs(final["fftw"] / final["pocketfft"] - 1) < 1e-3


@needs_fftw
def test_fftw_loads_without_the_pyfftw_package_or_scipy_fft():
    """Only libfftw3f is loaded (1 MB): not pyFFTW's package, which imports scipy.fft."""
    code = ("import sys, numpy as np; from beamflow.ptycho.arrays import array_backend; "
            "be = array_backend('cpu'); be.fft2(np.ones((2, 8, 8), np.complex64)); "
            "print(be.fft, sorted(m for m in sys.modules if m.startswith("
            "('pyfftw', 'scipy.fft', 'scipy.special'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "fftw []", out
