"""The array side of the reconstruction engine: numpy (+ FFTW or pocketfft) or cupy (cuFFT).

Everything in :mod:`beamflow.ptycho` is written once against an array module ``xp``; the few
operations whose best implementation differs between CPU and GPU live here:

* FFTs over the last two axes of a stack (unnormalised forward, ``1/M²`` inverse, like numpy):
  on CPU single-precision FFTW (:mod:`.fftw`, the ``fftw`` extra) when it is there, else
  scipy's pocketfft with ``workers`` threads (``array_backend(fft=...)`` picks either); cupy's
  cuFFT (plans cached by cupy) on GPU;
* gathering object patches at integer corners, and scatter-adding patches back into an
  object-sized accumulator;
* host <-> device moves.

This is the only module of the package that imports ``cupy`` or ``scipy`` or loads FFTW (the
previews' phase unwrapping takes its DCT from here).
"""

from __future__ import annotations

import functools
import glob
import importlib.machinery
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .. import fftw
from ..gpu.kernels import GpuKernels
from .ops import ArrayOps

# Elements below which one FFT call runs in one thread (4 frames of 128x128).
PARALLEL_FFT_MIN = 4 * 128 * 128
# The part of a GPU's free memory the engine plans for (the rest: cuFFT work areas, CuPy's
# pool rounding, other processes' growth).
GPU_MEMORY_FRACTION = 0.85

__all__ = ["ArrayBackend", "ArrayBackendError", "HostCopy", "array_backend", "cpu_count",
           "cuda_available", "dct2", "cpu_ffts"]


def _load_extension(package: str, module: str) -> ModuleType:
    """The compiled module ``package.module``, loaded from its file without importing
    ``package`` (whose ``__init__`` may import far more than the one binding needed here)."""
    spec = importlib.util.find_spec(package.split(".")[0])
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{package} is not installed")
    subdirs = package.split(".")[1:]
    found = [p for suffix in importlib.machinery.EXTENSION_SUFFIXES
             for d in spec.submodule_search_locations
             for p in glob.glob(os.path.join(d, *subdirs, module + suffix))]
    if not found:
        raise ImportError(f"no compiled {package}.{module}")
    name = f"{package}.{module}"
    loader = importlib.machinery.ExtensionFileLoader(name, found[0])
    mod = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location(name, found[0], loader=loader))
    loader.exec_module(mod)
    return mod


@functools.cache
def _pocketfft() -> ModuleType | None:
    """scipy's pocketfft binding, loaded from its file without importing ``scipy.fft``.

    Two reasons. scipy.fft's public wrappers cost ~30 µs of Python per call (argument
    normalisation, uarray dispatch) — a few percent of an iteration that makes four FFT calls
    per chunk. And importing the scipy.fft package imports scipy.special and numpy.f2py on
    the way: 28 MB of resident memory and 0.4 s in every reconstruction process, whose peak
    memory is budgeted at twice the frames. The binding is private: it is checked here against
    numpy's FFT, and scipy.fft's public functions are used if it moved. Loaded on first use
    (2 MB): with FFTW the engine needs it only for the previews' DCT.
    """
    try:
        pp = _load_extension("scipy.fft._pocketfft", "pypocketfft")
        t = (np.arange(8) * (1 + 0.5j)).astype(np.complex64).reshape(2, 2, 2)
        got = pp.c2c(t.copy(), (1, 2), True, 0, None, 1)
        back = pp.c2c(got.copy(), (1, 2), False, 2, None, 1)
        r = np.arange(12.0).reshape(3, 4)
        dct = pp.dct(r.copy(), 2, (0, 1), 1, None, 1, None)
        if (np.allclose(got, np.fft.fft2(t)) and np.allclose(back, t)
                and np.isclose(dct[0, 0], r.sum() / np.sqrt(r.size))
                and np.allclose(pp.dct(dct.copy(), 3, (0, 1), 1, None, 1, None), r)):
            return pp
    except Exception:
        pass
    return None


def _public_fft() -> ModuleType:
    import scipy.fft  # noqa: PLC0415 - only if the binding could not be loaded

    return scipy.fft


