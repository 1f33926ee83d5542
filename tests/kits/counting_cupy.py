"""A counting stand-in for CuPy: numpy memory behind the GPU code path of
:class:`~beamflow.ptycho.arrays.ArrayBackend`, whose arrays count element-wise and reduction
kernels, fancy-index gathers and window writes, FFTs and the fused kernels
(``COUNTS["launch"]``), the bytes those kernels read and write in device memory
(``"bytes"``), uploads (``"upload"``), every conversion to a host value (``"read"``), the
FFTs (``"fft"``), CuPy's scaling kernels after an FFT (``"fft_scale"``; both also
counted as launches) and reductions of a strided (non-contiguous) view to one value
(``"strided_reduce"``: CuPy runs those on a single block, as CUB takes contiguous input only).

Used by ``tests/ptycho/gpu/test_device_syncs.py`` (what keeps the engine's speed on a GPU
when no GPU is in the loop) and by ``benchmarks/bench_gpu.py`` (launches per iteration of
each case). It counts what the engine asks for: a call that is a view on CuPy but a function
on numpy (``broadcast_to``) counts as a launch, and CuPy's own allocations (``zeros``: a memset;
``empty_like``: none) do not.

Bytes are what each kernel reads and writes once, as a memory-bound GPU kernel would: every
operand array's and result's size (a broadcast operand counts its own size: it is read
through the cache); a gather reads and writes its result and reads its index; a window
write reads its values and index and writes the places; an FFT reads and writes its array
once (cuFFT's small 2-D transforms are one pass), and a scaled one (an inverse FFT with
``norm="backward"``) launches CuPy's scaling kernel after it, another read and write; the
fused kernels count what they read and write (``CountingKernels``). Reductions count their
input. ``benchmarks/bench_gpu.py``
turns them into a modelled time on a card.
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import scipy.fft
from reference_kernels import ReferenceKernels

from beamflow.ptycho.arrays import ArrayBackend

__all__ = ["COUNTS", "SITES", "CountingKernels", "DeviceArray", "by_site", "counting_backend",
           "counting_modules", "installed"]

COUNTS: Counter[str] = Counter()


def _host(a: Any) -> Any:
    return a.view(np.ndarray) if isinstance(a, DeviceArray) else a


def _dev(a: Any) -> Any:
    if isinstance(a, np.generic):  # a reduction's result stays on the device, 0-d
        a = np.asarray(a)
    if isinstance(a, np.ndarray) and not isinstance(a, DeviceArray):
        return a.view(DeviceArray)
    if isinstance(a, tuple):
        return tuple(_dev(x) for x in a)
    if isinstance(a, list):
        return [_dev(x) for x in a]
    return a


def _nbytes(*arrays: Any) -> int:
    return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))


# Per engine call site (``file:line``): launches and bytes, filled only while
# :func:`by_site` is on (finding the caller costs a stack walk per launch).
SITES: dict[str, list[int]] = {}
_TRACE = [False]


@contextmanager
def by_site() -> Iterator[dict[str, list[int]]]:
    """Attribute each launch and its bytes to the engine line that asked for it (the
    innermost frame in beamflow/ptycho outside the array backend, its operations and the
    kernels), in :data:`SITES` as ``{"thin.py:57": [launches, bytes]}``."""
    SITES.clear()
    _TRACE[0] = True
    try:
        yield SITES
    finally:
        _TRACE[0] = False


def _site() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if "/beamflow/ptycho/" in path and not path.endswith(
                ("arrays/__init__.py", "arrays/ops.py", "kernels.py")):
            return f"{path.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _launch(nbytes: int) -> None:
    COUNTS["launch"] += 1
    COUNTS["bytes"] += nbytes
    if _TRACE[0]:
        site = SITES.setdefault(_site(), [0, 0])
        site[0] += 1
        site[1] += nbytes


def _key_bytes(key: Any) -> int:
    return _nbytes(*(key if isinstance(key, tuple) else (key,)))


def _is_gather(key: Any) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (np.ndarray, list)) for k in keys)


class DeviceArray(np.ndarray):
    """numpy memory standing in for device memory: kernels and host reads are counted."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if "out" in kwargs:
            kwargs["out"] = tuple(_host(o) for o in kwargs["out"])
        out = getattr(ufunc, method)(*(_host(i) for i in inputs), **kwargs)
        results = kwargs.get("out") or (out if isinstance(out, tuple) else (out,))
        _launch(_nbytes(*inputs, *results))
        if ufunc is np.matmul:
            COUNTS["blas"] += 1
        src = inputs[0]
        if (method == "reduce" and np.ndim(out) == 0 and isinstance(src, np.ndarray)
                and src.ndim > 1 and not src.flags.c_contiguous):
            COUNTS["strided_reduce"] += 1
        return _dev(out)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        conv = [_host(a) if not isinstance(a, (list, tuple)) else type(a)(_host(x) for x in a)
                for a in args]
        if "out" in kwargs:
            kwargs = {**kwargs, "out": _host(kwargs["out"])}
        out = func(*conv, **kwargs)
        result = kwargs.get("out", out)
        if func is np.empty_like:  # an allocation, no kernel
            return _dev(out)
        if func is np.take:  # reads only the gathered places of its source
            _launch(2 * _nbytes(result) + _nbytes(conv[1]))
        else:
            parts = [x for a in conv for x in (a if isinstance(a, (list, tuple)) else (a,))]
            _launch(_nbytes(*parts, result))
        return _dev(out)

    def __getitem__(self, key: Any) -> Any:
        gather = _is_gather(key)
        key = tuple(_host(k) for k in key) if isinstance(key, tuple) else _host(key)
        out = np.ndarray.__getitem__(self.view(np.ndarray), key)
        if gather:
            _launch(2 * _nbytes(out) + _key_bytes(key))
        return _dev(out)

    def __setitem__(self, key: Any, value: Any) -> None:
        key = tuple(_host(k) for k in key) if isinstance(key, tuple) else _host(key)
        target = self.view(np.ndarray)
        np.ndarray.__setitem__(target, key, _host(value))
        # Writes the places set; reads the value (its own size when broadcast) and the index.
        places = np.asarray(value).nbytes if _is_gather(key) else target[key].nbytes
        _launch(places + _nbytes(_host(value)) + _key_bytes(key))

    def copy(self, *args: Any, **kwargs: Any) -> Any:
        out = self.view(np.ndarray).copy(*args, **kwargs)
        _launch(2 * out.nbytes)
        return _dev(out)

    def astype(self, *args: Any, **kwargs: Any) -> Any:
        out = self.view(np.ndarray).astype(*args, **kwargs)
        _launch(self.nbytes + out.nbytes)
        return _dev(out)

    # Reading a value on the host waits for the device.
    def _read(self) -> np.ndarray:
        COUNTS["read"] += 1
        return self.view(np.ndarray)

    def __float__(self) -> float:
        return float(self._read())

    def __int__(self) -> int:
        return int(self._read())

    def __bool__(self) -> bool:
        return bool(self._read())

    def __complex__(self) -> complex:
        return complex(self._read())

    def item(self, *args: Any) -> Any:
        return self._read().item(*args)

    def tolist(self) -> Any:
        return self._read().tolist()


