"""The fused GPU kernels of :mod:`beamflow.ptycho.gpu.kernels` in numpy, for the GPU code path
run without a GPU (``tests/kits/counting_cupy.py``,
``tests/ptycho/gpu/test_ptycho_device_paths.py``).

Each computes what its kernel computes, written as the engine's array code writes it (the
same products in the same order), so the GPU path on numpy gives the CPU path's numbers.
The kernels' own CUDA source is checked against the array code in
``tests/ptycho/gpu/test_gpu_kernels.py`` (on the CPU) and
``tests/ptycho/gpu/test_ptycho_engine_gpu.py`` (on a card).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ReferenceKernels"]


def _windows(flat: np.ndarray, m: int, w: int) -> np.ndarray:
    """Flat indices (b, m, m) of the m×m windows at corners ``flat`` (iy·w + ix)."""
    return flat[:, None, None] + np.arange(m)[:, None] * w + np.arange(m)


def _ramps(e: np.ndarray) -> np.ndarray:
    """Core's outer ramps (b, M, M) from the same factors ``e`` (b, 2, M)."""
    return e[:, 0, :, None] * e[:, 1, None, :]


class ReferenceKernels:
    """:class:`beamflow.ptycho.gpu.kernels.GpuKernels`' methods on numpy arrays."""

    def ramp_product(self, e: np.ndarray, a: np.ndarray, out: np.ndarray | None = None,
                     conj: bool = False) -> np.ndarray:
        r = _ramps(e)
        if conj:
            r = np.conj(r)
        res = r[:, None] * a
        if out is None:
            return res
        out[...] = res
        return out

    def exit_wave(self, obj: np.ndarray, flat: np.ndarray, pd: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        oj = obj.ravel()[_windows(flat, pd.shape[-1], obj.shape[1])]
        return oj, pd * oj[:, None]

    def object_terms(self, acc: np.ndarray, pd: np.ndarray, chi: np.ndarray,
                     inten: np.ndarray | None, flat: np.ndarray, h: int, w: int,
                     maxima: bool = False) -> np.ndarray | None:
        b, m = chi.shape[0], chi.shape[-1]
        num = ((np.conj(pd) * chi).sum(axis=1) if chi.shape[1] > 1
               else np.conj(pd[:, 0]) * chi[:, 0])
        den = (np.square(pd.real) + np.square(pd.imag)).sum(axis=1) if inten is None else inten
        where = _windows(flat, m, w).ravel()
        # Position after position, as the array code's scatter adds them.
        np.add.at(acc[: 2 * h * w].view(np.complex64), where,
                  np.broadcast_to(num, (b, m, m)).ravel())
        np.add.at(acc[2 * h * w :], where, np.broadcast_to(den, (b, m, m)).ravel())
        if not maxima:
            return None
        # the largest denominator the adds left (one value: the kernel's blocks' maxima
        # have it as their maximum)
        return acc[2 * h * w :][where].max(keepdims=True)

    def apply_step(self, obj: np.ndarray, acc: np.ndarray, top: np.ndarray,
                   box: tuple[slice, slice], c_den: float, c_max: float,
                   step: Any = None) -> None:
        h, w = obj.shape
        num = acc[: 2 * h * w].view(np.complex64).reshape(h, w)[box]
        den = acc[2 * h * w :].reshape(h, w)[box]
        reached = (num != 0) | (den != 0)
        # the array code's steps, in their order: rPIE's (den·c_den, + c_max·max, 1/x, ×)
        # and LSQ-ML's direction then β_O times it
        t = den * np.float32(c_den) if c_den != 1.0 else den.copy()
        t += c_max * top
        np.reciprocal(t, out=t, where=reached)
        g = num * t
        if step is not None:
            g = step * g
        region = obj[box]
        region[reached] += g[reached]
        num[reached] = 0
        den[reached] = 0

    def position_sum(self, e: np.ndarray | None, a: np.ndarray, out: np.ndarray
                     ) -> np.ndarray:
        b, k, m = a.shape[0], a.shape[1], a.shape[-1]
        g = _ramps(e)[:, None] * a if e is not None else a
        # the array code's sum over the positions (ArrayOps.position_sum), in float32 pairs
        out += g.view(np.float32).reshape(b, k, m, 2 * m).sum(axis=0).view(np.complex64)
        return out

    def intensity_sum(self, a: np.ndarray, out: np.ndarray) -> np.ndarray:
        out += (np.square(a.real) + np.square(a.imag)).sum(axis=0)
        return out

    def step_systems(self, pd: np.ndarray, acc: np.ndarray | None, top: np.ndarray | None,
                     alpha: float, flat: np.ndarray, oj: np.ndarray, sp: np.ndarray | None,
                     chi: np.ndarray, h: int, w: int) -> np.ndarray:
        b, m = chi.shape[0], chi.shape[-1]
        zero = np.zeros(chi.shape, np.complex64)
        d_obj = None
        if acc is not None:  # LSQ-ML's direction, as its array code makes it
            den = acc[2 * h * w :] + alpha * top
            np.reciprocal(den, out=den)
            d_obj = (acc[: 2 * h * w].view(np.complex64) * den).reshape(h, w)
        d0 = pd * d_obj.ravel()[_windows(flat, m, w)][:, None] if d_obj is not None else zero
        d1 = oj[:, None] * sp if sp is not None else zero

        def rdot(a: np.ndarray, c: np.ndarray) -> np.ndarray:
            return (a.real * c.real + a.imag * c.imag).reshape(b, -1).sum(axis=1,
                                                                         dtype=np.float64)

        return np.stack([rdot(d0, d0), rdot(d0, d1), rdot(d1, d1), rdot(d0, chi),
                         rdot(d1, chi)], axis=1)

    def step_lengths(self, tot: np.ndarray, both: bool, damping: float) -> np.ndarray:
        lam = 1e-6 * (tot[0] + tot[2]) + 1e-30
        d11, d22 = tot[0] + lam, tot[2] + lam
        if both:
            det = d11 * d22 - tot[1] ** 2
            betas = np.array([d22 * tot[3] - tot[1] * tot[4], d11 * tot[4] - tot[1] * tot[3]])
            betas /= det
        else:
            betas = np.array([tot[3] / d11, tot[4] / d22])
        return np.float32(damping) * np.maximum(betas, 0.0).astype(np.float32)

    def conj_product(self, o: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        return np.multiply(np.conj(x), o, out=out)

    def preconditioned_step(self, num: np.ndarray, den: np.ndarray, dmax: Any, c_den: float,
                            c_max: float, into: np.ndarray | None = None) -> np.ndarray:
        # rPIE's array code, in its order (den·c_den, + c_max·max, 1/x, ×): the same bits
        t = den * np.float32(c_den) if c_den != 1.0 else den.copy()
        t += c_max * dmax
        np.reciprocal(t, out=t)
        if into is not None:
            into += num * t
            return into
        num *= t
        return num

    def axpy(self, y: np.ndarray, a: Any, x: np.ndarray) -> np.ndarray:
        y += a * x
        return y

    def modulus(self, psi: np.ndarray, frames: np.ndarray, rows: Any, mask: np.ndarray,
                eps: Any, scale: Any = 1.0) -> np.ndarray:
        data = frames if rows is None else frames[rows]
        amp = np.sqrt(data.astype(np.float32)) if data.dtype == np.uint16 else data
        a = np.abs(psi)
        d = (amp - a) * mask
        np.multiply(psi, d / (a + eps) * np.float32(scale), out=psi)
        flat = d.reshape(-1)
        return np.asarray(np.einsum("i,i->", flat, flat))
