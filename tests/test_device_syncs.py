"""The engine keeps a GPU busy: checked without one, on a counting stand-in for CuPy.

A GPU runs the engine's kernels from a queue; the host only enqueues them. Every read of a
device value on the host (``float()``, ``.item()``, a copy to the host) and every
synchronisation waits for the queue to drain, and a kernel launch costs ~5-10 µs of host
time whatever its size. So the speed of an iteration on a GPU rests on two properties that
numpy cannot show but this stand-in can:

* an iteration reads the device a fixed, small number of times (the loss, and the position
  steps when positions are corrected), not once per batch or chunk;
* the kernels launched per batch do not grow with the batch size (no per-position loops).

The stand-in is numpy memory behind the GPU code path of :class:`ArrayBackend`: its arrays
count element-wise and reduction kernels, fancy-index gathers, FFTs and scatters, uploads,
and every conversion to a host value.
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from typing import Any

import numpy as np
import pytest
import scipy.fft
from test_ptycho_engine import data_of, simulate

from beamflow.ptycho import ReconParams, Reconstructor, initial_state
from beamflow.ptycho.arrays import ArrayBackend

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


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> ArrayBackend:
    stream = types.SimpleNamespace(synchronize=_synchronize)
    cupy = types.SimpleNamespace(
        ndarray=DeviceArray, asarray=_upload, asnumpy=_download, iscomplexobj=np.iscomplexobj,
        float32=np.float32, cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    cupyx = types.ModuleType("cupyx")
    cupyx.scatter_add = _scatter_add
    scipy_mod = types.ModuleType("cupyx.scipy")
    fft_mod = types.ModuleType("cupyx.scipy.fft")
    fft_mod.fft2, fft_mod.ifft2 = _fft(True), _fft(False)
    cupyx.scipy, scipy_mod.fft = scipy_mod, fft_mod
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setitem(sys.modules, "cupyx.scipy", scipy_mod)
    monkeypatch.setitem(sys.modules, "cupyx.scipy.fft", fft_mod)
    return ArrayBackend(name="cuda:0", xp=_XP("counting_cupy"), threads=1, _cupy=cupy)


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


def test_epie_sparse_batches_cost_the_same_kernels_whatever_their_size(device):
    with _reconstructor(device, algorithm="epie") as rec:
        rec.iterate()
        _, per_batch = _count_iteration(rec)
        sizes = [len(b) for b in rec.algorithm.batches(np.random.default_rng(0))]
    assert max(sizes) > 1  # non-overlapping sets: several positions per launch sequence
    assert len({b["launch"] for b in per_batch}) == 1, [b["launch"] for b in per_batch]


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