@functools.cache
def _fftw() -> fftw.FFTWF | None:
    """FFTW (single precision) if the ``fftw`` extra or a system libfftw3f is there."""
    return fftw.load()


def cpu_ffts() -> tuple[str, ...]:
    """The CPU FFT implementations usable in this process, the default first."""
    return (("fftw",) if _fftw() is not None else ()) + ("pocketfft",)


def dct2(a: np.ndarray, inverse: bool = False) -> np.ndarray:
    """Orthonormal 2-D DCT-II of a host float array (``inverse``: its inverse, the DCT-III),
    as ``scipy.fft.dctn``/``idctn(type=2, norm="ortho")``; a new array."""
    a = np.asarray(a, np.float64)
    pp = _pocketfft()
    if pp is not None:
        return pp.dct(a.copy(), 3 if inverse else 2, (0, 1), 1, None, 1, None)
    sfft = _public_fft()
    return (sfft.idctn if inverse else sfft.dctn)(a, type=2, norm="ortho")


class ArrayBackendError(RuntimeError):
    """The requested compute device cannot be used."""


def cpu_count() -> int:
    """CPUs this process may run on (honours affinity masks and cgroups' cpusets)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _import_cupy() -> ModuleType | None:
    try:
        import cupy  # noqa: PLC0415 - optional dependency, imported on demand
    except Exception:  # ImportError, or a broken CUDA install raising at import
        return None
    return cupy


def cuda_available() -> bool:
    """True when cupy imports and at least one CUDA device is visible.

    ``CUDA_VISIBLE_DEVICES`` is honoured by the CUDA runtime itself: an empty value or ``-1``
    hides every device and this returns False.
    """
    cp = _import_cupy()
    if cp is None:
        return False
    try:
        return int(cp.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


class HostCopy:
    """A device→host copy in flight (see :meth:`ArrayBackend.host_copy_async`)."""

    def __init__(self, host: Any, done: Any = None, keep: Any = None,
                 read: Callable[[Any], np.ndarray] | None = None):
        # ``host``: the host array, or (with ``read``) the device snapshot ``read`` turns
        # into it when the result is asked for.
        self._host, self._done, self._keep, self._read = host, done, keep, read

    def result(self) -> np.ndarray:
        """The host array (owned by the caller), once the copy has finished."""
        if self._done is not None:
            self._done.synchronize()
            # Out of page-locked memory, which is scarce: the state may live long.
            self._host = np.array(self._host, copy=True)
        if self._read is not None:
            self._host = self._read(self._host)
        self._done = self._keep = self._read = None
        return self._host


@dataclass
class ArrayBackend(ArrayOps):
    """One compute device and the array module that drives it, and the operations a GPU
    runs as fused kernels (:class:`~.ops.ArrayOps`, each with its numpy form).

    Attributes
    ----------
    name: ``"cpu"`` or ``"cuda:N"``.
    xp: ``numpy`` or ``cupy``.
    threads: host threads the engine may use to process chunks of a batch in parallel
        (CPU: the CPUs available to the process; GPU: 1 — the device is the parallelism).
    fft: the FFT implementation: ``"fftw"`` or ``"pocketfft"`` on CPU, ``"cufft"`` on GPU.
    """

    name: str
    xp: ModuleType
    threads: int = 1
    fft: str = "pocketfft"
    # Device memory the engine may plan for (None: no limit). On a GPU: most of the memory
    # free when the backend was made; on the CPU it can be set to stand in for a small GPU.
    # A scan whose frames do not fit streams them from host memory chunk by chunk.
    memory_limit_bytes: int | None = None
    # Keep integer frames as uint16 counts on the device (half the memory of float32
    # amplitudes; the square root is taken per chunk). On by default on a GPU.
    compact_frames: bool = False
    # The fused kernels of a GPU (:class:`~.kernels.GpuKernels`: the heaviest steps of a
    # sweep in one pass each); None on the CPU, where the engine runs the array code they
    # stand for.
    kernels: Any = None
    # Replay each batch's launches as a CUDA graph where the batch allows (real CuPy only;
    # :mod:`.graphs`). Off: every launch from Python, as on the CPU.
    graphs: bool = True
    _cupy: Any = field(default=None, repr=False)
    _staging: list[Any] = field(default_factory=list, repr=False)
    _offsets: dict[tuple[int, ...], Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # The GPU code path runs the fused kernels where the CPU runs their array code.
        if self._cupy is not None and self.kernels is None:
            raise ValueError("a GPU backend needs its fused kernels (kernels=GpuKernels(cp))")

    @property
    def is_gpu(self) -> bool:
        return self._cupy is not None

    @property
    def fused(self) -> bool:
        """Whether this is real CuPy (not the counting stand-in of the tests): page-locked
        host memory, events and side streams."""
        return self.is_gpu and hasattr(self._cupy, "ElementwiseKernel")

    # -- host <-> device ----------------------------------------------------------------
    def to_device(self, a: Any, dtype: Any = None) -> Any:
        """Copy a host array to the device (no copy on CPU when dtype already matches)."""
        if self.is_gpu:
            return self._cupy.asarray(a, dtype=dtype)
        return np.asarray(a, dtype=dtype)

    def to_host(self, a: Any) -> np.ndarray:
        """Return a host numpy array (the same object on CPU; a copy from the GPU)."""
        if self.is_gpu and isinstance(a, self._cupy.ndarray):
            return self._cupy.asnumpy(a)
        return np.asarray(a)

    def synchronize(self) -> None:
        """Wait for queued device work (for honest timings); a no-op on CPU."""
        if self.is_gpu:
            self._cupy.cuda.get_current_stream().synchronize()

    def scalar(self, a: Any) -> Any:
        """The value of a 0-d reduction for further arithmetic, without waiting for the
        device: a Python float on the CPU; a 0-d float32 array on a GPU (reading it there
        would stall the queue, so the engine never does inside an iteration)."""
        if self.is_gpu:  # a float32 reduction is one already: no copy kernel
            return a if a.dtype == np.float32 else a.astype(np.float32)
        return float(a)

    def scalars(self, a: Any, factor: float = 1.0) -> list[Any]:
        """``factor`` × each value of a small 1-d array, as :meth:`scalar` gives them: Python
        floats on the CPU; 0-d float32 device arrays on a GPU, from one cast and one product
        for all of them (values cast to float32 first, then scaled, as :meth:`scalar`'s
        caller would)."""
        if self.is_gpu:
            v = a if a.dtype == np.float32 else a.astype(np.float32)
            v = factor * v
            return [v[i] for i in range(v.shape[0])]
        return [factor * float(x) for x in a]

    def at_least(self, x: Any, low: float) -> Any:
        """max(x, low) for a :meth:`scalar`."""
        return max(x, low) if isinstance(x, float) else self.xp.maximum(x, low)

    def check_fits(self, nbytes: int, what: str) -> None:
        """Raise :class:`ArrayBackendError` when ``nbytes`` exceed the memory limit."""
        limit = self.memory_limit_bytes
        if limit is not None and nbytes > limit:
            raise ArrayBackendError(
                f"{what} needs {nbytes / 2**30:.2f} GiB of device memory; {self.name} has "
                f"{limit / 2**30:.2f} GiB for it")

    def host_buffer(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An empty host array the device copies from fast (page-locked on a GPU)."""
        if self.fused:
            import cupyx  # noqa: PLC0415

            return cupyx.empty_pinned(shape, dtype)
        return np.empty(shape, dtype)

    def rows_to_device(self, host: np.ndarray, idx: np.ndarray) -> Any:
        """``host[idx]`` on the device (a new array), for frames streamed from host memory.

        GPU: the rows are gathered into one of two page-locked staging buffers and copied
        asynchronously; a buffer is reused only after its previous copy has finished (the
        host waits until the queue has reached that copy, two chunks back, not for the
        queue to drain: streaming trades that wait for running at all)."""
        if not self.fused:
            return self.to_device(host[idx])
        cp = self._cupy
        # Two buffers in turn: the oldest is reused once both exist.
        buf, done = self._staging.pop(0) if len(self._staging) >= 2 else (None, None)
        if done is not None:
            done.synchronize()
        if buf is None or buf.shape[0] < len(idx) or buf.shape[1:] != host.shape[1:] \
                or buf.dtype != host.dtype:
            buf = self.host_buffer((max(len(idx), 1),) + host.shape[1:], host.dtype)
        view = buf[: len(idx)]
        np.take(host, idx, axis=0, out=view)
        stream = cp.cuda.get_current_stream()
        out = cp.empty(view.shape, view.dtype)
        out.set(view, stream=stream)  # page-locked source: an asynchronous copy
        done = cp.cuda.Event()
        done.record(stream)
        self._staging.append([buf, done])
        return out

    def host_copy_async(self, a: Any) -> HostCopy:
        """Start copying a device array to the host without stalling the device's queue.

        GPU: a device-side copy (so later kernels may change ``a``), then a copy to
        page-locked host memory on a side stream; :meth:`HostCopy.result` waits for that
        copy only. Not on real CuPy (the counting stand-in of the tests) the host
        read of the device-side copy waits for :meth:`HostCopy.result` too. CPU, or a host
        array: a plain copy."""
        if not (self.is_gpu and isinstance(a, self._cupy.ndarray)):
            return HostCopy(np.array(a, copy=True))
        if not self.fused:
            return HostCopy(a.copy(), read=self.to_host)
        cp = self._cupy
        snap = a.copy()
        ready = cp.cuda.Event()
        ready.record()
        side = cp.cuda.Stream(non_blocking=True)
        side.wait_event(ready)
        host = self.host_buffer(snap.shape, snap.dtype)
        try:
            snap.get(stream=side, out=host, blocking=False)
        except TypeError:  # CuPy < 13: get() does not block when given a stream
            snap.get(stream=side, out=host)
        done = cp.cuda.Event()
        done.record(side)
        return HostCopy(host, done, keep=(snap, side))

    # -- FFTs -----------------------------------------------------------------------------
    def fft2(self, a: Any, workers: int | None = None) -> Any:
        """Unnormalised forward FFT over the last two axes; may overwrite and return ``a``.

        ``workers``: scipy.fft threads for this call (CPU); default all CPUs for a stack of
        frames and one thread for a single small array (waking threads for one 64x64 FFT
        costs 4x the FFT). Callers that already run in several threads pass 1.
        """
        return self._fft2(a, True, workers, True)

    def ifft2(self, a: Any, workers: int | None = None, scale: bool = True) -> Any:
        """Inverse FFT over the last two axes, normalised by 1/(M·M) (``scale=False``: not —
        for callers that fold the factor into an earlier product); may overwrite ``a``."""
        return self._fft2(a, False, workers, scale)

    def _fft2(self, a: Any, forward: bool, workers: int | None, scale: bool) -> Any:
        norm = "backward" if scale else "forward"  # scipy's and cupy's names; forward: unscaled
        if self.is_gpu:
            import cupyx.scipy.fft as cfft  # noqa: PLC0415

            return (cfft.fft2 if forward else cfft.ifft2)(a, axes=(-2, -1), overwrite_x=True,
                                                          norm=norm)
        if self._fftw_ok(a):
            return _fftw().transform(a, forward, scale)
        workers = workers or self._workers(a)
        pp = _pocketfft()
        if pp is not None and a.dtype == np.complex64 and a.flags.c_contiguous:
            inorm = 0 if forward or not scale else 2
            return pp.c2c(a, (a.ndim - 2, a.ndim - 1), forward, inorm, a, workers)
        sfft = _public_fft()
        return (sfft.fft2 if forward else sfft.ifft2)(a, axes=(-2, -1), overwrite_x=True,
                                                      norm=norm, workers=workers)

    def _fftw_ok(self, a: Any) -> bool:
        return (self.fft == "fftw" and a.dtype == np.complex64 and a.flags.c_contiguous
                and a.flags.writeable)

    def _workers(self, a: Any) -> int:
        return self.threads if a.size >= PARALLEL_FFT_MIN else 1

    # -- patches --------------------------------------------------------------------------
    def gather(self, arr: Any, iy: np.ndarray, ix: np.ndarray, m: int, out: Any = None,
               flat: Any = None, index: Any = None) -> Any:
        """Patches ``arr[iy_j:iy_j+m, ix_j:ix_j+m]`` stacked to ``(b, m, m)`` (a copy).

        ``iy``/``ix`` are integer arrays of top-left corners, already inside ``arr``: on the
        host (CPU), on the host or the device (GPU). ``flat`` (GPU, optional): the corners'
        flat offsets ``iy·W + ix`` on the device for an ``arr`` of W columns, made once per
        chunk — it saves the index arithmetic's kernels in every call; ``index`` (GPU,
        optional): :meth:`window_index` of the corners, made once for several calls.
        """
        if self.is_gpu:
            idx = index if index is not None else self._flat_index(arr.shape[1], iy, ix, m,
                                                                   flat)
            return self.xp.take(arr.ravel(), idx, out=out)
        # fancy indexing of the (H-m+1, W-m+1, m, m) window view copies b contiguous-row
        # blocks in one C loop: measured ~1.5x faster than slicing in a Python loop.
        view = sliding_window_view(arr, (m, m))
        if out is None:
            return view[iy, ix]
        out[...] = view[iy, ix]
        return out

    def scatter_add(self, acc: Any, patches: Any, iy: np.ndarray, ix: np.ndarray) -> None:
        """``acc[iy_j:iy_j+m, ix_j:ix_j+m, ...] += patches[j]`` for every j (overlaps add);
        the CPU's object accumulation (a GPU adds a chunk's terms in one fused kernel,
        :meth:`.kernels.GpuKernels.object_terms`).

        ``acc`` is (H, W, *tail) and ``patches`` (b, m, m, *tail), same dtype.
        A loop of b in-place slice adds. It beat ``np.add.at`` on flat indices
        (1.3-1.8x), ``np.bincount`` (~4x) and ``np.add.at`` on a window view (4-7x) for 400
        patches of 64x64 complex64 (benchmarks/bench_engine.py --scatter-only). Each slice
        add is row-bound (~0.15 µs per row), so separate arrays beat packing them. Each also
        takes and releases the GIL, so the engine's threads scattering at once do not run in
        parallel (two threads: 0.75-0.95x the speed of one). scipy's compiled ``coo_matvec``
        as a scatter-add is one call that releases the GIL and scales (1.3-1.5x with two),
        but costs 1.25-1.5x the loop's CPU: in the engine on 2 cores it made an rPIE
        iteration ~5 % slower against the FFT floor, so the loop stays.
        """
        if self.is_gpu:
            raise ArrayBackendError("scatter_add is the CPU's; a GPU uses its fused kernels")
        m = patches.shape[1]
        for j in range(len(iy)):
            y, x = int(iy[j]), int(ix[j])
            acc[y : y + m, x : x + m] += patches[j]

    def stacked_pair(self, shape: tuple[int, ...], zeroed: bool = False
                     ) -> tuple[Any, Any, Any]:
        """A complex64 and a float32 array of ``shape`` side by side in one float32 buffer
        of 3·size values: (buffer, complex view, float view), both views C-contiguous (CuPy
        reinterprets a dtype of another size only on those). The layout of an object
        accumulator pair (H, W) that :meth:`.kernels.GpuKernels.object_terms` adds to."""
        size = int(np.prod(shape, dtype=np.int64))
        buf = (self.xp.zeros if zeroed else self.xp.empty)(3 * size, np.float32)
        return (buf, buf[: 2 * size].view(np.complex64).reshape(shape),
                buf[2 * size :].reshape(shape))

    def scatter_set(self, arr: Any, patches: Any, iy: np.ndarray, ix: np.ndarray,
                    flat: Any = None, index: Any = None) -> None:
        """``arr[iy_j:iy_j+m, ix_j:ix_j+m] = patches[j]``; the patches must not overlap
        (``flat``, ``index``: as in :meth:`gather`)."""
        m = patches.shape[1]
        if self.is_gpu:
            idx = index if index is not None else self._flat_index(arr.shape[1], iy, ix, m,
                                                                   flat)
            arr.ravel()[idx.ravel()] = patches.ravel()
            return
        for j in range(len(iy)):
            y, x = int(iy[j]), int(ix[j])
            arr[y : y + m, x : x + m] = patches[j]

    def _flat_index(self, row_len: int, iy: np.ndarray, ix: np.ndarray, m: int,
                    flat: Any = None) -> Any:
        """Device int64 flat indices (b, m, m) of m×m windows in a row-major 2-D array of
        ``row_len`` columns.

        The window's own offsets (r·row_len + c) are made once per shape and kept. With
        ``flat`` (iy·row_len + ix, on the device) the corners cost no kernel."""
        xp = self.xp
        key = (row_len, m)
        offsets = self._offsets.get(key)
        if offsets is None:
            r = xp.arange(m, dtype=xp.int64)[:, None] * row_len
            c = xp.arange(m, dtype=xp.int64)[None, :]
            offsets = self._offsets[key] = (r + c)[None]
        if flat is not None:
            base = flat
        else:
            # Corners may be host arrays (uploaded here) or already on the device (no copy).
            base = xp.asarray(iy, dtype=xp.int64) * row_len + xp.asarray(ix, dtype=xp.int64)
        return base[:, None, None] + offsets


