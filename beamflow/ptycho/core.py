"""The scan on the device: the measured frames, the object layers and probe modes being
reconstructed, the positions and their sub-pixel ramps, and the chunks and threads a batch is
swept in.

Positions (see /work/shared/PTYCHO_MATH.md): position j's window has the integer corner
``n_j`` and the fractional offset ``δ_j = r_j − n_j`` (|δ| ≤ 1/2), which the forward model
applies exactly by shifting the probe (:mod:`.forward`). The data enter as √I, ifftshifted
once for the far field, with invalid pixels zeroed and excluded by the mask, so the hot loop
never shifts or square-roots anything (on a GPU integer frames stay uint16 counts, and the
fused modulus kernel takes their root).

On the CPU a batch's parts run in parallel threads (each FFT single-threaded, numpy releasing
the GIL) on chunks small enough to stay in cache, in place where possible.

Numpy details that matter here (measured, 16 windows of 64x64): broadcasting with a short
inner axis pays ~0.15 µs per row, so outer products and window copies are row-bound; complex
divided by real is a complex division (multiply by a real reciprocal instead); an in-place
conjugate costs half an allocation-and-conjugate.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrays import ArrayBackend
from .frames import frames_are_counts, load_frames
from .state import PtychoData, ReconState

__all__ = ["Chunk", "Core"]

# Pixels per work chunk on CPU: 32 windows of 64x64 (1 MiB per complex64 array), so a
# chunk's handful of arrays stays in L3 between the elementwise passes while the per-chunk
# call overhead stays small; fewer windows per chunk for larger frames. Measured (rPIE, 400
# x 64², 2 threads, 30 shuffled rounds against the FFT floor): 32, 64 and 128 windows alike,
# 16 about 3 % slower.
CPU_CHUNK_PX = 32 * 64 * 64
GPU_CHUNK = 4096
MIN_PART = 4
# Sub-pixel phase ramps are kept per position (:meth:`.arrays.ops.ArrayOps.phase_ramps`): gathering
# them costs a third of numpy's broadcast outer product. Above this size (bigger scans, where
# holding ~2x the frames again would break the memory budget) the CPU makes them per chunk
# instead; a GPU keeps only each position's two (M,) factors, and always keeps them (a CUDA
# graph reads them where they lie).
RAMP_CACHE_BYTES = 64 * 2**20


@dataclass
class Chunk:
    """One chunk of positions, prepared for the forward model."""

    idx: np.ndarray  # (b,) position indices (host)
    didx: Any  # the same on the device
    iy: np.ndarray  # (b,) integer corners (host)
    ix: np.ndarray
    dy: Any  # the corners on the device (gather/scatter take these)
    dx: Any
    # The positions' sub-pixel ramps in the backend's form (ArrayOps.phase_ramps); None
    # without sub-pixel offsets.
    ramp: Any
    m: int  # the window's size
    width: int  # the object's row length
    # GPU: the corners' flat offsets iy·W + ix into object-sized arrays, on the device (one
    # upload with the corners; gather and scatter then need no index arithmetic); else None.
    flat: Any = None
    # GPU: the windows' flat indices (b, M, M) into object-sized arrays, made on first use
    # (ArrayOps.window_index) and shared by the chunk's gathers and window writes.
    window: Any = None


class Core:
    """The scan on the device (frames, object layers ``obj`` (S, H, W), probe modes ``probe``
    (K, M, M), positions) and the chunks and threads a batch is swept in.

    Algorithms call :meth:`map_parts` to run a function over the parts of a batch (one per
    host thread on CPU) and, inside it, the forward model (:mod:`.forward`) on chunks of
    positions (:meth:`subchunks`, :meth:`chunk`).
    """

    def __init__(self, data: PtychoData, state: ReconState, backend: ArrayBackend,
                 consume: bool = False, reserved_bytes: int = 0):
        self.backend = backend
        self.xp = backend.xp
        # No reference to data is kept: after this the caller may free the intensities.
        self.M = m = data.frame_size
        self.K = state.probe.shape[0]
        self.N = data.n_positions
        self.H, self.W = data.object_shape
        self.S = state.layers
        self.near_field = state.params.propagation.near_field
        # Measured amplitudes with invalid pixels zeroed (they may hold NaN). Far field:
        # ifftshifted once, so the FFT's output needs no shift; near field: the hologram is
        # in real space and stays as recorded. Consuming (CPU): written over the
        # intensities, block by block. ``reserved_bytes``: the algorithm's own device memory
        # (DM's exit waves), for the memory plan.
        def to_engine(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
            return a.copy() if self.near_field else np.fft.ifftshift(a, axes=axes)

        mask_s = to_engine(data.mask, (0, 1))
        counts = backend.compact_frames and frames_are_counts(data.intensities, data.mask)
        self.chunk_size = GPU_CHUNK if backend.is_gpu else max(1, CPU_CHUNK_PX // (m * m))
        frame_bytes = m * m * (2 if counts else 4)
        resident = self._plan_memory(frame_bytes, reserved_bytes)
        self.frames, norm, max_amp = load_frames(
            data.intensities, mask_s, backend, lambda a: to_engine(a, (-2, -1)), counts,
            resident, in_place=consume and not backend.is_gpu)
        if consume:
            data.consume()
        self.mask = backend.to_device(mask_s.astype(np.float32))
        self.full_mask = bool(mask_s.all())
        self.norm = max(norm, float(np.finfo(np.float64).tiny))
        # The mean measured intensity of a valid pixel (a scale for noise floors).
        self.mean_intensity = self.norm / (self.N * max(1, int(mask_s.sum())))
        # Guards 0/0 in the modulus constraint; far below any measured amplitude.
        self.eps = np.float32(1e-6 * max(max_amp, 1e-30))
        self.kfreq = np.fft.fftfreq(m)  # cycles per pixel, FFT order
        self._dkfreq = backend.to_device(self.kfreq)
        # A GPU folds the inverse FFT's 1/M² into a product the step makes anyway (the
        # Fourier constraint's, the propagator's: ArrayOps.folds_ifft_scale); else None.
        self.ifft_scale = np.float32(1.0 / (m * m)) if backend.folds_ifft_scale else None
        self.obj = backend.to_device(np.array(state.object_layers, np.complex64, copy=True))
        self.probe = backend.to_device(np.array(state.probe, np.complex64, copy=True))
        self.nominal = data.positions_px.copy()
        per_position = self._phase_ramps(np.zeros((1, 2))).nbytes
        cache = backend.is_gpu or self.N * per_position <= RAMP_CACHE_BYTES
        self._ramps: Any = None
        self._ramp_frac = np.full((self.N, 2), np.nan) if cache else None
        self._pool: ThreadPoolExecutor | None = None
        self._probe_hat = None
        self._probe_int = None
        # A batch bound for a CUDA graph (:meth:`bind_batch`): its host indices and the
        # device buffer of its indices, corners and flat offsets; one buffer per length.
        self._bound: tuple[np.ndarray, Any] | None = None
        self._index_buffers: dict[int, Any] = {}
        self.set_positions(np.array(state.positions_px, np.float64, copy=True))

    # -- memory -----------------------------------------------------------------------------
    def _plan_memory(self, frame_bytes: int, reserved_bytes: int) -> bool:
        """Whether the frames fit on the device beside everything else; if not, they are
        streamed and the chunk shrinks until a chunk's working arrays fit.

        An estimate: each object layer with one accumulator pair per thread and a spare,
        the object gradient (position correction), the algorithm's reservation, and per
        position in a chunk about 6K+2 complex64 frames of work (shifted probe, exit and
        detector waves, patches, temporaries) and 2K+1 more per further layer (its incident
        wave and patches), plus its frame. ``reserved_bytes`` holds the algorithm's
        memory."""
        be = self.backend
        limit = be.memory_limit_bytes
        if self._fits(frame_bytes, reserved_bytes):
            return True
        fixed, per_position = self._memory_terms(frame_bytes, reserved_bytes)
        be.check_fits(fixed + per_position,
                      f"a reconstruction of a {self.H} x {self.W} object with {self.M}x{self.M} "
                      "frames streamed one at a time")
        self.chunk_size = max(1, min(self.chunk_size, (limit - fixed) // per_position))
        return False

    def _memory_terms(self, frame_bytes: int, reserved_bytes: int) -> tuple[int, int]:
        """(fixed bytes, bytes per position of a chunk) of :meth:`_plan_memory`'s estimate."""
        layer = self.H * self.W * (8 + 12 * (self.backend.threads + 1))
        fixed = reserved_bytes + self.S * layer + self.H * self.W * 16
        work = 6 * self.K + 2 + (self.S - 1) * (2 * self.K + 1)
        return fixed, self.M * self.M * 8 * work + frame_bytes

    def _fits(self, frame_bytes: int, reserved_bytes: int) -> bool:
        """Whether resident frames and a full chunk fit beside ``reserved_bytes``."""
        limit = self.backend.memory_limit_bytes
        if limit is None:
            return True
        fixed, per_position = self._memory_terms(frame_bytes, reserved_bytes)
        return fixed + self.N * frame_bytes + self.chunk_size * per_position <= limit

    # -- positions --------------------------------------------------------------------------
    def set_positions(self, pos: np.ndarray) -> None:
        """Set the (N, 2) positions; split into integer corners and sub-pixel fractions."""
        m = self.M
        pos = np.asarray(pos, np.float64)
        corner = np.rint(pos)
        # Keep every window inside the object (position correction may push at the edge).
        corner[:, 0] = np.clip(corner[:, 0], 0, self.H - m)
        corner[:, 1] = np.clip(corner[:, 1], 0, self.W - m)
        frac = np.clip(pos - corner, -0.5, 0.5)
        self.pos = corner + frac
        self.corner = corner.astype(np.int64)
        self.frac = frac
        self.subpixel = bool(np.any(frac != 0.0))
        if self._ramp_frac is None or not self.subpixel:
            return
        be = self.backend
        stale = np.flatnonzero(np.any(self._ramp_frac != frac, axis=1))
        for s in range(0, len(stale), 256):
            j = stale[s : s + 256]
            rows = self._phase_ramps(frac[j])
            if self._ramps is None:
                self._ramps = be.xp.empty((self.N,) + rows.shape[1:], np.complex64)
            self._ramps[be.to_device(j)] = rows
        self._ramp_frac[stale] = frac[stale]

    def _phase_ramps(self, frac: np.ndarray) -> Any:
        """The ramps of the rows of ``frac`` (b, 2), made on the device."""
        return self.backend.phase_ramps(self.backend.to_device(frac), self._dkfreq)

    # -- chunks and threads -----------------------------------------------------------------
    def chunk(self, idx: np.ndarray) -> Chunk:
        idx = np.asarray(idx, np.int64)
        iy, ix = self.corner[idx, 0], self.corner[idx, 1]
        didx, dy, dx, flat = idx, iy, ix, None
        if self._bound is not None:  # a graph's batch: the indices are on the device already
            if len(idx) != len(self._bound[0]):
                raise RuntimeError("a bound batch is swept as one chunk")
            didx, dy, dx, flat = self._bound[1]
        elif self.backend.is_gpu:  # one upload per chunk: indices and corners together
            didx, dy, dx, flat = self._index_rows(idx)
        ramp = None
        if self.subpixel:  # a gather of the positions' ramps (GPU: of their factors)
            ramp = self._phase_ramps(self.frac[idx]) if self._ramps is None else self._ramps[
                didx]
        return Chunk(idx=idx, didx=didx, iy=iy, ix=ix, dy=dy, dx=dx, ramp=ramp, m=self.M,
                     width=self.W, flat=flat)

    # -- batches for CUDA graphs (see .graphs) -----------------------------------------------
    def graphable(self, b: int) -> bool:
        """Whether a batch of ``b`` positions can run as a CUDA graph: real CuPy with graphs
        on, frames on the device, and the batch one part and one chunk."""
        be = self.backend
        return (be.fused and be.graphs and self.frames.resident and be.threads == 1
                and b <= self.chunk_size)

    def bind_batch(self, idx: np.ndarray) -> None:
        """Copy a batch's indices, corners and flat offsets into the device buffer kept for
        its length: until :meth:`unbind`, :meth:`chunk` takes them from there and
        :meth:`bbox` is the whole object, so the batch's launches are the same for every
        batch of that length."""
        idx = np.asarray(idx, np.int64)
        rows = self._index_rows(idx)
        buf = self._index_buffers.get(len(idx))
        if buf is None:
            buf = self._index_buffers[len(idx)] = self.xp.empty_like(rows)
        buf[...] = rows
        self._bound = (idx, buf)

    def _index_rows(self, idx: np.ndarray) -> Any:
        """(4, b) on the device, one upload: the indices, the corners' rows and columns, and
        their flat offsets iy·W + ix."""
        iy, ix = self.corner[idx, 0], self.corner[idx, 1]
        return self.backend.to_device(np.stack([idx, iy, ix, iy * self.W + ix]))

    def unbind(self) -> None:
        self._bound = None

    def state_key(self) -> tuple[Any, ...]:
        """The device memory a batch's graph reads beyond its own: where the object, the
        probe, the ramps and the frames are (:mod:`.graphs` keys graphs by it)."""
        def at(a: Any) -> int | None:  # CuPy's device pointer; numpy's (the stand-in's)
            if a is None:
                return None
            return int(a.data.ptr) if hasattr(a.data, "ptr") else a.__array_interface__[
                "data"][0]

        return (at(self.obj), at(self.probe), at(self._ramps), at(self.frames.data),
                self.probe.shape, self.subpixel)

    def bbox(self, idx: np.ndarray) -> tuple[slice, slice]:
        """Object region covered by the windows of ``idx``; the whole object for a bound
        batch (:meth:`bind_batch`: a graph's views are the same for every batch)."""
        if self._bound is not None:
            return slice(0, self.H), slice(0, self.W)
        c = self.corner[idx]
        y0, x0 = c.min(axis=0)
        y1, x1 = c.max(axis=0) + self.M
        return slice(int(y0), int(y1)), slice(int(x0), int(x1))

    def split(self, idx: np.ndarray) -> list[np.ndarray]:
        """Split a batch into one contiguous part per thread (deterministic).

        Parts have at least ``MIN_PART`` positions: handing two windows to another thread
        costs more than it saves.
        """
        t = min(self.backend.threads, len(idx) // MIN_PART)
        return [p for p in np.array_split(np.asarray(idx, np.int64), max(t, 1)) if len(p)]

    def map_parts(self, fn: Callable[[int, np.ndarray], Any], idx: np.ndarray) -> list[Any]:
        """Run ``fn(part_number, part_indices)`` for each thread's part of ``idx``.

        Part 0 runs in the calling thread. Results come back in part order, so every
        reduction over parts is deterministic for a given thread count.
        """
        return self.map_list(fn, self.split(idx))

    def map_list(self, fn: Callable[[int, Any], Any], items: Sequence[Any]) -> list[Any]:
        if len(items) <= 1:
            return [fn(0, p) for p in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=max(1, self.backend.threads - 1), thread_name_prefix="ptycho"
            )
            # Release the workers even if the owner forgets close().
            weakref.finalize(self, self._pool.shutdown, wait=False)
        futures = [self._pool.submit(fn, t, p) for t, p in enumerate(items) if t > 0]
        first = fn(0, items[0])
        return [first] + [f.result() for f in futures]

    def subchunks(self, part: np.ndarray) -> list[np.ndarray]:
        n = len(part)
        k = max(1, math.ceil(n / self.chunk_size))
        return [c for c in np.array_split(part, k) if len(c)]

    @property
    def fft_workers(self) -> int:
        """FFT threads inside one part: 1 when parts already run in parallel threads."""
        return 1 if self.backend.threads > 1 else self.backend.threads

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- the probe --------------------------------------------------------------------------
    def spectrum(self, probe: Any) -> Any:
        """F[P]/(M·M) of (K, M, M) probe modes (a new array): the unnormalised inverse FFT of
        ``ramp · spectrum`` is the shifted probe, which saves a scaling pass per chunk."""
        scale = np.float32(1.0 / (self.M * self.M))
        if self.M & (self.M - 1) == 0:
            # A power of two scales exactly, before the FFT as after it: the scaled copy is
            # the FFT's input (two kernels instead of a copy, the FFT and the scaling).
            return self.backend.fft2(probe * scale)
        ph = self.backend.fft2(probe.copy())
        ph *= scale
        return ph

    def probe_hat(self) -> Any:
        """:meth:`spectrum` of the current probe (cached until :meth:`probe_changed`)."""
        if self._probe_hat is None:
            self._probe_hat = self.spectrum(self.probe)
        return self._probe_hat

    def probe_intensity(self) -> Any:
        """Σ_k |P_k|² (M, M) float32 of the current probe (cached)."""
        if self._probe_int is None:
            self._probe_int = self.backend.intensity_sum(self.probe)
        return self._probe_int

    def set_illumination(self, intensity: Any) -> None:
        """Replace :meth:`probe_intensity` (M, M) until the probe changes: a variable probe
        (``opr``) gives the mean over positions, which the preconditioners need."""
        self._probe_int = intensity

    def probe_changed(self) -> None:
        self._probe_hat = None
        self._probe_int = None

    def prepare(self) -> None:
        """Compute probe caches before threads read them."""
        self.probe_hat()
        self.probe_intensity()

    # -- utilities --------------------------------------------------------------------------
    def center_probe(self, threshold_px: float = 0.25) -> tuple[float, float] | None:
        """Move the probe's intensity centroid back to the window centre, and the object
        with it (exit waves then only translate within their windows, which the far field
        cannot see). Returns the shift s applied (P(u) ← P(u+s), O(r) ← O(r+s)), or None
        when the centroid is within ``threshold_px``."""
        xp, m = self.xp, self.M
        w = self.probe_intensity()
        grid = xp.arange(m, dtype=np.float32)
        # One read of the device for the three sums.
        tot, sy, sx = (float(v) for v in self.backend.to_host(xp.stack([
            w.sum(), (w.sum(axis=1) * grid).sum(), (w.sum(axis=0) * grid).sum()])))
        if tot <= 0:
            return None
        cy, cx = sy / tot, sx / tot
        s = (cy - (m - 1) / 2, cx - (m - 1) / 2)
        if max(abs(s[0]), abs(s[1])) < threshold_px:
            return None
        # Into their own memory: the batches' CUDA graphs read them there (graphs.py).
        self.probe[...] = self.fourier_shift(self.probe, s)
        self.obj[...] = self.fourier_shift(self.obj, s)
        self.probe_changed()
        return s

    def fourier_shift(self, a: Any, s: tuple[float, float]) -> Any:
        """a(u + s) for a (..., Y, X) stack, periodic, exact for band-limited fields."""
        ramp = self.shift_ramp(a.shape[-2:], s)
        return self.backend.ifft2(self.backend.fft2(a.copy()) * ramp).astype(np.complex64)

    def shift_ramp(self, shape: tuple[int, int], s: tuple[float, float]) -> Any:
        """exp(+2πi k·s) on an FFT grid of ``shape``: multiplying a spectrum by it maps
        f(u) to f(u + s)."""
        ky = np.fft.fftfreq(shape[0])[:, None]
        kx = np.fft.fftfreq(shape[1])[None, :]
        return self.backend.to_device(
            np.exp(2j * np.pi * (ky * s[0] + kx * s[1])).astype(np.complex64))

    def total(self, values: Sequence[Any]) -> float:
        """Sum device scalars with one host transfer."""
        if not values:
            return 0.0
        xp = self.xp
        return float(self.backend.to_host(xp.sum(xp.stack([xp.asarray(v, xp.float64)
                                                             for v in values]))))
