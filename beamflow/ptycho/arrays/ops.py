"""The array backend's operations that a GPU runs as fused kernels, each with its numpy form
beside it.

The forward models and the algorithms call these and never ask which device they run on:
on the CPU (``kernels`` is None) an operation runs the array code written here; on a GPU it
runs the one-pass kernel of :mod:`.kernels` that computes the same thing (the array code is
the kernel's specification, and ``tests/kits/reference_kernels.py`` writes it out per kernel for
the tests' GPU stand-in). :class:`~.arrays.ArrayBackend` inherits them.

Representations that differ by device stay behind these operations:

* a chunk's sub-pixel ramps r_j = exp(−2πi k·δ_j): (b, M, M) arrays on the CPU (cached per
  position), their (b, 2, M) factors e_y, e_x on a GPU (the kernels make e_y ⊗ e_x where
  they use it) — :meth:`ArrayOps.phase_ramps`, :meth:`ArrayOps.ramp_product`;
* an object accumulator pair (:class:`~.accumulators.ObjectAccumulator`): two arrays on
  the CPU, two views of one buffer on a GPU with the largest denominators its scatter took;
* the inverse FFT's 1/M²: scaled by the CPU's FFTs, folded into a product the step makes
  anyway on a GPU (:attr:`ArrayOps.folds_ifft_scale`).

Arrays are complex64 and float32; "(b or 1, K, M, M)" is a stack of K probe modes per
position, or one stack shared by every position.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ArrayOps", "conj_mode_sum", "step_system_sums"]


def conj_mode_sum(pd: Any, chi: Any, xp: Any, overwrite: bool = False) -> Any:
    """Σ_k conj(pd_k)·χ_k → (b, M, M) for pd (b or 1, K, M, M) and χ (b, K, M, M).

    ``overwrite``: ``pd`` is owned and may be conjugated in place, and with one mode the
    result is written into it (one chunk-sized array fewer at the memory peak); else ``pd``
    is left as it is (the same kernels: a conjugate into a new array)."""
    pdc = xp.conjugate(pd, out=pd) if overwrite else xp.conj(pd)
    if chi.shape[1] == 1:
        return xp.multiply(pdc[:, 0], chi[:, 0], out=pdc[:, 0] if overwrite else None)
    return xp.sum(pdc * chi, axis=1)


def _rdot(a: Any, b: Any, xp: Any) -> Any:
    """Re Σ conj(a)·b over all axes but the first → (b,) float32: the dot product of the
    float32 views (re, im interleaved), in one pass without temporaries (3.5× the three
    products and a sum of the complex parts, measured at 32 × 64²)."""
    axes = "abcdefgh"[: a.ndim]
    return xp.einsum(f"{axes},{axes}->a", _floats(a, xp), _floats(b, xp))


def _floats(a: Any, xp: Any) -> Any:
    """The float32 view of complex64 ``a`` (its last axis made contiguous if it is not)."""
    if a.strides[-1] != a.itemsize:
        a = xp.ascontiguousarray(a)
    return a.view(np.float32)


def step_system_sums(dirs: Any, chi: Any, xp: Any) -> tuple[Any, Any]:
    """The step-length systems' sums for directions ``dirs`` (b, n, K, M, M) and the
    corrections ``chi`` (b, K, M, M): Re Σ conj(d_s)·d_t → (b, n, n) and Re Σ conj(d_s)·χ
    → (b, n), each sum over (K, M, M)."""
    b, n = dirs.shape[:2]
    gram = xp.empty((b, n, n), np.float32)
    rhs = xp.empty((b, n), np.float32)
    for s in range(n):
        for t in range(s, n):
            gram[:, s, t] = gram[:, t, s] = _rdot(dirs[:, s], dirs[:, t], xp)
        rhs[:, s] = _rdot(dirs[:, s], chi, xp)
    return gram, rhs


class ArrayOps:
    """The fused operations of :class:`~.arrays.ArrayBackend` (see the module docstring),
    which provides ``xp``, ``kernels`` and the moves, FFTs, gathers and scatters they use."""

    # -- representations --------------------------------------------------------------------
    @property
    def folds_ifft_scale(self) -> bool:
        """Whether the engine folds the inverse FFT's 1/M² into a product it makes anyway and
        takes the unscaled transform: a GPU, where CuPy scales in a kernel of its own (one
        more read and write of the stack); the CPU's FFTs scale as they go."""
        return self.kernels is not None

    def phase_ramps(self, frac: Any, kfreq: Any) -> Any:
        """The sub-pixel ramps exp(−2πi (k_y δy + k_x δx)) of the rows of ``frac`` (b, 2)
        (where ``frac`` lives), in this backend's form: (b, M, M) on the CPU, their factors
        exp(−2πi k δ) along each axis (b, 2, M) (y then x) on a GPU. ``frac`` and ``kfreq``
        (fftfreq(M)) on the device."""
        xp = self.xp
        e = xp.exp(-2j * np.pi * (frac[:, :, None] * kfreq)).astype(np.complex64)
        if self.kernels is not None:
            return e
        return e[:, 0, :, None] * e[:, 1, None, :]

    def window_index(self, c: Any) -> Any:
        """GPU: the chunk's windows' flat indices into object-sized arrays, made once per
        chunk (every gather and window write of the chunk shares it); None on the CPU."""
        if c.flat is None:
            return None
        if c.window is None:
            c.window = self._flat_index(c.width, None, None, c.m, c.flat)
        return c.window

    def patches(self, arr: Any, c: Any) -> Any:
        """(b, M, M) copies of the chunk's windows of the object-sized ``arr``."""
        return self.gather(arr, c.dy, c.dx, c.m, index=self.window_index(c))

    # -- the forward model ------------------------------------------------------------------
    def ramp_product(self, ramp: Any, a: Any, out: Any = None, conj: bool = False) -> Any:
        """r_j·a_j (``conj``: conj(r_j)·a_j) for a chunk's ramps (:meth:`phase_ramps`) and
        ``a`` (b or 1, K, M, M): a (b, K, M, M) array (``out``, which may be ``a``)."""
        if self.kernels is not None:
            return self.kernels.ramp_product(ramp, a, out=out, conj=conj)
        r = (self.xp.conj(ramp) if conj else ramp)[:, None]
        # The ramp first, always: with SIMD and FMA numpy's complex product rounds a·b and
        # b·a differently.
        if out is None:
            return r * a
        return self.xp.multiply(r, a, out=out)

    def exit_wave(self, obj: Any, pd: Any, c: Any) -> tuple[Any, Any]:
        """(O_j, ψ_j): the chunk's windows of ``obj`` (b, M, M) and the exit waves
        ψ_jk = pd_jk·O_j (b, K, M, M), new arrays (GPU: one pass, 4 of 7)."""
        if self.kernels is not None:
            return self.kernels.exit_wave(obj, c.flat, pd)
        oj = self.gather(obj, c.dy, c.dx, c.m)
        return oj, pd * oj[:, None]

    def sum_squares(self, a: Any) -> Any:
        """Σ a² of a float32 array (a device scalar). Not ``xp.dot``: OpenBLAS threads its
        dot product, and its spinning workers would compete with the engine's own threads;
        numpy's einsum is 2x square-and-sum. CuPy's einsum is a cuBLAS call, which a CUDA
        graph cannot hold (:mod:`.graphs`): a GPU squares and sums."""
        flat = a.reshape(-1)
        if self.kernels is not None:
            return self.xp.square(flat).sum()
        return self.xp.einsum("i,i->", flat, flat)

    def amplitude_residual(self, big_psi: Any, meas: Any, mask: Any,
                           full_mask: bool) -> tuple[Any, Any, Any]:
        """``(amp, d, loss)`` of detector waves Ψ (b, K, M, M) against the measured
        amplitudes ``meas`` (b, M, M; overwritten): amp = √(Σ_k |Ψ_k|²); d = (√I − amp)·mask
        (in ``meas``); loss = Σ d² (a device scalar)."""
        xp = self.xp
        if big_psi.shape[1] == 1:
            amp = xp.abs(big_psi[:, 0])
        else:
            amp = xp.square(big_psi.real).sum(axis=1)
            amp += xp.square(big_psi.imag).sum(axis=1)
            xp.sqrt(amp, out=amp)
        d = meas
        xp.subtract(d, amp, out=d)
        if not full_mask:
            d *= mask
        return amp, d, self.sum_squares(d)

    def modulus(self, big_psi: Any, frames: Any, c: Any, mask: Any, full_mask: bool,
                eps: Any, scale: Any = None) -> Any:
        """Turn Ψ (b, K, M, M) in place into the detector-plane correction Ψ' − Ψ, with
        Ψ' = Ψ·√I/√(Σ_k|Ψ_k|²) on valid pixels (invalid ones left free: 0), times ``scale``
        when given; return the loss Σ d². ``frames``: the measured frames
        (:class:`~.frames.Frames`). GPU, one mode: one kernel that reads the frames where they
        lie (seven passes and a sum as one)."""
        if self.kernels is not None and big_psi.shape[1] == 1:
            return self.kernels.modulus(big_psi[:, 0], *frames.rows(c.idx, c.didx), mask, eps,
                                        1.0 if scale is None else scale)
        amp, d, loss = self.amplitude_residual(big_psi, frames.amplitudes(c.idx, c.didx),
                                               mask, full_mask)
        amp += eps
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

    # -- update terms -----------------------------------------------------------------------
    def object_terms(self, acc: Any, pd: Any, chi: Any, c: Any, inten: Any,
                     overwrite: bool = False) -> None:
        """Scatter-add Σ_k conj(pd_jk)·χ_jk and the illumination into the accumulator pair
        ``acc`` at the chunk's windows. ``inten``: the (M, M) illumination of every window,
        or None for each position's own Σ_k |pd_jk|². ``overwrite``: as in
        :func:`conj_mode_sum` (a GPU leaves ``pd`` as it is). GPU: one kernel that also
        takes the largest denominator on the way (``acc.maxima``)."""
        acc.clean = False
        if self.kernels is not None:
            h, w = acc.num.shape
            acc.maxima.append(self.kernels.object_terms(acc.buffer, pd, chi, inten, c.flat,
                                                        h, w, maxima=True))
            return
        xp = self.xp
        if inten is None:  # before the numerator, which may conjugate pd (the same squares)
            inten = (xp.square(pd.real) + xp.square(pd.imag)).sum(axis=1)
        else:
            inten = xp.broadcast_to(inten, (len(c.idx),) + inten.shape)
        self.scatter_add(acc.num, conj_mode_sum(pd, chi, xp, overwrite), c.dy, c.dx)
        self.scatter_add(acc.den, inten, c.dy, c.dx)

    def intensity_sum(self, a: Any, out: Any = None) -> Any:
        """Σ_j |a_j|² over the first axis of ``a`` (b, M, M) complex64, added to ``out`` (M,
        M) float32 in place, or a new array when ``out`` is None. The numpy form sums the
        float views' squares (a C loop that holds no thread of BLAS); CuPy's einsum would be
        transposed copies and a batched matrix product: a GPU reads the patches once."""
        xp = self.xp
        if self.kernels is not None:
            if out is None:
                out = xp.zeros(a.shape[1:], np.float32)
            return self.kernels.intensity_sum(a, out)
        b, m = a.shape[0], a.shape[-1]
        av = a.view(np.float32).reshape(b, 2 * m * m)
        sq = xp.einsum("jp,jp->p", av, av)
        if out is None:
            return xp.add(sq[0::2].reshape(m, m), sq[1::2].reshape(m, m))
        out += sq[0::2].reshape(m, m)
        out += sq[1::2].reshape(m, m)
        return out

    def conj_product(self, o: Any, x: Any, overwrite: bool = False) -> Any:
        """conj(x_jk)·o_j for ``x`` (b, K, M, M) and ``o`` (b, M, M): into ``x`` with
        ``overwrite``, else a new array (GPU: a conjugate and a product in one pass)."""
        xp = self.xp
        if self.kernels is not None:
            return self.kernels.conj_product(o[:, None], x, x if overwrite else xp.empty_like(x))
        g = xp.conjugate(x, out=x) if overwrite else xp.conj(x)
        if g.shape[1] == 1:
            g0 = g[:, 0]
            xp.multiply(g0, o, out=g0)
        else:
            g *= o[:, None]
        return g

    def position_sum(self, ramp: Any, g: Any, out: Any = None) -> Any:
        """``out += Σ_j r_j·g_j`` over the positions of ``g`` (b, K, M, M) (overwritten), r_j
        the chunk's ramps (None: no ramp); ``out`` (K, M, M) complex64, or None for a new
        array. GPU: the ramps and the sum in one pass."""
        xp = self.xp
        b, k, m = g.shape[0], g.shape[1], g.shape[-1]
        if self.kernels is not None:
            if out is None:
                out = xp.zeros((k, m, m), np.complex64)
            return self.kernels.position_sum(ramp, g, out)
        if ramp is not None:
            if k == 1:
                g0 = g[:, 0]
                xp.multiply(ramp, g0, out=g0)
            else:
                xp.multiply(ramp[:, None], g, out=g)
        terms = g.view(np.float32).reshape(b, k, m, 2 * m).sum(axis=0)
        if out is None:
            return terms.view(np.complex64)
        acc = out.view(np.float32).reshape(k, m, 2 * m)
        xp.add(acc, terms, out=acc)
        return out

    def conj_ifft2(self, a: Any) -> Any:
        """F⁻¹[conj(a)] over the last two axes, a new array (GPU: the conjugate and the
        inverse FFT's 1/M² in one kernel, then the unscaled transform)."""
        if self.kernels is not None:
            m2 = a.shape[-1] * a.shape[-2]
            g = self.kernels.conj_product(np.complex64(1.0 / m2), a, self.xp.empty_like(a))
            return self.ifft2(g, scale=False)
        return self.ifft2(self.xp.conj(a))

    # -- steps ------------------------------------------------------------------------------
    def preconditioned_step(self, num: Any, den: Any, dmax: Any, c_den: float, c_max: float,
                            into: Any = None) -> Any:
        """The preconditioned step num / (c_den·den + c_max·dmax) (rPIE's object and probe
        steps, LSQ-ML's direction): in place in ``num`` (``den`` may be overwritten), and
        returned; with ``into``, ``into += num / (…)`` instead, returning ``into``. ``dmax``:
        a :meth:`~.arrays.ArrayBackend.scalar`, or an array that broadcasts (per position).
        numpy divides complex by real as a complex division: a real reciprocal and a product
        are 2x faster."""
        if self.kernels is not None:
            return self.kernels.preconditioned_step(num, den, dmax, c_den, c_max, into=into)
        if c_den != 1.0:
            den *= c_den
        den += c_max * dmax
        self.xp.reciprocal(den, out=den)
        num *= den
        if into is not None:
            into += num
            return into
        return num

    def axpy(self, y: Any, a: Any, x: Any) -> Any:
        """``y += a·x`` in place (``a``: a scalar)."""
        if self.kernels is not None:
            return self.kernels.axpy(y, a, x)
        y += a * x
        return y

    def step_systems(self, c: Any, pd: Any, direction: Any, oj: Any, sp: Any,
                     chi: Any) -> Any:
        """LSQ-ML's step-length systems of a chunk, rows [a11, a12, a22, b1, b2] (b, 5) of
        min ‖χ_j − β_O·pd_j·ΔO_j − β_P·O_j·sp_j‖², with Re Σ conj(d_s)·d_t and Re Σ conj(d_s)·χ
        summed over (K, M, M). ``direction``: the object's
        (:class:`~.accumulators.ObjectDirection`), or None when the object is not updated;
        ``sp``: the probe's direction at each position (b or 1, K, M, M), or None. GPU: one
        kernel that makes ΔO_j at the window from the accumulator (float64 rows); the numpy
        form gathers ΔO_j from the object-sized direction (float32 rows)."""
        xp = self.xp
        upd_obj, upd_probe = direction is not None, sp is not None
        if self.kernels is not None:
            acc = None if direction is None else direction.acc
            h, w = direction.shape if upd_obj else (0, c.width)
            return self.kernels.step_systems(
                pd, None if acc is None else acc.buffer, None if acc is None else direction.dmax,
                0.0 if acc is None else direction.alpha, c.flat, oj, sp, chi, h, w)
        # The directions at the positions, side by side (b, n, K, M, M): P_j ΔO_j and
        # O_j S_j[ΔP], each written by its product into its slot.
        b = len(c.idx)
        dirs = xp.empty((b, int(upd_obj) + int(upd_probe)) + chi.shape[1:], np.complex64)
        if upd_obj:
            xp.multiply(pd, self.patches(direction.array, c)[:, None], out=dirs[:, 0])
        if upd_probe:
            xp.multiply(oj[:, None], sp, out=dirs[:, -1])
        gram, rhs = step_system_sums(dirs, chi, xp)
        zero = xp.zeros(b, np.float32)
        if upd_obj and upd_probe:
            cols = [gram[:, 0, 0], gram[:, 0, 1], gram[:, 1, 1], rhs[:, 0], rhs[:, 1]]
        elif upd_obj:
            cols = [gram[:, 0, 0], zero, zero, rhs[:, 0], zero]
        else:
            cols = [zero, zero, gram[:, 0, 0], zero, rhs[:, 0]]
        return xp.stack(cols, axis=1)

    def step_lengths(self, tot: Any, both: bool, damping: float) -> tuple[Any, Any]:
        """(β_O, β_P) from a batch's summed system ``tot`` = [a11, a12, a22, b1, b2] (float64):
        the 2×2 solve (each alone unless ``both``), clipped at 0 — never a step against the
        direction — and damped; as :meth:`~.arrays.ArrayBackend.scalars` gives them (GPU: one
        thread of one kernel instead of ~14 kernels on 0-d arrays)."""
        xp = self.xp
        if self.kernels is not None:
            steps = self.kernels.step_lengths(tot, both, damping)
            return steps[0], steps[1]
        lam = 1e-6 * (tot[0] + tot[2]) + 1e-30
        diag = tot[0:3:2] + lam  # a11 + λ, a22 + λ
        b12, b21 = tot[3:5], tot[4:2:-1]  # (b1, b2) and (b2, b1)
        if both:
            det = diag[0] * diag[1] - tot[1] ** 2
            # β_O = ((a22+λ) b1 − a12 b2)/det, β_P = ((a11+λ) b2 − a12 b1)/det
            betas = diag[::-1] * b12 - tot[1] * b21
            betas /= det
        else:
            betas = b12 / diag
        step_o, step_p = self.scalars(xp.maximum(betas, 0.0), damping)
        return step_o, step_p
