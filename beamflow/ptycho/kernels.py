"""Fused GPU kernels: one pass over a chunk's arrays where array code takes several.

On a GPU the sweep is memory-bound and launch-bound: every element-wise step of the array
code reads and writes whole (b, K, M, M) stacks and costs the host a launch. The steps below
are the heaviest of a PIE or LSQ-ML batch, each written here once as a kernel that does the
same arithmetic in one pass. The array code they stand for is the specification: on the CPU
the engine runs it as it is (``tests/reference_kernels.py`` writes it out per kernel for the
GPU stand-ins of the tests), and ``tests/test_ptycho_engine_gpu.py`` compares each kernel
with it on a card.

* :meth:`GpuKernels.ramp_product` — a sub-pixel phase ramp r_j = exp(−2πi k·δ_j) times a
  (b, K, M, M) stack, the ramp made in the kernel from its two (M,) factors per position
  (e_y ⊗ e_x). Array code keeps the (N, M, M) ramps (0.5 GB at 4000 × 128², 5 GB at
  10000 × 256²), gathers a chunk's (2 passes) and multiplies (3); the kernel reads the
  stack once and writes it once, and the device holds (N, 2, M) factors.
* :meth:`GpuKernels.exit_wave` — the object patches O_j gathered at the windows and the exit
  waves ψ_jk = P_k,j·O_j (:meth:`.ops.ArrayOps.exit_wave`). Array code: an int64 index stack, a
  gather over it and a product — 7 passes; the kernel reads the window and P_j once and
  writes O_j and ψ_j (4).
* :meth:`GpuKernels.object_terms` — Σ_k conj(P_k,j)·χ_jk and the illumination scatter-added
  into the object accumulator pair (:meth:`.ops.ArrayOps.object_terms`). Array code: a conjugate,
  a product, the illumination broadcast, two index kernels and an atomic scatter over int64
  indices — ~16 passes of the stack; the kernel reads P_j and χ_j once and adds in place
  (the accumulator is object-sized: its atomics mostly hit the cache), and takes the
  largest denominator on the way (no pass over the object box for it).
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

This module does not import CuPy: :func:`~.arrays.array_backend` hands it the module. The
raw kernels' sources are plain CUDA C (no CuPy headers), so ``tests/test_gpu_kernels.py``
runs them on machines without a GPU — compiled as C++ beside a stand-in for CUDA's
built-ins, every thread in turn, against the array code — and compiles them with NVRTC
where it is installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["APPLY_STEP_SOURCE", "EXIT_WAVE_SOURCE", "INTENSITY_SUM_SOURCE", "MAX_GRID_Y",
           "MODULUS_SOURCE", "OBJECT_TERMS_SOURCE", "POSITION_SUM_SOURCE",
           "RAMP_PRODUCT_SOURCE", "STEP_LENGTHS_SOURCE", "STEP_SYSTEMS_SOURCE",
           "SUM_POSITIONS", "SYSTEM_PIXELS", "GpuKernels", "THREADS", "modulus_source",
           "position_grid", "system_grid"]

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
RAMP_SOURCE = r"""
#ifndef BEAMFLOW_RAMP
#define BEAMFLOW_RAMP
__device__ __forceinline__ float2 beamflow_ramp(const float2* __restrict__ e, const long long j,
                                                const int M, const int y, const int x)
{
    const float2 ey = e[j * 2 * M + y];
    const float2 ex = e[j * 2 * M + M + x];
    return make_float2(ey.x * ex.x - ey.y * ex.y, ey.x * ex.y + ey.y * ex.x);
}
#endif
"""

# One thread per element q of a position's (K, M, M) stack, for positions j = blockIdx.y,
# blockIdx.y + gridDim.y, …: r_j(y, x) = e_j,y(y)·e_j,x(x) from the factors ``e`` (b, 2, M)
# (conjugated when ``conj``), times a_jk(y, x) (``a_stride``: 0 for one (1, K, M, M) stack
# shared by every position), written to ``out`` (b, K, M, M). ``out`` may be ``a``.
RAMP_PRODUCT_SOURCE = RAMP_SOURCE + r"""
extern "C" __global__ void beamflow_ramp_product(
    const float2* __restrict__ e, const float2* a, const long long a_stride, float2* out,
    const int b, const int K, const int M, const int conj)
{
    const int mm = M * M;
    const int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= K * mm) return;
    const int p = q % mm;
    const int y = p / M;
    const int x = p - y * M;
    for (int j = blockIdx.y; j < b; j += gridDim.y) {
        const long long jl = j;
        float2 r = beamflow_ramp(e, jl, M, y, x);
        if (conj) r.y = -r.y;
        const float2 v = a[jl * a_stride + q];
        out[jl * K * mm + q] = make_float2(r.x * v.x - r.y * v.y, r.x * v.y + r.y * v.x);
    }
}
"""

# One thread per pixel p of a position's window, for positions j = blockIdx.y, blockIdx.y +
# gridDim.y, …: O_j(p) read from the object (H, W) at the window's corner ``flat[j]``
# (iy·W + ix) and written to ``oj`` (b, M, M), and the product P_k,j(p)·O_j(p) of every
# mode written to ``psi`` (b, K, M, M) — numpy's complex product, in its order.
# ``pd_stride`` as in beamflow_object_terms.
EXIT_WAVE_SOURCE = r"""
extern "C" __global__ void beamflow_exit_wave(
    const float2* __restrict__ obj, const long long* __restrict__ flat,
    const float2* __restrict__ pd, const long long pd_stride,
    float2* __restrict__ oj, float2* __restrict__ psi,
    const int b, const int K, const int M, const long long W)
{
    const int mm = M * M;
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= mm) return;
    const int r = p / M;
    const long long off = r * W + (p - r * M);
    for (int j = blockIdx.y; j < b; j += gridDim.y) {
        const long long jl = j;
        const float2 O = obj[flat[j] + off];
        oj[jl * mm + p] = O;
        for (int k = 0; k < K; ++k) {
            const float2 P = pd[jl * pd_stride + k * mm + p];
            psi[(jl * K + k) * mm + p] = make_float2(P.x * O.x - P.y * O.y,
                                                     P.x * O.y + P.y * O.x);
        }
    }
}
"""

# A warp's 32 values summed (shuffles, float64) for one atomic add by its first lane, where
# thousands of threads would otherwise add into the same few addresses one at a time; and a
# block's maximum, written by its first thread. The
# CPU's thread-by-thread run of the sources (tests/test_gpu_kernels.py) defines
# BEAMFLOW_ONE_THREAD: there each thread adds its own value (the same total).
WARP_SUM_SOURCE = r"""
#ifndef BEAMFLOW_WARP_SUM
#define BEAMFLOW_WARP_SUM
#ifndef BEAMFLOW_ONE_THREAD
__device__ __forceinline__ double beamflow_warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float beamflow_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}
#define BEAMFLOW_WARP_LEADER ((threadIdx.x & 31) == 0)
// The block's largest v into *out, by its first thread (every thread of the block calls it).
__device__ __forceinline__ void beamflow_block_max(float v, float* out)
{
    __shared__ float warps[32];
    v = beamflow_warp_max(v);
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x + 31) / 32; ++w) v = fmaxf(v, warps[w]);
        *out = v;
    }
}
#else
static inline double beamflow_warp_sum(double v) { return v; }
static inline float beamflow_warp_max(float v) { return v; }
#define BEAMFLOW_WARP_LEADER 1
// Threads run one after another, the block's first one first.
static inline void beamflow_block_max(float v, float* out)
{
    *out = threadIdx.x == 0 ? v : fmaxf(*out, v);
}
#endif
#endif
"""

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
OBJECT_TERMS_SOURCE = WARP_SUM_SOURCE + r"""
extern "C" __global__ void beamflow_object_terms(
    const float2* __restrict__ pd, const long long pd_stride,
    const float2* __restrict__ chi, const float* __restrict__ inten,
    const long long* __restrict__ flat, float* __restrict__ acc, float* __restrict__ most,
    const int b, const int K, const int M, const long long W, const long long HW,
    const int exact)
{
    const int mm = M * M;
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    // No early return past the window when the maximum is taken: every thread of a block
    // takes part in its reduction (one past the window adds nothing).
    if (p >= mm && !most) return;
    const int r = p / M;
    const long long off = r * W + (p - r * M);
    float largest = 0.0f;
    for (int j = blockIdx.y; j < b; j += gridDim.y) {
        if (p >= mm) continue;
        const long long jl = j;
        float re = 0.0f, im = 0.0f, den = 0.0f;
        for (int k = 0; k < K; ++k) {
            const float2 P = pd[jl * pd_stride + k * mm + p];
            const float2 X = chi[(jl * K + k) * mm + p];
            re += P.x * X.x + P.y * X.y;   /* conj(P)·X */
            im += P.x * X.y - P.y * X.x;
            if (exact) den += P.x * P.x + P.y * P.y;
        }
        if (!exact) den = inten[p];
        const long long o = flat[j] + off;
        atomicAdd(acc + 2 * o, re);
        atomicAdd(acc + 2 * o + 1, im);
        largest = fmaxf(largest, atomicAdd(acc + 2 * HW + o, den) + den);
    }
    if (most) beamflow_block_max(largest, most + (long long)blockIdx.y * gridDim.x + blockIdx.x);
}
"""

# One thread per pixel of a box of the object (rows y0 … y0 + rows − 1, columns x0 … x0 +
# cols − 1 of the (H, W) object): the step num / (c_den·den + c_max·max) from the
# accumulator pair ``acc`` (as in beamflow_object_terms; ``top``: its denominator's maximum,
# a float32 on the device), times ``step`` (a float32 on the device; null: 1), added to the object,
# and the pair cleared at the pixel for the next batch. A pixel no window of the batch
# reached holds zeros: it is left alone, object and pair (the step there is zero). rPIE's
# step, LSQ-ML's direction and step; it replaces a zeroing of the pair over the box before
# the batch, a maximum over the box, and one or two passes over it (rPIE 40 bytes a pixel of
# the box, LSQ-ML 68), with 12 bytes a pixel read and 28 more where the windows reached.
APPLY_STEP_SOURCE = r"""
extern "C" __global__ void beamflow_apply_step(
    float2* __restrict__ obj, float* __restrict__ acc, const float* __restrict__ top,
    const float* __restrict__ step, const float c_den, const float c_max,
    const long long W, const long long HW, const int y0, const int rows, const int x0,
    const int cols)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const long long o = (long long)(y0 + r) * W + x0 + c;
        float2* num = (float2*)acc + o;
        float* den = acc + 2 * HW + o;
        const float2 n = *num;
        const float d = *den;
        if (n.x == 0.0f && n.y == 0.0f && d == 0.0f) continue;
        const float f = 1.0f / (d * c_den + c_max * *top);
        float2 g = make_float2(n.x * f, n.y * f);
        if (step) g = make_float2(*step * g.x, *step * g.y);
        const float2 v = obj[o];
        obj[o] = make_float2(v.x + g.x, v.y + g.y);
        *num = make_float2(0.0f, 0.0f);
        *den = 0.0f;
    }
}
"""

# Σ_j r_j(q)·a_j(q) over a batch's (b, K, M, M) stack, with r_j the ramp of factors ``e``
# (b, 2, M) (as beamflow_ramp_product makes it; ``e`` null: no ramp), added into ``out``
# (K, M, M) complex64: the probe terms' sum over the positions. One thread per (element q,
# group of SUM_POSITIONS positions), one atomic add per thread and component. It replaces a
# ramp product that wrote the stack and a sum that read it again (an LSQ-ML batch at
# 10000 × 256²: 49 + 40 µs on the H100).
POSITION_SUM_SOURCE = RAMP_SOURCE + r"""
extern "C" __global__ void beamflow_position_sum(
    const float2* __restrict__ e, const float2* __restrict__ a, float* __restrict__ out,
    const int b, const int K, const int M, const int per)
{
    const int mm = M * M;
    const int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= K * mm) return;
    const int p = q % mm;
    const int y = p / M;
    const int x = p - y * M;
    const int j0 = blockIdx.y * per;
    const int j1 = j0 + per < b ? j0 + per : b;
    float re = 0.0f, im = 0.0f;
    for (int j = j0; j < j1; ++j) {
        const long long jl = j;
        const float2 v = a[jl * K * mm + q];
        if (e) {
            const float2 r = beamflow_ramp(e, jl, M, y, x);
            re += r.x * v.x - r.y * v.y;
            im += r.x * v.y + r.y * v.x;
        } else {
            re += v.x;
            im += v.y;
        }
    }
    atomicAdd(out + 2 * q, re);
    atomicAdd(out + 2 * q + 1, im);
}
"""


# Positions each thread of beamflow_intensity_sum adds up (the grid's second dimension
# splits the batch in groups of this many).
SUM_POSITIONS = 16

# Σ_j |a_j(p)|² over a batch's (b, M, M) stack, added into ``out`` (M·M float32): one thread
# per (pixel p, group of SUM_POSITIONS positions), consecutive threads on consecutive pixels,
# one atomic add per thread.
INTENSITY_SUM_SOURCE = r"""
extern "C" __global__ void beamflow_intensity_sum(
    const float2* __restrict__ a, float* __restrict__ out, const int b, const long long mm,
    const int per)
{
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= mm) return;
    const int j0 = blockIdx.y * per;
    const int j1 = j0 + per < b ? j0 + per : b;
    float s = 0.0f;
    for (int j = j0; j < j1; ++j) {
        const float2 v = a[j * mm + p];
        s += v.x * v.x + v.y * v.y;
    }
    atomicAdd(out + p, s);
}
"""


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
STEP_SYSTEMS_SOURCE = WARP_SUM_SOURCE + r"""
extern "C" __global__ void beamflow_step_systems(
    const float2* __restrict__ pd, const long long pd_stride,
    const float* __restrict__ acc, const float* __restrict__ top, const float alpha,
    const long long* __restrict__ flat,
    const float2* __restrict__ oj, const float2* __restrict__ sp, const long long sp_stride,
    const float2* __restrict__ chi, double* __restrict__ out,
    const int b, const int K, const int M, const long long W, const long long HW,
    const int upd_obj, const int upd_probe)
{
    const float lift = upd_obj ? alpha * *top : 0.0f;
    const int T = gridDim.x * blockDim.x;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int mm = M * M;
    // No early return for t >= mm: every lane of a warp takes part in its shuffles (a
    // thread past the frame sums nothing).
    for (int j = blockIdx.y; j < b; j += gridDim.y) {
        const long long jl = j;
        float a11 = 0.0f, a12 = 0.0f, a22 = 0.0f, b1 = 0.0f, b2 = 0.0f;
        for (int k = 0; k < K; ++k) {
            const long long q0 = (long long)k * mm;
            for (int p = t; p < mm; p += T) {
                const long long q = q0 + p;
                const float2 X = chi[jl * K * mm + q];
                float2 d0 = make_float2(0.0f, 0.0f), d1 = make_float2(0.0f, 0.0f);
                if (upd_obj) {
                    const int r = p / M;
                    const float2 P = pd[jl * pd_stride + q];
                    const long long o = flat[j] + r * W + (p - r * M);
                    const float2 n = ((const float2*)acc)[o];
                    const float f = 1.0f / (acc[2 * HW + o] + lift);
                    const float2 D = make_float2(n.x * f, n.y * f);
                    d0 = make_float2(P.x * D.x - P.y * D.y, P.x * D.y + P.y * D.x);
                }
                if (upd_probe) {
                    const float2 O = oj[jl * mm + p];
                    const float2 S = sp[jl * sp_stride + q];
                    d1 = make_float2(O.x * S.x - O.y * S.y, O.x * S.y + O.y * S.x);
                }
                a11 += d0.x * d0.x + d0.y * d0.y;
                a12 += d0.x * d1.x + d0.y * d1.y;
                a22 += d1.x * d1.x + d1.y * d1.y;
                b1 += d0.x * X.x + d0.y * X.y;
                b2 += d1.x * X.x + d1.y * X.y;
            }
        }
        const double s11 = beamflow_warp_sum(a11), s12 = beamflow_warp_sum(a12);
        const double s22 = beamflow_warp_sum(a22), s1 = beamflow_warp_sum(b1);
        const double s2 = beamflow_warp_sum(b2);
        if (BEAMFLOW_WARP_LEADER) {
            double* row = out + jl * 5;
            atomicAdd(row, s11);
            atomicAdd(row + 1, s12);
            atomicAdd(row + 2, s22);
            atomicAdd(row + 3, s1);
            atomicAdd(row + 4, s2);
        }
    }
}
"""


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
MODULUS_SOURCE = WARP_SUM_SOURCE + r"""
#ifndef LOADS
#define LOADS 4
#endif
extern "C" __global__ void beamflow_modulus_NAME(
    float2* __restrict__ psi, const DATA* __restrict__ frames,
    const long long* __restrict__ rows,
    const float* __restrict__ mask, const float eps, const float scale,
    double* __restrict__ loss, const int b, const int M)
{
    const int T = gridDim.x * blockDim.x;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int mm = M * M;
    // No early return past the frame: every lane of a warp takes part in its shuffles.
    for (int j = blockIdx.y; j < b; j += gridDim.y) {
        const long long r = rows ? rows[j] : (long long)j;
        const long long base = (long long)j * mm;
        float s = 0.0f;
        // LOADS pixels at a time, t, t + T, …: all their loads, then all their stores.
        for (int p0 = t; p0 < mm; p0 += LOADS * T) {
            float2 v[LOADS];
            float amp[LOADS], w[LOADS];
#pragma unroll
            for (int u = 0; u < LOADS; ++u) {
                const int p = p0 + u * T;
                if (p < mm) {
                    v[u] = psi[base + p];
                    amp[u] = AMPLITUDE(frames[r * mm + p]);
                    w[u] = mask[p];
                }
            }
#pragma unroll
            for (int u = 0; u < LOADS; ++u) {
                const int p = p0 + u * T;
                if (p < mm) {
                    const float a = sqrtf(v[u].x * v[u].x + v[u].y * v[u].y);
                    const float d = (amp[u] - a) * w[u];
                    const float f = d / (a + eps) * scale;
                    psi[base + p] = make_float2(v[u].x * f, v[u].y * f);
                    s += d * d;
                }
            }
        }
        const double sum = beamflow_warp_sum(s);
        if (BEAMFLOW_WARP_LEADER) atomicAdd(loss + j, sum);
    }
}
"""


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
STEP_LENGTHS_SOURCE = r"""
extern "C" __global__ void beamflow_step_lengths(
    const double* __restrict__ t, float* __restrict__ out, const int both, const float damping)
{
    if (blockIdx.x * blockDim.x + threadIdx.x != 0) return;
    const double lam = 1e-6 * (t[0] + t[2]) + 1e-30;
    const double d11 = t[0] + lam, d22 = t[2] + lam;
    double bo, bp;
    if (both) {
        const double det = d11 * d22 - t[1] * t[1];
        bo = (d22 * t[3] - t[1] * t[4]) / det;
        bp = (d11 * t[4] - t[1] * t[3]) / det;
    } else {
        bo = t[3] / d11;
        bp = t[4] / d22;
    }
    out[0] = damping * (float)(bo > 0.0 ? bo : 0.0);
    out[1] = damping * (float)(bp > 0.0 ? bp : 0.0);
}
"""


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