def array_backend(device: str = "auto", threads: int | None = None,
                  fft: str | None = None, graphs: bool = True) -> ArrayBackend:
    """Return the backend for ``device``: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    ``"auto"`` picks CUDA when cupy imports and a device is visible (``CUDA_VISIBLE_DEVICES``
    is honoured), else the CPU. ``"cuda"`` without a usable device raises
    :class:`ArrayBackendError` saying why. ``threads`` caps the CPU threads (default: all CPUs
    available to the process). ``fft`` picks the CPU FFT (``"fftw"`` or ``"pocketfft"``;
    default: the first of :func:`cpu_ffts`, FFTW when pyFFTW is installed). ``graphs``: on a
    GPU, replay each batch's launches as a CUDA graph where the batch allows (:mod:`.graphs`).
    """
    dev = (device or "auto").strip().lower()
    if dev == "auto":
        dev = "cuda" if cuda_available() else "cpu"
    if dev == "cpu":
        n = cpu_count() if threads is None else int(threads)
        if n < 1:
            raise ArrayBackendError(f"threads must be >= 1, got {threads}")
        usable = cpu_ffts()
        impl = fft or usable[0]
        if impl not in usable:
            why = ("pyFFTW is not installed (pip install 'beamflow[fftw]')" if impl == "fftw"
                   else f"expected one of {', '.join(usable)}")
            raise ArrayBackendError(f"CPU FFT {impl!r} is not available: {why}")
        return ArrayBackend(name="cpu", xp=np, threads=n, fft=impl)
    if dev == "cuda" or dev.startswith("cuda:"):
        cp = _import_cupy()
        if cp is None:
            raise ArrayBackendError(
                f"device {device!r} requested but cupy is not installed "
                "(pip install 'beamflow[gpu]' for cupy-cuda12x)"
            )
        try:
            count = int(cp.cuda.runtime.getDeviceCount())
        except Exception as exc:
            raise ArrayBackendError(
                f"device {device!r} requested but CUDA is unusable: {exc}") from exc
        if count == 0:
            vis = os.environ.get("CUDA_VISIBLE_DEVICES")
            hint = f" (CUDA_VISIBLE_DEVICES={vis!r})" if vis is not None else ""
            raise ArrayBackendError(
                f"device {device!r} requested but no CUDA device is visible{hint}")
        index = 0
        if ":" in dev:
            try:
                index = int(dev.split(":", 1)[1])
            except ValueError as exc:
                raise ArrayBackendError(f"bad device {device!r}; expected cuda:N") from exc
            if not 0 <= index < count:
                raise ArrayBackendError(
                    f"device {device!r} requested but only {count} CUDA device(s) are visible"
                )
        cp.cuda.Device(index).use()
        # cuFFT plans are cached per shape and batch by CuPy; the sweep uses a few shapes (a
        # chunk, the last chunk of a batch, the probe): keep them all.
        cache = cp.fft.config.get_plan_cache()
        cache.set_size(max(cache.get_size(), 32))
        free = int(cp.cuda.runtime.memGetInfo()[0])
        return ArrayBackend(name=f"cuda:{index}", xp=cp, threads=1, fft="cufft",
                            memory_limit_bytes=int(GPU_MEMORY_FRACTION * free),
                            compact_frames=True, kernels=GpuKernels(cp), graphs=graphs,
                            _cupy=cp)
    raise ArrayBackendError(
        f"unknown device {device!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
