"""FFTW in single precision, called through ctypes: in-place 2-D FFTs of complex64 stacks.

With pocketfft the CPU engine spent half its time in small complex64 FFTs; FFTW does them
1.6x faster than scipy's pocketfft binding on the engine's chunks (11 against 18 µs per 64x64)
and 2.7x faster than scipy.fft on the FFT floor's stack (benchmarks/bench_engine.py:
``fftw_floor`` against ``fft_floor``). Three C functions are all it needs — plan a batched
2-D transform, execute a plan on new arrays, and ask an array's SIMD alignment — so they are
bound here directly rather than through pyFFTW's
Python API, whose package imports scipy.fft (36 MB resident), whose binding links FFTW in
three precisions (6 MB against this module's 1 MB), and whose plan objects either cost ~50 µs
each or hold on to the last arrays they transformed.

The library is libfftw3f from the pyFFTW wheel (the ``fftw`` extra), else the system's.
FFTW is GPL-2.0-or-later: installations that must avoid it leave the extra out and the engine
uses pocketfft (see :mod:`beamflow.ptycho.arrays`).

Plans are made with FFTW_ESTIMATE — deterministic (no timing-dependent choice of algorithm,
so a run repeats bit for bit) and, unlike the measuring modes, it leaves the array alone — once
per (stack length, frame shape, direction, alignment) under a lock, since FFTW's planner is not
thread-safe; executing a plan on new arrays is, and ctypes releases the GIL around the call, so
the engine's threads transform their chunks in parallel. FFTW gives the same bits at every
alignment (tests/ptycho/test_ptycho_fftw.py), so where malloc places an array never
changes a result.
Plans live as long as the process: a few kB each, one per chunk shape met.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import threading

import numpy as np

__all__ = ["FFTWF", "library_candidates", "load"]

_FORWARD = -1
_BACKWARD = 1
_ESTIMATE = 1 << 6


class _IODim(ctypes.Structure):
    """fftw_iodim: a dimension's length and its input/output strides (in elements)."""

    _fields_ = [("n", ctypes.c_int), ("is_", ctypes.c_int), ("os", ctypes.c_int)]


class FFTWF:
    """libfftw3f at ``path``: :meth:`transform` runs in-place c2c FFTs over the last two axes."""

    def __init__(self, path: str):
        lib = ctypes.CDLL(path)
        self.path = path
        self._plan_guru = lib.fftwf_plan_guru_dft
        self._plan_guru.restype = ctypes.c_void_p
        self._plan_guru.argtypes = [ctypes.c_int, ctypes.POINTER(_IODim), ctypes.c_int,
                                    ctypes.POINTER(_IODim), ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_int, ctypes.c_uint]
        self._execute = lib.fftwf_execute_dft
        self._execute.restype = None
        self._execute.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._alignment_of = lib.fftwf_alignment_of
        self._alignment_of.restype = ctypes.c_int
        self._alignment_of.argtypes = [ctypes.c_void_p]
        self._plans: dict[tuple[int, int, int, bool, int], int] = {}
        self._lock = threading.Lock()

    def transform(self, a: np.ndarray, forward: bool, scale: bool = True) -> np.ndarray:
        """FFT ``a`` (C-contiguous complex64, ``ndim >= 2``) in place over its last two axes and
        return it: unnormalised forward, inverse scaled by 1/(M·N) like numpy's (unless not
        ``scale``)."""
        if a.dtype != np.complex64 or not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError("FFTWF.transform needs a writeable C-contiguous complex64 array")
        if a.size == 0:
            return a
        m, n = a.shape[-2:]
        ptr = a.ctypes.data
        key = (a.size // (m * n), m, n, forward, self._alignment_of(ptr))
        plan = self._plans.get(key) or self._plan(key, ptr)
        self._execute(plan, ptr, ptr)
        if not forward and scale:
            flat = a.view(np.float32)  # a real multiply: half the work of a complex one
            np.multiply(flat, np.float32(1.0 / (m * n)), out=flat)
        return a

    def _plan(self, key: tuple[int, int, int, bool, int], ptr: int) -> int:
        howmany, m, n, forward, _ = key
        dims = (_IODim * 2)(_IODim(m, n, n), _IODim(n, 1, 1))
        loop = (_IODim * 1)(_IODim(howmany, m * n, m * n))
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plan_guru(2, dims, 1, loop, ptr, ptr,
                                       _FORWARD if forward else _BACKWARD, _ESTIMATE)
                if not plan:
                    raise RuntimeError(f"FFTW could not plan a {howmany}x{m}x{n} transform")
                self._plans[key] = plan
        return plan


def library_candidates() -> list[str]:
    """Paths of libfftw3f to try: the pyFFTW wheel's copy (auditwheel puts it in
    ``pyfftw.libs`` beside the package), then the system's."""
    found: list[str] = []
    spec = importlib.util.find_spec("pyfftw")
    if spec is not None and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            libs = os.path.join(os.path.dirname(os.path.abspath(d)), "pyfftw.libs")
            found += sorted(glob.glob(os.path.join(libs, "libfftw3f-*.so*")))
    system = ctypes.util.find_library("fftw3f")
    if system:
        found.append(system)
    return found


def load() -> FFTWF | None:
    """The first candidate library that loads and agrees with numpy's FFT, else None."""
    rng = np.random.default_rng(0)
    t = (rng.standard_normal((3, 8, 6)) + 1j * rng.standard_normal((3, 8, 6))).astype(
        np.complex64)
    for path in library_candidates():
        try:
            fw = FFTWF(path)
            got = fw.transform(t.copy(), True)
            back = fw.transform(got.copy(), False)
        except (OSError, AttributeError, RuntimeError):
            continue
        if (np.allclose(got, np.fft.fft2(t), rtol=1e-4, atol=1e-4)
                and np.allclose(back, t, rtol=1e-4, atol=1e-4)):
            return fw
    return None