# Array functions CuPy computes with cuBLAS (einsum: its contractions).
BLAS = frozenset({"dot", "vdot", "inner", "matmul", "tensordot", "einsum"})


class _XP(types.ModuleType):
    """The array module: numpy's functions, their results on the 'device'."""

    def __getattr__(self, name: str) -> Any:
        obj = getattr(np, name)
        if callable(obj) and not isinstance(obj, type):
            def call(*args: Any, **kwargs: Any) -> Any:
                if name in ("asarray", "array") and not isinstance(args[0], DeviceArray):
                    COUNTS["upload"] += 1
                if name in BLAS:  # CuPy hands these to cuBLAS: no CUDA graph holds them
                    COUNTS["blas"] += 1
                return _dev(obj(*args, **kwargs))
            return call
        return obj


def _fft(forward: bool):
    def fft(a: Any, axes: Any = (-2, -1), overwrite_x: bool = False, norm: str = "backward"):
        COUNTS["fft"] += 1
        _launch(2 * a.nbytes)
        # CuPy scales after cuFFT (cuFFT itself never does): ``out /= n``, one more kernel
        # over the whole array (cupy/fft/_fft.py, _exec_fftn).
        if norm == "ortho" or norm == ("forward" if forward else "backward"):
            COUNTS["fft_scale"] += 1
            _launch(2 * a.nbytes)
        f = scipy.fft.fft2 if forward else scipy.fft.ifft2
        return _dev(f(_host(a), axes=axes, overwrite_x=overwrite_x, norm=norm, workers=1))
    return fft


def _upload(a: Any, dtype: Any = None) -> DeviceArray:
    COUNTS["upload"] += 1
    return np.array(_host(a), dtype=dtype).view(DeviceArray)


def _download(a: Any) -> np.ndarray:
    COUNTS["read"] += 1
    return np.array(_host(a))


def _synchronize() -> None:
    COUNTS["read"] += 1


