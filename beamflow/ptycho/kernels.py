"""Fused GPU kernels: one pass over a chunk's arrays where array code takes several.

On a GPU the sweep is memory-bound and launch-bound: every element-wise step of the array
code reads and writes whole (b, K, M, M) stacks and costs the host a launch. The steps below
are the heaviest of a PIE or LSQ-ML batch, each written here once as a kernel that does the
same arithmetic in one pass. The array code they stand for is the specification: on the CPU
(and in :mod:`tests.counting_cupy`'s reference kernels) the engine runs it as it is, and
``tests/test_gpu.py`` compares each kernel with it on a card.

* :meth:`GpuKernels.object_terms` — Σ_k conj(P_k,j)·χ_jk and the illumination scatter-added
  into the object accumulator pair (:meth:`Core.accumulate_object`). Array code: a conjugate,
  a product, the illumination broadcast, two index kernels and an atomic scatter over int64
  indices — ~16 passes of the stack; the kernel reads P_j and χ_j once and adds in place
  (the accumulator is object-sized: its atomics mostly hit the cache).
* :meth:`GpuKernels.conj_product` — conj(χ_jk)·O_j for the probe terms: a conjugate and a
  product (5 passes) as one (3).
* :meth:`GpuKernels.modulus` — the one-mode modulus projection: |Ψ|, the residual, its square
  for the loss and the correction (seven passes) as one kernel and one sum.

This module does not import CuPy: :func:`~.arrays.array_backend` hands it the module. The
raw kernel's source is plain CUDA C (no CuPy headers), so ``tests/test_gpu_kernels.py``
compiles it with NVRTC on machines without a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["OBJECT_TERMS_SOURCE", "GpuKernels", "THREADS"]

THREADS = 256

# One thread per (position j, pixel p) of a chunk: the K modes' conj(P)·χ summed, and the
# illumination (Σ_k |P_k,j|² when ``exact``, else the shared intensity patch), added
# atomically at the window's place in the accumulator pair — [(H, W) complex64 as float
# pairs | (H, W) float32], the layout of ArrayBackend.stacked_pair. ``pd_stride``: elements
# between positions of ``pd`` (0 for the unshifted (1, K, M, M) probe).
OBJECT_TERMS_SOURCE = r"""
extern "C" __global__ void beamflow_object_terms(
    const float2* __restrict__ pd, const long long pd_stride,
    const float2* __restrict__ chi, const float* __restrict__ inten,
    const long long* __restrict__ flat, float* __restrict__ acc,
    const int b, const int K, const int M, const long long W, const long long HW,
    const int exact)
{
    const long long mm = (long long)M * M;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)b * mm) return;
    const long long j = i / mm;
    const long long p = i - j * mm;
    const long long r = p / M;
    const long long c = p - r * M;
    float re = 0.0f, im = 0.0f, den = 0.0f;
    for (int k = 0; k < K; ++k) {
        const float2 P = pd[j * pd_stride + k * mm + p];
        const float2 X = chi[(j * K + k) * mm + p];
        re += P.x * X.x + P.y * X.y;   /* conj(P)·X */
        im += P.x * X.y - P.y * X.x;
        if (exact) den += P.x * P.x + P.y * P.y;
    }
    if (!exact) den = inten[p];
    const long long o = flat[j] + r * W + c;
    atomicAdd(acc + 2 * o, re);
    atomicAdd(acc + 2 * o + 1, im);
    atomicAdd(acc + 2 * HW + o, den);
}
"""


class GpuKernels:
    """The fused kernels on CuPy ``cp`` (compiled on first use, cached by CuPy)."""

    def __init__(self, cp: Any):
        self._cp = cp
        self._object_terms = cp.RawKernel(OBJECT_TERMS_SOURCE, "beamflow_object_terms")
        self._conj_product = cp.ElementwiseKernel(
            "complex64 o, complex64 x", "complex64 g", "g = conj(x) * o",
            "beamflow_conj_product")
        self._modulus: dict[bool, Any] = {}

    def object_terms(self, acc: Any, pd: Any, chi: Any, inten: Any, flat: Any, h: int,
                     w: int) -> None:
        """Add Σ_k conj(pd_jk)·chi_jk and the illumination of every position j of a chunk
        into the accumulator pair ``acc`` (3·h·w float32) at the windows whose flat corners
        (iy·w + ix) are ``flat`` (b,). ``pd``: (b, K, M, M), or (1, K, M, M) for all;
        ``chi``: (b, K, M, M); ``inten``: the (M, M) illumination of every window, or None
        for each position's own Σ_k |pd_jk|²."""
        cp = self._cp
        b, k, m = chi.shape[0], chi.shape[1], chi.shape[-1]
        pd = cp.ascontiguousarray(pd)
        chi = cp.ascontiguousarray(chi)
        exact = inten is None
        inten = cp.ascontiguousarray(inten) if not exact else acc  # unread when exact
        n = b * m * m
        self._object_terms(
            ((n + THREADS - 1) // THREADS,), (THREADS,),
            (pd, np.int64(0 if pd.shape[0] == 1 else k * m * m), chi, inten, flat, acc,
             np.int32(b), np.int32(k), np.int32(m), np.int64(w), np.int64(h * w),
             np.int32(exact)))

    def conj_product(self, o: Any, x: Any, out: Any) -> Any:
        """``out = conj(x) · o`` (``o`` broadcast over modes); ``out`` may be ``x``."""
        return self._conj_product(o, x, out)

    def modulus(self, psi: Any, data: Any, mask: Any, eps: Any) -> Any:
        """The modulus projection of one-mode waves ``psi`` (b, M, M) in place: ``psi *=
        d / (|psi| + eps)`` with ``d = (√I − |psi|)·mask``; returns Σd² (a 0-d device
        array). ``data``: float32 amplitudes √I or uint16 counts I."""
        cp = self._cp
        counts = data.dtype == np.uint16
        kernel = self._modulus.get(counts)
        if kernel is None:
            amp = "sqrtf((float)data)" if counts else "data"
            kernel = self._modulus[counts] = cp.ElementwiseKernel(
                f"{'uint16' if counts else 'float32'} data, float32 mask, float32 eps",
                "complex64 psi, float32 r2",
                f"""
                float a = abs(psi);
                float d = ({amp} - a) * mask;
                r2 = d * d;
                psi = psi * (d / (a + eps));
                """,
                f"beamflow_modulus{'_counts' if counts else ''}",
            )
        r2 = cp.empty(psi.shape, np.float32)
        kernel(data, mask, np.float32(eps), psi, r2)
        return r2.sum()
