"""A counting stand-in for CuPy: numpy memory behind the GPU code path of
:class:`~beamflow.ptycho.arrays.ArrayBackend`, whose arrays count element-wise and reduction
kernels, fancy-index gathers, FFTs and scatters (``COUNTS["launch"]``), uploads
(``"upload"``) and every conversion to a host value (``"read"``).

Used by ``tests/test_device_syncs.py`` (what keeps the engine's speed on a GPU when no GPU is
in the loop) and by ``benchmarks/bench_gpu.py`` (launches per iteration of each case). It
counts what the engine asks for: a call that is a view on CuPy but a function on numpy
(``broadcast_to``) counts as a launch, and CuPy's own allocations (``zeros``: a memset) do
not.
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

from beamflow.ptycho.arrays import ArrayBackend

__all__ = ["COUNTS", "DeviceArray", "counting_backend", "counting_modules", "installed"]

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


def _is_gather(key: Any) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (np.ndarray, list)) for k in keys)


class DeviceArray(np.ndarray):
    """numpy memory standing in for device memory: kernels and host reads are counted."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        COUNTS["launch"] += 1
        if "out" in kwargs:
            kwargs["out"] = tuple(_host(o) for o in kwargs["out"])
        out = getattr(ufunc, method)(*(_host(i) for i in inputs), **kwargs)
        return _dev(out)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        COUNTS["launch"] += 1
        conv = [_host(a) if not isinstance(a, (list, tuple)) else type(a)(_host(x) for x in a)
                for a in args]
        if "out" in kwargs:
            kwargs = {**kwargs, "out": _host(kwargs["out"])}
        return _dev(func(*conv, **kwargs))

    def __getitem__(self, key: Any) -> Any:
        if _is_gather(key):
            COUNTS["launch"] += 1
        key = tuple(_host(k) for k in key) if isinstance(key, tuple) else _host(key)
        return _dev(np.ndarray.__getitem__(self.view(np.ndarray), key))

    def __setitem__(self, key: Any, value: Any) -> None:
        COUNTS["launch"] += 1
        key = tuple(_host(k) for k in key) if isinstance(key, tuple) else _host(key)
        np.ndarray.__setitem__(self.view(np.ndarray), key, _host(value))

    def copy(self, *args: Any, **kwargs: Any) -> Any:
        COUNTS["launch"] += 1
        return _dev(self.view(np.ndarray).copy(*args, **kwargs))

    def astype(self, *args: Any, **kwargs: Any) -> Any:
        COUNTS["launch"] += 1
        return _dev(self.view(np.ndarray).astype(*args, **kwargs))

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


class _XP(types.ModuleType):
    """The array module: numpy's functions, their results on the 'device'."""

    def __getattr__(self, name: str) -> Any:
        obj = getattr(np, name)
        if callable(obj) and not isinstance(obj, type):
            def call(*args: Any, **kwargs: Any) -> Any:
                if name in ("asarray", "array") and not isinstance(args[0], DeviceArray):
                    COUNTS["upload"] += 1
                return _dev(obj(*args, **kwargs))
            return call
        return obj


def _fft(forward: bool):
    def fft(a: Any, axes: Any = (-2, -1), overwrite_x: bool = False, norm: str = "backward"):
        COUNTS["launch"] += 1
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


def _scatter_add(a: Any, idx: Any, values: Any) -> None:
    COUNTS["launch"] += 1
    np.add.at(_host(a), _host(idx), _host(values))


def counting_modules() -> dict[str, types.ModuleType]:
    """The ``cupyx`` modules the GPU code path imports (scatter-add, FFTs), counting."""
    cupyx = types.ModuleType("cupyx")
    cupyx.scatter_add = _scatter_add
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
    return ArrayBackend(name="cuda:0", xp=_XP("counting_cupy"), threads=1, _cupy=cupy)


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