class CountingKernels(ReferenceKernels):
    """The fused kernels as :class:`ReferenceKernels` computes them, each counted as one
    launch (the modulus projection two: the kernel and its sum) with the bytes the kernel
    moves."""

    def ramp_product(self, e: Any, a: Any, out: Any = None, conj: bool = False) -> Any:
        res = super().ramp_product(_host(e), _host(a), _host(out), conj)
        _launch(_nbytes(e, a, res))
        return out if out is not None else _dev(res)

    def exit_wave(self, obj: Any, flat: Any, pd: Any) -> tuple[Any, Any]:
        oj, psi = super().exit_wave(_host(obj), _host(flat), _host(pd))
        # the windows read, P_j (its own size when broadcast) read, O_j and ψ_j written
        _launch(2 * oj.nbytes + _nbytes(flat, pd, psi))
        return _dev(oj), _dev(psi)

    def object_terms(self, acc: Any, pd: Any, chi: Any, inten: Any, flat: Any, h: int,
                     w: int, maxima: bool = False) -> Any:
        most = super().object_terms(_host(acc), _host(pd), _host(chi), _host(inten),
                                    _host(flat), h, w, maxima)
        # P_j (its own size when broadcast) and χ_j read once; 12 bytes a pixel added to.
        b, m = chi.shape[0], chi.shape[-1]
        _launch(_nbytes(pd, chi, flat) + 2 * 12 * b * m * m)
        return None if most is None else _dev(most)

    def apply_step(self, obj: Any, acc: Any, top: Any, box: tuple[slice, slice],
                   c_den: float, c_max: float, step: Any = None) -> None:
        super().apply_step(_host(obj), _host(acc), _host(top), box, c_den, c_max,
                           _host(step))
        # the pair read over the box; the object read and written, the pair cleared, where
        # the batch reached (counted as everywhere: an upper bound)
        px = obj[box].size
        _launch(12 * px + 28 * px)

    def position_sum(self, e: Any, a: Any, out: Any) -> Any:
        super().position_sum(_host(e), _host(a), _host(out))
        _launch(_nbytes(e, a) + 2 * out.nbytes)
        return out

    def step_systems(self, pd: Any, acc: Any, top: Any, alpha: float, flat: Any, oj: Any,
                     sp: Any, chi: Any, h: int, w: int) -> Any:
        out = super().step_systems(_host(pd), _host(acc), _host(top), alpha, _host(flat),
                                   _host(oj), _host(sp), _host(chi), h, w)
        # the accumulator pair read at the windows: 12 bytes a pixel of each
        window = 12 * chi.shape[0] * chi.shape[-1] ** 2 if acc is not None else 0
        _launch(_nbytes(pd, flat, oj, sp, chi, out) + window)
        return _dev(out)

    def intensity_sum(self, a: Any, out: Any) -> Any:
        super().intensity_sum(_host(a), _host(out))
        _launch(_nbytes(a) + 2 * out.nbytes)
        return out

    def step_lengths(self, tot: Any, both: bool, damping: float) -> Any:
        out = super().step_lengths(_host(tot), both, damping)
        _launch(_nbytes(tot, out))
        return _dev(out)

    def conj_product(self, o: Any, x: Any, out: Any) -> Any:
        super().conj_product(_host(o), _host(x), _host(out))
        _launch(_nbytes(o, x, out))
        return out

    def preconditioned_step(self, num: Any, den: Any, dmax: Any, c_den: float,
                            c_max: float, into: Any = None) -> Any:
        super().preconditioned_step(_host(num), _host(den), _host(dmax), c_den, c_max,
                                    _host(into))
        if into is None:
            _launch(2 * num.nbytes + den.nbytes)
            return num
        _launch(num.nbytes + den.nbytes + 2 * into.nbytes)
        return into

    def axpy(self, y: Any, a: Any, x: Any) -> Any:
        super().axpy(_host(y), _host(a), _host(x))
        _launch(2 * y.nbytes + x.nbytes)
        return y

    def modulus(self, psi: Any, frames: Any, rows: Any, mask: Any, eps: Any,
                scale: Any = 1.0) -> Any:
        loss = super().modulus(_host(psi), _host(frames), None if rows is None else _host(rows),
                               _host(mask), eps, scale)
        b = psi.shape[0]
        _launch(8 * b)  # the zeroed sums, one a position
        data = psi.size * frames.itemsize
        _launch(2 * psi.nbytes + data + _nbytes(mask) + 8 * b)  # ψ, I's rows, mask; the sums
        _launch(8 * b)  # their sum
        return _dev(loss)


def counting_modules() -> dict[str, types.ModuleType]:
    """The ``cupyx`` modules the GPU code path imports (its FFTs), counting."""
    cupyx = types.ModuleType("cupyx")
    scipy_mod = types.ModuleType("cupyx.scipy")
    fft_mod = types.ModuleType("cupyx.scipy.fft")
    fft_mod.fft2, fft_mod.ifft2 = _fft(True), _fft(False)
    cupyx.scipy, scipy_mod.fft = scipy_mod, fft_mod
    return {"cupyx": cupyx, "cupyx.scipy": scipy_mod, "cupyx.scipy.fft": fft_mod}


def counting_backend() -> ArrayBackend:
    """A GPU backend ("cuda:0") on the counting stand-in (needs :func:`counting_modules`
    in ``sys.modules`` while it runs: see :func:`installed`)."""
    stream = types.SimpleNamespace(synchronize=_synchronize)
    cupy = types.SimpleNamespace(
        ndarray=DeviceArray, asarray=_upload, asnumpy=_download, iscomplexobj=np.iscomplexobj,
        float32=np.float32, cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    return ArrayBackend(name="cuda:0", xp=_XP("counting_cupy"), threads=1,
                        kernels=CountingKernels(), _cupy=cupy)


@contextmanager
def installed() -> Iterator[ArrayBackend]:
    """The counting backend, with its modules in ``sys.modules`` until the block ends."""
    mods = counting_modules()
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        yield counting_backend()
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
