"""Fused GPU kernels: one pass over a chunk's arrays where array code takes several.

On a GPU the sweep is memory-bound and launch-bound: every element-wise step of the array
code reads and writes whole (b, K, M, M) stacks and costs the host a launch. The steps below
are the heaviest of a PIE or LSQ-ML batch, each written here once as a kernel that does the
same arithmetic in one pass. The array code they stand for is the specification: on the CPU
the engine runs it as it is (``tests/kits/reference_kernels.py`` writes it out per kernel for the
GPU stand-ins of the tests), and ``tests/ptycho/gpu/test_ptycho_engine_gpu.py`` compares each kernel
with it on a card.

* :meth:`GpuKernels.ramp_product` — a sub-pixel phase ramp r_j = exp(−2πi k·δ_j) times a
  (b, K, M, M) stack, the ramp made in the kernel from its two (M,) factors per position
  (e_y ⊗ e_x). Array code keeps the (N, M, M) ramps (0.5 GB at 4000 × 128², 5 GB at
  10000 × 256²), gathers a chunk's (2 passes) and multiplies (3); the kernel reads the
  stack once and writes it once, and the device holds (N, 2, M) factors.
* :meth:`GpuKernels.exit_wave` — the object patches O_j gathered at the windows and the exit
  waves ψ_jk = P_k,j·O_j (:meth:`~beamflow.ptycho.arrays.ops.ArrayOps.exit_wave`). Array
  code: an int64 index stack, a gather over it and a product — 7 passes; the kernel reads
  the window and P_j once and writes O_j and ψ_j (4).
* :meth:`GpuKernels.object_terms` — Σ_k conj(P_k,j)·χ_jk and the illumination scatter-added
  into the object accumulator pair (:meth:`~beamflow.ptycho.arrays.ops.ArrayOps.object_terms`).
  Array code: a conjugate, a product, the illumination broadcast, two index kernels and an
  atomic scatter over int64 indices — ~16 passes of the stack; the kernel reads P_j and χ_j
  once and adds in place (the accumulator is object-sized: its atomics mostly hit the
  cache), and takes the largest denominator on the way (no pass over the object box for it).
* :meth:`GpuKernels.apply_step` — the object step from the accumulator pair over the box,
  num / (c_den·den + c_max·max) (rPIE's; LSQ-ML's direction times its step length), added to
  the object, and the pair cleared for the next batch, in one pass that skips pixels no
  window reached: it replaces a zeroing of the pair, a maximum, and one or two passes over
  the box (rPIE 40 bytes a pixel, LSQ-ML 68; now 12, and 28 more where the batch reached).
* :meth:`GpuKernels.position_sum` — the probe terms' ramps times the stack, summed over the
  batch's positions (a ramp product that wrote the stack and a sum that read it, as one
  read).
* :meth:`GpuKernels.step_systems` — LSQ-ML's step-length systems: the directions at each
  position, P_j·ΔO_j (ΔO made at the window from the accumulator pair) and O_j·S_j[ΔP], and
  the five sums of their
  2×2 system, Re Σ conj(d_s)·d_t and Re Σ conj(d_s)·χ_j. Array code: two gathers, two
  products into a (b, 2, K, M, M) stack, and products and sums over it — ~30 passes and a
  dozen launches; the kernel reads each operand once and writes five numbers a position.
* :meth:`GpuKernels.step_lengths` — the batch's 2×2 solve from the five summed sums, the
  clip at 0 and the damping: ~14 kernels on 0-d and (2,) arrays as one thread.
* :meth:`GpuKernels.intensity_sum` — the probe's illumination Σ_j |O_j|² over a batch. On
  CuPy the array code's ``einsum("jp,jp->p")`` is two transposed copies and a batched matrix
  product of 2·M² dot products; the kernel reads the patches once.
* :meth:`GpuKernels.conj_product` — conj(χ_jk)·O_j for the probe terms: a conjugate and a
  product (5 passes) as one (3).
* :meth:`GpuKernels.preconditioned_step` — the probe's preconditioned steps (rPIE, mPIE,
  LSQ-ML's direction) and sparse rPIE's window steps, num / (c_den·den + c_max·max): four
  kernels (scale, the 0-d product, add, reciprocal) and the product as one; with ``into``
  the step is added to the probe. :meth:`GpuKernels.axpy` adds LSQ-ML's scaled probe
  direction the same way.
* :meth:`GpuKernels.modulus` — the one-mode modulus projection: |Ψ|, the residual, its square
  for the loss and the correction (seven passes) as one kernel and one sum.

This module does not import CuPy: :func:`~beamflow.ptycho.arrays.array_backend` hands it the
module. The raw kernels' sources are plain CUDA C in ``cuda/*.cu`` (shared device functions
in ``*.cuh``, prepended where a kernel uses them), read as package data; no CuPy headers, so
``tests/ptycho/gpu/test_gpu_kernels.py`` runs them on machines without a GPU — compiled as
C++ beside a
stand-in for CUDA's built-ins, every thread in turn, against the array code — and compiles
them with NVRTC where it is installed.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import numpy as np

__all__ = ["APPLY_STEP_SOURCE", "EXIT_WAVE_SOURCE", "INTENSITY_SUM_SOURCE", "MAX_GRID_Y",
           "MODULUS_SOURCE", "OBJECT_TERMS_SOURCE", "POSITION_SUM_SOURCE",
           "RAMP_PRODUCT_SOURCE", "STEP_LENGTHS_SOURCE", "STEP_SYSTEMS_SOURCE",
           "SUM_POSITIONS", "SYSTEM_PIXELS", "GpuKernels", "THREADS", "modulus_source",
           "position_grid", "system_grid"]


def _cuda(name: str) -> str:
    """A kernel's CUDA C source, shipped beside this module in ``cuda/`` (package data)."""
    return (resources.files(__package__) / "cuda" / name).read_text(encoding="utf-8")


