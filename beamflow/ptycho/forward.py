"""The forward model and its adjoint: the data on the device, the modulus constraint, and
the update terms every algorithm accumulates.

Forward model (see /work/shared/PTYCHO_MATH.md): for position j with corner ``n_j`` (integer)
and fractional offset ``δ_j = r_j − n_j`` (|δ| ≤ 1/2),

    P_k,j = F⁻¹[ F[P_k] · exp(−2πi k·δ_j) ]      (probe mode k shifted by δ_j, exactly)
    ψ_jk  = P_k,j · O[n_j : n_j + M]               Ψ_jk = F[ψ_jk]      I_j = Σ_k |Ψ_jk|²

All complex arrays are complex64. The data enter as √I, ifftshifted once, with invalid pixels
zeroed and excluded by the mask, so the hot loop never shifts or square-roots anything (on a
GPU integer frames stay uint16 counts, and the fused modulus kernel takes their root).

The adjoint of the sub-pixel shift is applied wherever an update flows back to the probe:
``Σ_j S_δj^H g_j = F⁻¹[ Σ_j conj(exp(−2πi k·δ_j)) · F[g_j] ]`` — one FFT per position and a
single inverse FFT per batch. With the two exit-wave FFTs and the shifted probe this makes
four FFTs per position and mode per PIE iteration (the FFT floor counts two); on CPU the
engine wins the time back by running the parts of a batch in parallel threads (each FFT
single-threaded, numpy releasing the GIL) on chunks small enough to stay in cache, working
in place, and keeping BLAS (whose own threads would compete) out of the loop.

Denominators of PIE and LSQ-ML (preconditioners such as ``Σ_j |P_j|²``) use the unshifted
probe intensity and object patches: they only scale steps, so this costs no exactness. DM's
object refit is a least-squares projection and uses the shifted probes' intensities.

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

__all__ = ["Core", "Chunk", "ObjectAccumulator"]

# Pixels per work chunk on CPU: 32 windows of 64x64 (1 MiB per complex64 array), so a
# chunk's handful of arrays stays in L3 between the elementwise passes while the per-chunk
# call overhead stays small; fewer windows per chunk for larger frames. Measured (rPIE, 400
# x 64², 2 threads, 30 shuffled rounds against the FFT floor): 32, 64 and 128 windows alike,
# 16 about 3 % slower.
CPU_CHUNK_PX = 32 * 64 * 64
GPU_CHUNK = 4096
MIN_PART = 4
# Object updates smaller than this run in the calling thread (a handoff costs ~50 µs).
PARALLEL_UPDATE_PX = 2**16
# Sub-pixel phase ramps are cached per position on CPU: gathering them costs a third of
# numpy's broadcast outer product. Above this size (bigger scans, where holding ~2x the frames
# again would break the memory budget) they are recomputed per chunk instead. A GPU keeps
# only each position's two (M,) factors (e_y ⊗ e_x is the ramp), made on the device when the
# positions change; the fused kernels make the ramps from them where they are used.
RAMP_CACHE_BYTES = 64 * 2**20


@dataclass
class ObjectAccumulator:
    """An object accumulator pair (see :meth:`Core.accumulators`)."""

    num: Any  # (H, W) complex64: Σ_j conj(P_j)·χ_j
    den: Any  # (H, W) float32: Σ_j |P_j|²
    # GPU: the one float32 buffer of 3·H·W values that num and den are views of; else None.
    buffer: Any = None
    # GPU: the batch's chunks' largest denominators per block of threads, which the fused
    # scatter takes on the way (GpuKernels.object_terms; Core.accumulated_max); else None.
    maxima: list[Any] | None = None
    # Zero everywhere: the last batch's step cleared what the batch had added
    # (Core.apply_object_step), so the next needs no zeroing pass.
    clean: bool = True


@dataclass
class Chunk:
    """One chunk of positions, prepared for the forward model."""

    idx: np.ndarray  # (b,) position indices (host)
    didx: Any  # the same on the device
    iy: np.ndarray  # (b,) integer corners (host)
    ix: np.ndarray
    dy: Any  # the corners on the device (gather/scatter take these)
    dx: Any
    # (b, M, M) complex64 exp(-2πi k·δ_j) (an owned copy); on a GPU its (b, 2, M) factors
    # e_y, e_x (the ramp is their outer product: GpuKernels.ramp_product); None without
    # sub-pixel offsets.
    ramp: Any
    # GPU: the corners' flat offsets iy·W + ix into object-sized arrays, on the device (one
    # upload with the corners; gather and scatter then need no index arithmetic); else None.
    flat: Any = None
    # GPU: the windows' flat indices (b, M, M) into object-sized arrays, made on first use
    # (Core.window_index) and shared by the chunk's gathers and window writes.
    window: Any = None


class Core:
    """Device-side data, the current object/probe, and the operations algorithms share.

    Algorithms call :meth:`map_parts` to run a function over the parts of a batch (one per
    host thread on CPU) and, inside it, the forward/adjoint helpers below on chunks of
    positions. Helpers document which of their arguments they overwrite: the hot path works
    in place to keep numpy's memory traffic down.
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
        propagation = state.params.propagation
        self.near_field = propagation.near_field
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
        h = propagation.transfer(m)
        self.transfer = None if h is None else backend.to_device(h)
        # CuPy scales an inverse FFT in a kernel of its own: one more read and write of the
        # stack. A GPU folds the 1/M² into a product the step makes anyway (the Fourier
        # constraint's, the propagator's) and takes the unscaled transform; the CPU's FFTs
        # scale as they go, and keep them.
        self.ifft_scale = np.float32(1.0 / (m * m)) if backend.is_gpu else None
        self._transfer_scaled = (None if h is None or self.ifft_scale is None
                                 else backend.to_device((h * self.ifft_scale).astype(h.dtype)))
        self.obj = backend.to_device(np.array(state.object, np.complex64, copy=True))
        self.probe = backend.to_device(np.array(state.probe, np.complex64, copy=True))
        self.nominal = data.positions_px.copy()
        cache = (not backend.is_gpu) and self.N * m * m * 8 <= RAMP_CACHE_BYTES
        self._ramps: np.ndarray | None = np.empty((self.N, m, m), np.complex64) if cache else None
        self._ramp_frac = np.full((self.N, 2), np.nan)
        self._dfactors: Any = None  # (N, 2, M) ramp factors on the device (GPU)
        self._pool: ThreadPoolExecutor | None = None
        self._acc: list[ObjectAccumulator] = []
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

        An estimate: the object with one accumulator pair per thread and a spare, the object
        gradient (position correction), the algorithm's reservation, and per position in a
        chunk about 6K+2 complex64 frames of work (shifted probe, exit and detector waves,
        patches, temporaries) plus its frame. ``reserved_bytes`` holds the algorithm's
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
        fixed = reserved_bytes + self.H * self.W * (8 + 12 * (self.backend.threads + 1) + 16)
        return fixed, self.M * self.M * 8 * (6 * self.K + 2) + frame_bytes

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
        if self.backend.is_gpu:  # the chunks' ramps are made in the kernels from these
            self._dfactors = (self._ramp_factors(self.backend.to_device(frac), self.xp)
                              if self.subpixel else None)
        if self._ramps is not None and self.subpixel:
            stale = np.flatnonzero(np.any(self._ramp_frac != frac, axis=1))
            for s in range(0, len(stale), 256):
                j = stale[s : s + 256]
                self._ramps[j] = self._outer_ramps(frac[j], np)
            self._ramp_frac[stale] = frac[stale]

    def _ramp_factors(self, d: Any, xp: Any) -> Any:
        """exp(−2πi k δ) along each axis for each row of d (b, 2) → (b, 2, M) complex64 (y
        then x), made where ``d`` lives (``xp``)."""
        kf = self.kfreq if xp is np else self._dkfreq
        return xp.exp(-2j * np.pi * (d[:, :, None] * kf)).astype(np.complex64)

    def _outer_ramps(self, d: Any, xp: Any) -> Any:
        """exp(−2πi (k_y δy + k_x δx)) for each row of d (b, 2) → (b, M, M) complex64: the
        outer product of :meth:`_ramp_factors`."""
        e = self._ramp_factors(d, xp)
        return e[:, 0, :, None] * e[:, 1, None, :]

    # -- chunks and threads -----------------------------------------------------------------
    def chunk(self, idx: np.ndarray) -> Chunk:
        idx = np.asarray(idx, np.int64)
        ramp = None
        if self.subpixel and not self.backend.is_gpu:
            ramp = self._ramps[idx] if self._ramps is not None else self._outer_ramps(
                self.frac[idx], np)
        iy, ix = self.corner[idx, 0], self.corner[idx, 1]
        didx, dy, dx, flat = idx, iy, ix, None
        if self._bound is not None:  # a graph's batch: the indices are on the device already
            if len(idx) != len(self._bound[0]):
                raise RuntimeError("a bound batch is swept as one chunk")
            didx, dy, dx, flat = self._bound[1]
        elif self.backend.is_gpu:  # one upload per chunk: indices and corners together
            didx, dy, dx, flat = self._index_rows(idx)
        if self.backend.is_gpu and self._dfactors is not None:
            ramp = self._dfactors[didx]  # (b, 2, M): a small gather
        return Chunk(idx=idx, didx=didx, iy=iy, ix=ix, dy=dy, dx=dx, ramp=ramp, flat=flat)

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
        probe, the ramp factors and the frames are (:mod:`.graphs` keys graphs by it)."""
        def at(a: Any) -> int | None:  # CuPy's device pointer; numpy's (the stand-in's)
            if a is None:
                return None
            return int(a.data.ptr) if hasattr(a.data, "ptr") else a.__array_interface__[
                "data"][0]

        return (at(self.obj), at(self.probe), at(self._dfactors), at(self.frames.data),
                self.probe.shape, self.subpixel)

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

    # -- accumulators -----------------------------------------------------------------------
    def accumulators(self, n: int) -> list[ObjectAccumulator]:
        """``n`` persistent object-sized (numerator complex64, denominator float32) pairs.

        On a GPU each pair is two views of one buffer (:meth:`ArrayBackend.stacked_pair`), so
        a chunk's numerators and illumination go in with one scatter; on the CPU two arrays
        (its scatter is a loop of row-bound slice adds: one per array is the fastest)."""
        xp, h, w = self.xp, self.H, self.W
        while len(self._acc) < n:
            if self.backend.is_gpu:
                buf, num, den = self.backend.stacked_pair((h, w), zeroed=True)
                self._acc.append(ObjectAccumulator(num, den, buf, []))
            else:
                self._acc.append(ObjectAccumulator(xp.zeros((h, w), np.complex64),
                                                   xp.zeros((h, w), np.float32)))
        return self._acc[:n]

    def start_accumulator(self, acc: ObjectAccumulator, bb: tuple[slice, slice]) -> None:
        """Ready ``acc`` for a batch whose windows lie in the box ``bb``: zeroed there, unless
        the last batch's step left it clean.

        A GPU's accumulator that is not clean is zeroed whole: a step that clears only its
        own box must find zeros everywhere else."""
        if acc.maxima is not None:
            acc.maxima.clear()
        if acc.clean:
            return
        if acc.maxima is not None:
            acc.buffer.fill(0)
        else:
            acc.num[bb] = 0
            acc.den[bb] = 0

    def combine(self, accs: Sequence[ObjectAccumulator],
                bb: tuple[slice, slice]) -> tuple[Any, Any]:
        """Sum the parts' accumulators over the box ``bb`` into the first (in part order) and
        return its views: no object-sized temporaries at the memory peak."""
        num, den = accs[0].num[bb], accs[0].den[bb]
        for a in accs[1:]:
            num += a.num[bb]
            den += a.den[bb]
        return num, den

    def fused_step(self, accs: Sequence[ObjectAccumulator]) -> bool:
        """Whether the object step from ``accs`` is one kernel over the box that also clears
        the accumulator (:meth:`apply_object_step`): a GPU's, one part."""
        return len(accs) == 1 and accs[0].maxima is not None

    def apply_object_step(self, acc: ObjectAccumulator, bb: tuple[slice, slice], dmax: Any,
                          c_den: float, c_max: float, step: Any = None) -> None:
        """GPU: ``obj[bb] += step · num / (c_den·den + c_max·dmax)`` from ``acc``, which then
        holds zeros again (clean) (:meth:`.kernels.GpuKernels.apply_step`; ``dmax`` from
        :meth:`accumulated_max`, ``step`` a 0-d device array or None)."""
        self.backend.kernels.apply_step(self.obj, acc.buffer, dmax, bb, c_den, c_max, step)
        acc.clean = True

    def accumulated_max(self, acc: ObjectAccumulator) -> Any:
        """GPU: the largest denominator of ``acc`` this batch, from the maxima the scatter
        took (a 0-d float32 device array; one reduction of a few thousand values instead of a
        pass over the box)."""
        most = acc.maxima
        return (most[0] if len(most) == 1 else self.xp.concatenate(most)).max()

    def update_object(self, accs: Sequence[ObjectAccumulator], bb: tuple[slice, slice],
                      step: Callable[[Any, Any, float, tuple[slice, slice]], Any],
                      replace: bool = False, write: bool = True,
                      preconditioner: tuple[float, float] | None = None) -> None:
        """Apply an accumulated object update over the box ``bb``, in row slabs in parallel.

        ``step(num, den, den_max, region)`` gets the summed numerator/denominator of a slab
        (it may overwrite them) and the maximum of the whole denominator, and returns the
        increment (or, with ``replace``, the new values) for the object's ``region``.
        ``write=False``: nothing is written; a step that works in place leaves its results
        in the first accumulator's numerator over ``bb`` (where the parts' sums are
        combined) — no copy of the box. ``preconditioner`` (c_den, c_max): the
        step is num / (c_den·den + c_max·den_max), which a GPU adds to the object in one
        kernel that also clears the accumulator (:meth:`apply_object_step`).
        """
        if preconditioner is not None and write and not replace and self.fused_step(accs):
            self.apply_object_step(accs[0], bb, self.accumulated_max(accs[0]), *preconditioner)
            return
        area = (bb[0].stop - bb[0].start) * (bb[1].stop - bb[1].start)
        n = self.backend.threads if area >= PARALLEL_UPDATE_PX else 1
        rows = np.array_split(np.arange(bb[0].start, bb[0].stop), n)
        slabs = [(slice(int(r[0]), int(r[-1]) + 1), bb[1]) for r in rows if len(r)]
        combined = self.map_list(lambda _t, sl: self.combine(accs, sl), slabs)
        xp = self.xp
        if self.fused_step(accs):  # a GPU: the scatter took the maximum
            dmax = self.accumulated_max(accs[0])
        else:
            top = (_box_max(combined[0][1]) if len(combined) == 1
                   else xp.stack([_box_max(d) for _, d in combined]).max())
            dmax = self.backend.scalar(top)

        def apply(t: int, sl: tuple[slice, slice]) -> None:
            num, den = combined[t]
            upd = step(num, den, dmax, sl)
            if not write:
                return
            if replace:
                self.obj[sl] = upd
            else:  # out= on the view: no copy of the view onto itself after
                region = self.obj[sl]
                xp.add(region, upd, out=region)

        self.map_list(apply, slabs)

    def bbox(self, idx: np.ndarray) -> tuple[slice, slice]:
        """Object region covered by the windows of ``idx``; the whole object for a bound
        batch (:meth:`bind_batch`: a graph's views are the same for every batch)."""
        if self._bound is not None:
            return slice(0, self.H), slice(0, self.W)
        c = self.corner[idx]
        y0, x0 = c.min(axis=0)
        y1, x1 = c.max(axis=0) + self.M
        return slice(int(y0), int(y1)), slice(int(x0), int(x1))

    # -- forward model ----------------------------------------------------------------------
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
            xp, kernels = self.xp, self.backend.kernels
            p = self.probe
            if kernels is not None:  # one kernel over the modes (the array code: 3 or 4)
                self._probe_int = kernels.intensity_sum(p, xp.zeros(p.shape[1:], np.float32))
                return self._probe_int
            k, m = p.shape[0], p.shape[-1]
            pv = p.view(np.float32).reshape(k, 2 * m * m)
            sq = xp.einsum("jp,jp->p", pv, pv)
            self._probe_int = xp.add(sq[0::2].reshape(m, m), sq[1::2].reshape(m, m))
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

    def shifted_probe(self, c: Chunk) -> Any:
        """(b, K, M, M) probe modes shifted by each position's sub-pixel offset (owned).

        Without sub-pixel offsets: the (1, K, M, M) probe itself (a view — do not modify).
        """
        if c.ramp is None:
            return self.probe[None]
        ph = self.probe_hat()
        if self.backend.kernels is not None:
            pd = self.backend.kernels.ramp_product(c.ramp, ph[None])
        else:
            pd = (c.ramp * ph[0])[:, None] if ph.shape[0] == 1 else c.ramp[:, None] * ph[None]
        return self.backend.ifft2(pd, workers=self.fft_workers, scale=False)

    def object_patches(self, c: Chunk, obj: Any = None) -> Any:
        """(b, M, M) copies of the object windows (``obj``: another object-sized array)."""
        return self.backend.gather(self.obj if obj is None else obj, c.dy, c.dx, self.M,
                                   index=self.window_index(c))

    def set_object_patches(self, c: Chunk, patches: Any) -> None:
        """Write (b, M, M) windows into the object; the windows must not overlap."""
        self.backend.scatter_set(self.obj, patches, c.dy, c.dx, index=self.window_index(c))

    def window_index(self, c: Chunk) -> Any:
        """GPU: the chunk's windows' flat indices into object-sized arrays, made once per
        chunk (a gradient's or a direction's gather after the object's costs no index
        kernel); None on the CPU."""
        if c.flat is None:
            return None
        if c.window is None:
            c.window = self.backend.window_index(self.W, self.M, c.flat)
        return c.window

    def exit_wave(self, pd: Any, c: Chunk) -> tuple[Any, Any]:
        """(O_j, ψ_j): the object patches (b, M, M) and the exit waves ψ_jk = P_k,j·O_j
        (b, K, M, M) of the chunk's positions, new arrays. On a GPU one fused kernel
        (:meth:`.kernels.GpuKernels.exit_wave`) does what this array code does."""
        if self.backend.kernels is not None:
            return self.backend.kernels.exit_wave(self.obj, c.flat, pd)
        oj = self.object_patches(c)
        return oj, pd * oj[:, None]

    def to_detector(self, psi: Any, c: Chunk) -> Any:
        """The wave at the detector for the chunk's exit waves ψ (:meth:`exit_wave`; may be
        overwritten), a (b, K, M, M) array.

        Far field: Ψ = F[ψ_j] (FFT order). Near field: Ψ = F⁻¹[G_j · F[ψ_j]] with
        G_j = H · conj(r_j): the angular-spectrum propagator H, and the sub-pixel ramp
        undone. The probe is fixed relative to the detector; the engine's window moves the
        probe by δ_j against the object instead, so the detector sees its wave shifted back
        by δ_j (a shift the far field's intensity cannot see, a hologram can).
        """
        big = self.backend.fft2(psi, workers=self.fft_workers)
        if self.transfer is None:
            return big
        fold = self.ifft_scale is not None
        big *= self._propagator(c, scaled=fold)[:, None]
        return self.backend.ifft2(big, workers=self.fft_workers, scale=not fold)

    def _propagator(self, c: Chunk, adjoint: bool = False, scaled: bool = False) -> Any:
        """G_j = H·conj(r_j) per position (b, M, M), or its conjugate; (1, M, M) H without
        sub-pixel shifts. ``scaled``: times the inverse FFT's 1/M² (a GPU's fold)."""
        xp = self.xp
        transfer = self._transfer_scaled if scaled else self.transfer
        if c.ramp is None:
            g = transfer[None]
            return xp.conj(g) if adjoint else g
        h = xp.conj(transfer) if adjoint else transfer
        if self.backend.kernels is not None:
            return self.backend.kernels.ramp_product(c.ramp, h[None, None], conj=not adjoint)[:, 0]
        g = xp.conj(c.ramp) if not adjoint else c.ramp.copy()
        g *= h
        return g

    def amplitude_residual(self, big_psi: Any, c: Chunk) -> tuple[Any, Any, Any]:
        """Model amplitude and masked residual for a chunk.

        Returns ``(amp, d, loss)``: amp = √(Σ_k |Ψ_k|²) (b, M, M); d = (√I − amp)·mask;
        loss = Σ d² (a device scalar; the numerator of PTYCHO_MATH's loss).
        """
        xp = self.xp
        if big_psi.shape[1] == 1:
            amp = xp.abs(big_psi[:, 0])
        else:
            amp = xp.square(big_psi.real).sum(axis=1)
            amp += xp.square(big_psi.imag).sum(axis=1)
            xp.sqrt(amp, out=amp)
        d = self.frames.amplitudes(c.idx, c.didx)
        xp.subtract(d, amp, out=d)
        if not self.full_mask:
            d *= self.mask
        # Not xp.dot: OpenBLAS threads its dot product, and its spinning workers would
        # compete with the engine's own threads; einsum is numpy's own and 2x square+sum.
        # CuPy's einsum is a cuBLAS call, which a CUDA graph cannot hold (graphs.py): a GPU
        # squares and sums.
        flat = d.reshape(-1)
        loss = xp.square(flat).sum() if self.backend.is_gpu else xp.einsum("i,i->", flat, flat)
        return amp, d, loss

    def modulus_projection(self, big_psi: Any, c: Chunk, scale: Any = None) -> Any:
        """Turn Ψ in place into the far-field correction χ̂ = Ψ'−Ψ; return the loss.

        Ψ' = Ψ·√I/√(Σ_k|Ψ_k|²) on valid pixels; invalid pixels are left free (χ̂ = 0).
        ``scale``: a factor χ̂ is made with (:attr:`ifft_scale`), or None.
        """
        be = self.backend
        if be.kernels is not None and big_psi.shape[1] == 1:
            return be.kernels.modulus(big_psi[:, 0], *self.frames.rows(c.idx, c.didx),
                                      self.mask, self.eps, 1.0 if scale is None else scale)
        amp, d, loss = self.amplitude_residual(big_psi, c)
        amp += self.eps
        d /= amp  # (√I − |Ψ|)/|Ψ| on valid pixels, 0 elsewhere
        if scale is not None:
            d *= scale
        if big_psi.shape[1] == 1:
            # out= on the view: ``a[:, 0] *= d`` would copy the view onto itself after (a
            # second kernel on a GPU).
            psi0 = big_psi[:, 0]
            self.xp.multiply(psi0, d, out=psi0)
        else:
            big_psi *= d[:, None]
        return loss

    def to_sample(self, big_chi: Any, c: Chunk, scaled: bool = False) -> Any:
        """The adjoint of :meth:`to_detector`'s propagation: a detector-plane correction
        back to the exit-wave plane (far field: F⁻¹; near field: F⁻¹[conj(G_j)·F[·]]).
        ``scaled``: ``big_chi`` already carries the inverse FFT's 1/M² (:attr:`ifft_scale`,
        folded into the Fourier constraint)."""
        be = self.backend
        if self.transfer is None:
            return be.ifft2(big_chi, workers=self.fft_workers, scale=not scaled)
        spec = be.fft2(big_chi, workers=self.fft_workers)
        fold = not scaled and self.ifft_scale is not None  # the 1/M² goes into G_j here
        spec *= self._propagator(c, adjoint=True, scaled=fold)[:, None]
        return be.ifft2(spec, workers=self.fft_workers, scale=not (scaled or fold))

    # -- update terms -----------------------------------------------------------------------
    def object_num(self, pd: Any, chi: Any, c: Chunk, keep_probe: bool = False) -> Any:
        """Σ_k conj(P_k,j)·χ_jk → (b, M, M).

        Overwrites an owned ``pd``: conjugated, and with one mode the result is written into
        it (one chunk-sized array fewer at the memory peak) unless ``keep_probe``, which
        leaves ``pd`` as it was (the same kernels: a conjugate into a new array).
        """
        xp = self.xp
        # Unshifted: pd is the (1, K, M, M) probe itself, small and not ours to modify.
        own = c.ramp is not None and not keep_probe
        pdc = xp.conjugate(pd, out=pd) if own else xp.conj(pd)
        if chi.shape[1] == 1:
            return xp.multiply(pdc[:, 0], chi[:, 0], out=pdc[:, 0] if own else None)
        return xp.sum(pdc * chi, axis=1)

    def accumulate_object(self, acc: ObjectAccumulator, pd: Any, chi: Any, c: Chunk,
                          keep_probe: bool = False, shifted: bool = False) -> None:
        """Scatter-add a chunk's object numerators :meth:`object_num` (``pd``, ``chi``,
        ``keep_probe`` as there) and illumination into ``acc``.

        The illumination Σ_k|P_k,j|² uses the shifted probes ``pd`` with ``shifted`` (DM
        needs the exact least-squares denominator), else the unshifted probe intensity: for
        PIE and LSQ-ML it only preconditions the step, and a constant patch saves computing
        |P_j|² per position. On a GPU one fused kernel makes both and adds them in
        (:meth:`.kernels.GpuKernels.object_terms`: this code is what it computes; it leaves
        ``pd`` as it is).
        """
        be, xp = self.backend, self.xp
        exact = shifted and c.ramp is not None
        acc.clean = False
        if acc.buffer is not None:
            acc.maxima.append(be.kernels.object_terms(
                acc.buffer, pd, chi, None if exact else self.probe_intensity(), c.flat,
                self.H, self.W, maxima=True))
            return
        if exact:  # before object_num, which may conjugate pd (the same squares)
            inten = (xp.square(pd.real) + xp.square(pd.imag)).sum(axis=1)
        be.scatter_add(acc.num, self.object_num(pd, chi, c, keep_probe), c.dy, c.dx)
        if not exact:
            inten = self.probe_intensity()
            inten = xp.broadcast_to(inten, (len(c.idx),) + inten.shape)
        be.scatter_add(acc.den, inten, c.dy, c.dx)

    def probe_terms(self, oj: Any, chi: Any, c: Chunk, out_num: Any, out_den: Any,
                    keep: bool = False) -> tuple[Any, Any]:
        """Accumulate Σ_j S_j^H[conj(O_j)·χ_jk] and Σ_j |O_j|²; return (num, den).

        ``out_num``/``out_den`` are the sums so far, added to in place; None for the first
        chunk, whose terms become new sums (no zeroed arrays to add them to: two kernels
        fewer per batch, and the same values — 0 + x is x).
        The numerator is accumulated conjugated, and with sub-pixel shifts in the Fourier
        domain (:meth:`probe_from_terms` undoes both). Overwrites ``chi`` unless ``keep``
        (then the products go to a new array: the same kernels, where a caller that needs
        it after would otherwise copy it first); ``oj`` is left as it is.
        """
        xp, be = self.xp, self.backend
        b, m = oj.shape[0], self.M
        if be.kernels is not None:  # one pass (CuPy's einsum below: transposes and a matmul)
            if out_den is None:
                out_den = xp.zeros((m, m), np.float32)
            be.kernels.intensity_sum(oj, out_den)
        else:
            ov = oj.view(np.float32).reshape(b, 2 * m * m)
            sq = xp.einsum("jp,jp->p", ov, ov)
            if out_den is None:
                out_den = xp.add(sq[0::2].reshape(m, m), sq[1::2].reshape(m, m))
            else:
                out_den += sq[0::2].reshape(m, m)
                out_den += sq[1::2].reshape(m, m)
        # The terms are accumulated conjugated: conj(conj(O_j)·χ_j) = O_j·conj(χ_j), and with
        # sub-pixel shifts conj(F[g]) is the unscaled inverse FFT of conj(g) — no conjugate
        # after the FFT (a kernel per chunk; the same bits: each product and sum is the
        # mirror image of the one it replaces).
        if be.kernels is not None:  # the same products in one pass
            g = be.kernels.conj_product(oj[:, None], chi, xp.empty_like(chi) if keep else chi)
        else:
            g = xp.conj(chi) if keep else xp.conjugate(chi, out=chi)
            if g.shape[1] == 1:
                g0 = g[:, 0]
                xp.multiply(g0, oj, out=g0)
            else:
                g *= oj[:, None]
        if c.ramp is not None:
            # Σ_j conj(r_j)·F[conj(O_j)χ_j] = conj(Σ_j r_j·F⁻¹[O_j·conj(χ_j)]·M²).
            g = be.ifft2(g, workers=self.fft_workers, scale=False)
        k = g.shape[1]
        if be.kernels is not None:  # the ramps (if any) and the sum over positions in one pass
            if out_num is None:
                out_num = xp.zeros((k, m, m), np.complex64)
            be.kernels.position_sum(c.ramp, g, out_num)
            return out_num, out_den
        if c.ramp is not None:
            if g.shape[1] == 1:
                g0 = g[:, 0]
                xp.multiply(c.ramp, g0, out=g0)
            else:
                xp.multiply(c.ramp[:, None], g, out=g)
        terms = g.view(np.float32).reshape(b, k, m, 2 * m).sum(axis=0)
        if out_num is None:
            return terms.view(np.complex64), out_den
        acc = out_num.view(np.float32).reshape(k, m, 2 * m)
        xp.add(acc, terms, out=acc)
        return out_num, out_den

    def probe_from_terms(self, num: Any) -> Any:
        """Finish the probe adjoint from the summed terms (a new array)."""
        xp, be = self.xp, self.backend
        if not self.subpixel:
            return xp.conj(num)
        if self.ifft_scale is None:
            return be.ifft2(xp.conj(num))
        # A GPU: the conjugate and the inverse FFT's 1/M² in one kernel (see ifft_scale).
        g = be.kernels.conj_product(np.complex64(self.ifft_scale), num, xp.empty_like(num))
        return be.ifft2(g, scale=False)

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
        self.probe[...] = self._fourier_shift(self.probe, s)
        self.obj[...] = self._fourier_shift(self.obj[None], s)[0]
        self.probe_changed()
        return s

    def _fourier_shift(self, a: Any, s: tuple[float, float]) -> Any:
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

    def probe_intensity_max(self) -> float:
        return float(self.probe_intensity().max())

    def total(self, values: Sequence[Any]) -> float:
        """Sum device scalars with one host transfer."""
        if not values:
            return 0.0
        xp = self.xp
        return float(self.backend.to_host(xp.sum(xp.stack([xp.asarray(v, xp.float64)
                                                             for v in values]))))


def _box_max(d: Any) -> Any:
    """The maximum of a 2-D box cut from a larger array, row by row first: CuPy reduces a
    strided view to one value on a single block (CUB takes contiguous input only), which
    took 1 ms for a 1100² box on an H100 — three quarters of an rPIE iteration's kernel
    time at 4000 × 128²; a row maximum is a kernel as wide as the box."""
    return d.max(axis=-1).max()