THREADS = 256

# Index arithmetic of the per-position kernels below (ramp product, exit wave, object terms):
# a 2-D grid whose y dimension is the position j and whose x dimension covers one position's
# pixels (K·M·M or M·M, indexed with 32-bit ints), so no thread divides a 64-bit integer.
# With one thread per element of the whole chunk, each thread split its 64-bit index as
# i / (K·M·M), q % M², p / M on ``long long``, which the GPU emulates in many instructions:
# measured with Nsight Compute on an H100 (one rPIE iteration, 4000 positions × 128², batch
# 128) these kernels ran at 0.4–0.6 TB/s (ramp product), 1.7 TB/s (exit wave) and 1.5 TB/s
# (object terms) against ~3 TB/s of copy bandwidth: bound by that arithmetic, not by memory.
# Now only 32-bit divisions by M (or M²) remain; offsets past 2³¹ (j·K·M² and the like) are
# 64-bit through ``(long long)j``. gridDim.y is at most 65535 and a chunk may hold more
# positions, so each thread strides over j by gridDim.y. A position's K·M·M elements must
# fit an int (2³¹: K·M² at M = 1024 allows 2048 modes).
MAX_GRID_Y = 65535


def position_grid(pixels: int, b: int) -> tuple[int, int]:
    """The 2-D grid of a per-position kernel: blocks of THREADS over a position's ``pixels``
    in x, the ``b`` positions in y (at most MAX_GRID_Y rows; the kernel strides over the
    rest)."""
    return max(1, -(-pixels // THREADS)), max(1, min(b, MAX_GRID_Y))


# The sub-pixel ramp of position j at pixel (y, x), r_j(y, x) = e_j,y(y)·e_j,x(x), from its
# two (M,) factors in ``e`` (b, 2, M): the one way the kernels below make it.
RAMP_SOURCE = _cuda("ramp.cuh")

# One thread per element q of a position's (K, M, M) stack, for positions j = blockIdx.y,
# blockIdx.y + gridDim.y, …: r_j(y, x) = e_j,y(y)·e_j,x(x) from the factors ``e`` (b, 2, M)
# (conjugated when ``conj``), times a_jk(y, x) (``a_stride``: 0 for one (1, K, M, M) stack
# shared by every position), written to ``out`` (b, K, M, M). ``out`` may be ``a``.
RAMP_PRODUCT_SOURCE = RAMP_SOURCE + _cuda("ramp_product.cu")

# One thread per pixel p of a position's window, for positions j = blockIdx.y, blockIdx.y +
# gridDim.y, …: O_j(p) read from the object (H, W) at the window's corner ``flat[j]``
# (iy·W + ix) and written to ``oj`` (b, M, M), and the product P_k,j(p)·O_j(p) of every
# mode written to ``psi`` (b, K, M, M) — numpy's complex product, in its order.
# ``pd_stride`` as in beamflow_object_terms.
EXIT_WAVE_SOURCE = _cuda("exit_wave.cu")

# A warp's 32 values summed (shuffles, float64) for one atomic add by its first lane, where
# thousands of threads would otherwise add into the same few addresses one at a time; and a
# block's maximum, written by its first thread. The
# CPU's thread-by-thread run of the sources (tests/ptycho/gpu/test_gpu_kernels.py) defines
# BEAMFLOW_ONE_THREAD: there each thread adds its own value (the same total).
WARP_SUM_SOURCE = _cuda("warp_sum.cuh")

# One thread per pixel p of a position's window, for positions j = blockIdx.y, blockIdx.y +
# gridDim.y, …: the K modes' conj(P)·χ summed, and the illumination (Σ_k |P_k,j|² when
# ``exact``, else the shared intensity patch), added atomically at the window's place in
# the accumulator pair — [(H, W) complex64 as float pairs | (H, W) float32], the layout of
# ArrayBackend.stacked_pair. ``pd_stride``: elements between positions of ``pd`` (0 for the
# unshifted (1, K, M, M) probe). With ``most`` the denominator's maximum comes on the way:
# an atomic add returns the value it added to, so old + den is a value the pixel holds at
# some point, and the last add at a pixel leaves its final value. The denominators only grow
# (den ≥ 0), so the largest of these over the batch is the largest denominator — the same
# float as a maximum over the accumulator after (both round to nearest), with no pass over
# the object box for it (43 µs a batch at 10000 × 256² on the H100). Each block writes its
# threads' largest to most[block] (gridDim.x·gridDim.y floats; GpuKernels.object_terms
# reduces them). One atomic maximum a warp into one address instead serialised 260 000 of
# them a batch: 0.85 ms, six times the kernel's own time (H100, 10000 × 256², batch 128).
OBJECT_TERMS_SOURCE = WARP_SUM_SOURCE + _cuda("object_terms.cu")

# One thread per pixel of a box of the object (rows y0 … y0 + rows − 1, columns x0 … x0 +
# cols − 1 of the (H, W) object): the step num / (c_den·den + c_max·max) from the
# accumulator pair ``acc`` (as in beamflow_object_terms; ``top``: its denominator's maximum,
# a float32 on the device), times ``step`` (a float32 on the device; null: 1), added to the object,
# and the pair cleared at the pixel for the next batch. A pixel no window of the batch
# reached holds zeros: it is left alone, object and pair (the step there is zero). rPIE's
# step, LSQ-ML's direction and step; it replaces a zeroing of the pair over the box before
# the batch, a maximum over the box, and one or two passes over it (rPIE 40 bytes a pixel of
# the box, LSQ-ML 68), with 12 bytes a pixel read and 28 more where the windows reached.
APPLY_STEP_SOURCE = _cuda("apply_step.cu")

# Σ_j r_j(q)·a_j(q) over a batch's (b, K, M, M) stack, with r_j the ramp of factors ``e``
# (b, 2, M) (as beamflow_ramp_product makes it; ``e`` null: no ramp), added into ``out``
# (K, M, M) complex64: the probe terms' sum over the positions. One thread per (element q,
# group of SUM_POSITIONS positions), one atomic add per thread and component. It replaces a
# ramp product that wrote the stack and a sum that read it again (an LSQ-ML batch at
# 10000 × 256²: 49 + 40 µs on the H100).
POSITION_SUM_SOURCE = RAMP_SOURCE + _cuda("position_sum.cu")


# Positions each thread of beamflow_intensity_sum adds up (the grid's second dimension
# splits the batch in groups of this many).
SUM_POSITIONS = 16

# Σ_j |a_j(p)|² over a batch's (b, M, M) stack, added into ``out`` (M·M float32): one thread
# per (pixel p, group of SUM_POSITIONS positions), consecutive threads on consecutive pixels,
# one atomic add per thread.
INTENSITY_SUM_SOURCE = _cuda("intensity_sum.cu")


# Pixels of each mode that one thread of the step systems sums: a position gets
# ceil(M² / SYSTEM_PIXELS) threads (``position_grid``), so a batch of b positions fills the
# card (a fixed 64 threads a position left a batch of 128 on 32 blocks: a quarter of an
# H100's SMs, 0.27 TB/s measured).
SYSTEM_PIXELS = 16

# One position's 2×2 least-squares system for LSQ-ML's step lengths (β_O, β_P):
# d0 = P_j·ΔO[window j] (``upd_obj``; ΔO = num / (den + alpha·max) made here from the
# accumulator pair ``acc`` and its maximum ``top`` as in beamflow_apply_step, so the
# direction is never written over the object), d1 = O_j·S_j[ΔP] (``upd_probe``; ``sp``: the shifted
# ΔP, (b, K, M, M), or (1, K, M, M) without sub-pixel shifts: ``sp_stride`` 0), and the row
# [Re Σ|d0|², Re Σ conj(d0)·d1, Re Σ|d1|², Re Σ conj(d0)·χ, Re Σ conj(d1)·χ] added to
# ``out`` (b, 5) float64, zeroed by the caller. A missing direction is zero, so are its sums.
# On the per-position grid of the kernels above: the T = gridDim.x·blockDim.x threads of a
# row each sum every T-th pixel of each mode (consecutive threads on consecutive pixels),
# then each warp sums its 32 threads' five partial sums (shuffles, float64) and adds them
# into the position's row: one atomic add per warp, not per thread (WARP_SUM_SOURCE). Thread
# by thread, the adds serialised on each row's five addresses — 4096 threads a position at
# 256²: 39.5 ms of a 132 ms LSQ-ML iteration at 10000 × 256², batch 512, on the H100 (31 %,
# 0.65 TB/s).
STEP_SYSTEMS_SOURCE = WARP_SUM_SOURCE + _cuda("step_systems.cu")


# The one-mode modulus projection of a chunk, in place, on the step systems' grid (a thread
# every T-th pixel of a position, SYSTEM_PIXELS of them): ψ_j(p) ←
# ψ_j(p)·d/(|ψ_j(p)| + eps)·scale with d = (√I − |ψ_j(p)|)·mask(p), the frames read where
# they lie: row r_j = rows[j] of ``frames`` (the resident stack; ``rows`` null: row j, a
# chunk streamed to the device), DATA float32 amplitudes √I or uint16 counts I (AMPLITUDE
# takes the root). Σ_p d² of each warp is added into ``loss[j]`` (float64, zeroed by the
# caller). Before, CuPy took the frame rows into a new array, an element-wise kernel wrote
# d² beside ψ and CUB summed it: 30 bytes a pixel moved for 18 (one rPIE iteration at 4000 ×
# 128², batch 128, on the H100: 1.5 of 10.7 ms in the gather and the sum). A thread a pixel
# made 2048 warps a position at 256², whose adds into one address serialised: 23.8 ms of a
# 113 ms LSQ-ML iteration at 10000 × 256², batch 512, at 0.48 TB/s (H100). At 16 pixels a
# thread, one after another, it ran at 1.4 TB/s there: a thread reads and writes ψ at pixels
# T apart, which the compiler cannot tell apart (T is known at run time only), so each load
# waited for the store before it. A thread now loads LOADS pixels before it stores any.
MODULUS_SOURCE = WARP_SUM_SOURCE + _cuda("modulus.cu")


def modulus_source(counts: bool) -> str:
    """:data:`MODULUS_SOURCE` for uint16 counts I or float32 amplitudes √I."""
    name, data, amp = (("counts", "unsigned short", "sqrtf((float)(X))") if counts
                       else ("amplitudes", "float", "(X)"))
    head = f"#undef DATA\n#undef AMPLITUDE\n#define DATA {data}\n#define AMPLITUDE(X) {amp}\n"
    return head + MODULUS_SOURCE.replace("_NAME", "_" + name)


def system_grid(m: int, b: int) -> tuple[int, int]:
    """The step systems' grid for ``b`` positions of M×M frames: SYSTEM_PIXELS pixels of
    each mode a thread."""
    return position_grid(-(-m * m // SYSTEM_PIXELS), b)


# LSQ-ML's step pair from the batch's summed system ``t`` = [a11, a12, a22, b1, b2]
# (float64): with both directions the 2×2 solve, else each alone (β = b/(a + λ)); λ a
# relative regulariser; then clipped at 0 and damped, as float32 (one thread: five numbers).
STEP_LENGTHS_SOURCE = _cuda("step_lengths.cu")


def _written(a: Any, dtype: Any) -> Any:
    """``a``, which a raw kernel writes through its pointer: it must be C-contiguous and of
    ``dtype`` (a copy would take the writes instead)."""
    if not a.flags.c_contiguous or a.dtype != dtype:
        raise ValueError(f"a fused kernel writes a C-contiguous {np.dtype(dtype)} array; got "
                         f"{a.dtype} {'strided' if not a.flags.c_contiguous else ''} {a.shape}")
    return a


class GpuKernels:
    """The fused kernels on CuPy ``cp`` (compiled on first use, cached by CuPy)."""

    def __init__(self, cp: Any):
        self._cp = cp
        self._ramp_product = cp.RawKernel(RAMP_PRODUCT_SOURCE, "beamflow_ramp_product")
        self._exit_wave = cp.RawKernel(EXIT_WAVE_SOURCE, "beamflow_exit_wave")
        self._object_terms = cp.RawKernel(OBJECT_TERMS_SOURCE, "beamflow_object_terms")
        self._apply_step = cp.RawKernel(APPLY_STEP_SOURCE, "beamflow_apply_step")
        self._position_sum = cp.RawKernel(POSITION_SUM_SOURCE, "beamflow_position_sum")
        self._step_systems = cp.RawKernel(STEP_SYSTEMS_SOURCE, "beamflow_step_systems")
        self._step_lengths = cp.RawKernel(STEP_LENGTHS_SOURCE, "beamflow_step_lengths")
        self._intensity_sum = cp.RawKernel(INTENSITY_SUM_SOURCE, "beamflow_intensity_sum")
        # In place, the array is an output parameter that the body reads (as the modulus
        # kernel's ψ): no input aliasing an output.
        self._conj_product = cp.ElementwiseKernel(
            "complex64 o, complex64 x", "complex64 g", "g = conj(x) * o",
            "beamflow_conj_product")
        self._conj_product_in_place = cp.ElementwiseKernel(
            "complex64 o", "complex64 g", "g = conj(g) * o", "beamflow_conj_product_in_place")
        self._modulus = {counts: cp.RawKernel(modulus_source(counts),
                                              f"beamflow_modulus_{name}")
                         for counts, name in ((False, "amplitudes"), (True, "counts"))}
        self._preconditioned_step = cp.ElementwiseKernel(
            "float32 den, float32 dmax, float32 c_den, float32 c_max", "complex64 num",
            "num = num * (1.0f / (den * c_den + c_max * dmax))",
            "beamflow_preconditioned_step")
        self._preconditioned_add = cp.ElementwiseKernel(
            "complex64 num, float32 den, float32 dmax, float32 c_den, float32 c_max",
            "complex64 y", "y = y + num * (1.0f / (den * c_den + c_max * dmax))",
            "beamflow_preconditioned_add")
        self._axpy = cp.ElementwiseKernel("complex64 x, float32 a", "complex64 y",
                                          "y = y + a * x", "beamflow_axpy")

    def ramp_product(self, e: Any, a: Any, out: Any = None, conj: bool = False) -> Any:
        """r_j·a_j (``conj``: conj(r_j)·a_j) for the ramps whose factors are ``e`` (b, 2, M)
        and ``a`` (b or 1, K, M, M): a (b, K, M, M) array (``out``, which may be ``a``)."""
        cp = self._cp
        b, k, m = e.shape[0], a.shape[1], a.shape[-1]
        a = cp.ascontiguousarray(a)
        if out is None:
            out = cp.empty((b, k, m, m), np.complex64)
        _written(out, np.complex64)
        self._ramp_product(
            position_grid(k * m * m, b), (THREADS,),
            (cp.ascontiguousarray(e), a, np.int64(0 if a.shape[0] == 1 else k * m * m), out,
             np.int32(b), np.int32(k), np.int32(m), np.int32(conj)))
        return out

    def exit_wave(self, obj: Any, flat: Any, pd: Any) -> tuple[Any, Any]:
        """(O_j, ψ_j): the windows of ``obj`` (H, W) at the corners ``flat`` (b,) (iy·W +
        ix), (b, M, M), and their products with the probes ``pd`` (b or 1, K, M, M),
        (b, K, M, M); new arrays."""
        cp = self._cp
        b, k, m = flat.shape[0], pd.shape[1], pd.shape[-1]
        pd = cp.ascontiguousarray(pd)
        oj = cp.empty((b, m, m), np.complex64)
        psi = cp.empty((b, k, m, m), np.complex64)
        self._exit_wave(
            position_grid(m * m, b), (THREADS,),
            (cp.ascontiguousarray(obj), cp.ascontiguousarray(flat, dtype=np.int64), pd,
             np.int64(0 if pd.shape[0] == 1 else k * m * m), oj, psi, np.int32(b),
             np.int32(k), np.int32(m), np.int64(obj.shape[1])))
        return oj, psi

    def object_terms(self, acc: Any, pd: Any, chi: Any, inten: Any, flat: Any, h: int,
                     w: int, maxima: bool = False) -> Any:
        """Add Σ_k conj(pd_jk)·chi_jk and the illumination of every position j of a chunk
        into the accumulator pair ``acc`` (3·h·w float32) at the windows whose flat corners
        (iy·w + ix) are ``flat`` (b,). ``pd``: (b, K, M, M), or (1, K, M, M) for all;
        ``chi``: (b, K, M, M); ``inten``: the (M, M) illumination of every window, or None
        for each position's own Σ_k |pd_jk|². With ``maxima``, returns the largest
        denominator each block of threads left (a new float32 array; its maximum is the
        largest denominator of the chunk's windows), else None."""
        cp = self._cp
        b, k, m = chi.shape[0], chi.shape[1], chi.shape[-1]
        pd = cp.ascontiguousarray(pd)
        chi = cp.ascontiguousarray(chi)
        exact = inten is None
        _written(acc, np.float32)
        inten = cp.ascontiguousarray(inten) if not exact else acc  # unread when exact
        grid = position_grid(m * m, b)
        most = cp.empty(grid[0] * grid[1], np.float32) if maxima else None
        self._object_terms(
            grid, (THREADS,),
            (pd, np.int64(0 if pd.shape[0] == 1 else k * m * m), chi, inten,
             cp.ascontiguousarray(flat, dtype=np.int64), acc, most,
             np.int32(b), np.int32(k), np.int32(m), np.int64(w), np.int64(h * w),
             np.int32(exact)))
        return most

    def apply_step(self, obj: Any, acc: Any, top: Any, box: tuple[slice, slice],
                   c_den: float, c_max: float, step: Any = None) -> None:
        """``obj[box] += step · num / (c_den·den + c_max·max)`` from the accumulator pair
        ``acc`` (3·H·W float32, as :meth:`object_terms` fills it) and its maximum ``top`` (a
        0-d float32 device array), then the pair cleared where the batch reached (see
        :data:`APPLY_STEP_SOURCE`). ``step``: a 0-d float32 device array, or None for 1."""
        cp = self._cp
        h, w = obj.shape
        (y0, y1, _), (x0, x1, _) = box[0].indices(h), box[1].indices(w)
        rows, cols = y1 - y0, x1 - x0
        if rows <= 0 or cols <= 0:
            return
        self._apply_step(
            (-(-cols // THREADS), min(rows, MAX_GRID_Y)), (THREADS,),
            (_written(obj, np.complex64), _written(acc, np.float32),
             cp.ascontiguousarray(top, dtype=np.float32),
             None if step is None else cp.ascontiguousarray(step, dtype=np.float32),
             np.float32(c_den), np.float32(c_max), np.int64(w), np.int64(h * w),
             np.int32(y0), np.int32(rows), np.int32(x0), np.int32(cols)))

    def position_sum(self, e: Any, a: Any, out: Any) -> Any:
        """``out += Σ_j r_j·a_j`` over the positions of ``a`` (b, K, M, M), r_j the ramps of
        the factors ``e`` (b, 2, M) (None: no ramp); ``out`` (K, M, M) complex64. Returns
        ``out``."""
        cp = self._cp
        b, k, m = a.shape[0], a.shape[1], a.shape[-1]
        _written(out, np.complex64)
        self._position_sum(
            (-(-k * m * m // THREADS), -(-b // SUM_POSITIONS)), (THREADS,),
            (None if e is None else cp.ascontiguousarray(e), cp.ascontiguousarray(a), out,
             np.int32(b), np.int32(k), np.int32(m), np.int32(SUM_POSITIONS)))
        return out

    def step_systems(self, pd: Any, acc: Any, top: Any, alpha: float, flat: Any, oj: Any,
                     sp: Any, chi: Any, h: int, w: int) -> Any:
        """LSQ-ML's step-length systems of a chunk, (b, 5) float64 rows [a11, a12, a22, b1,
        b2] (see :data:`STEP_SYSTEMS_SOURCE`). ``pd``: (b or 1, K, M, M) probes; ``acc``,
        ``top``: the object accumulator pair (3·``h``·``w`` float32) and its maximum (a 0-d
        float32 device array), whose
        preconditioned direction num / (den + ``alpha``·max) is the object's, or None when
        the object is not updated; ``flat``: the windows' corners iy·w + ix; ``oj``: (b, M,
        M) object patches; ``sp``: the shifted probe direction (b or 1, K, M, M), or None
        when the probe is not updated; ``chi``: (b, K, M, M)."""
        cp = self._cp
        b, k, m = chi.shape[0], chi.shape[1], chi.shape[-1]
        out = cp.zeros((b, 5), np.float64)
        chi = cp.ascontiguousarray(chi)
        pd = cp.ascontiguousarray(pd)
        oj = cp.ascontiguousarray(oj)
        upd_obj, upd_probe = acc is not None, sp is not None
        sp = cp.ascontiguousarray(sp) if upd_probe else chi  # unread when absent
        self._step_systems(
            system_grid(m, b), (THREADS,),
            (pd, np.int64(0 if pd.shape[0] == 1 else k * m * m),
             _written(acc, np.float32) if upd_obj else None,
             cp.ascontiguousarray(top, dtype=np.float32) if upd_obj else None,
             np.float32(alpha), cp.ascontiguousarray(flat, dtype=np.int64), oj, sp,
             np.int64(0 if sp.shape[0] == 1 else k * m * m), chi, out, np.int32(b),
             np.int32(k), np.int32(m), np.int64(w), np.int64(h * w), np.int32(upd_obj),
             np.int32(upd_probe)))
        return out

    def step_lengths(self, tot: Any, both: bool, damping: float) -> Any:
        """(β_O, β_P) (2,) float32 on the device from the summed system ``tot`` (5,) float64
        (see :data:`STEP_LENGTHS_SOURCE`)."""
        cp = self._cp
        out = cp.empty(2, np.float32)
        self._step_lengths((1,), (1,), (cp.ascontiguousarray(tot), out, np.int32(both),
                                        np.float32(damping)))
        return out

    def intensity_sum(self, a: Any, out: Any) -> Any:
        """``out += Σ_j |a_j|²`` in place over the first axis of ``a`` (b, M, M) complex64;
        ``out`` (M, M) float32. Returns ``out``."""
        cp = self._cp
        b, mm = a.shape[0], a.shape[1] * a.shape[2]
        _written(out, np.float32)
        self._intensity_sum(
            ((mm + THREADS - 1) // THREADS, (b + SUM_POSITIONS - 1) // SUM_POSITIONS),
            (THREADS,), (cp.ascontiguousarray(a), out, np.int32(b), np.int64(mm),
                         np.int32(SUM_POSITIONS)))
        return out

    def conj_product(self, o: Any, x: Any, out: Any) -> Any:
        """``out = conj(x) · o`` (``o`` broadcast over modes); ``out`` may be ``x``."""
        if out is x:
            return self._conj_product_in_place(o, x)
        return self._conj_product(o, x, out)

    def preconditioned_step(self, num: Any, den: Any, dmax: Any, c_den: float,
                            c_max: float, into: Any = None) -> Any:
        """``num ← num / (c_den·den + c_max·dmax)`` in place (``dmax``: a 0-d device array
        or a float) and returns ``num``; with ``into``, ``into += num / (…)`` instead
        (``num`` left as it is) and returns ``into``."""
        c_den, c_max = np.float32(c_den), np.float32(c_max)
        if into is not None:
            return self._preconditioned_add(num, den, dmax, c_den, c_max, into)
        self._preconditioned_step(den, dmax, c_den, c_max, num)
        return num

    def axpy(self, y: Any, a: Any, x: Any) -> Any:
        """``y += a·x`` in place (``a``: a 0-d float32 device array or a float)."""
        return self._axpy(x, a, y)

    def modulus(self, psi: Any, frames: Any, rows: Any, mask: Any, eps: Any,
                scale: Any = 1.0) -> Any:
        """The modulus projection of one-mode waves ``psi`` (b, M, M) in place: ``psi *=
        d / (|psi| + eps) · scale`` with ``d = (√I − |psi|)·mask``; returns Σd² (a 0-d
        float64 device array). ``frames``: float32 amplitudes √I or uint16 counts I, (n, M,
        M), of which position j's is row ``rows[j]`` (``rows`` None: row j); ``scale``: the
        inverse FFT's 1/M² when it is folded here (1: none). See :data:`MODULUS_SOURCE`."""
        cp = self._cp
        b, m = psi.shape[0], psi.shape[-1]
        counts = frames.dtype == np.uint16
        loss = cp.zeros(b, np.float64)
        self._modulus[counts](
            system_grid(m, b), (THREADS,),
            (_written(psi, np.complex64),
             cp.ascontiguousarray(frames, dtype=np.uint16 if counts else np.float32),
             None if rows is None else cp.ascontiguousarray(rows, dtype=np.int64),
             cp.ascontiguousarray(mask, dtype=np.float32), np.float32(eps), np.float32(scale),
             loss, np.int32(b), np.int32(m)))
        return loss.sum()
