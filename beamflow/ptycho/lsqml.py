"""LSQ-ML — least-squares maximum-likelihood ptychography.

M. Odstrčil, A. Menzel & M. Guizar-Sicairos, "Iterative least-squares solver for generalized
maximum-likelihood ptychography", Opt. Express 26, 3108–3123 (2018).

Per batch:

1. Far-field update from the likelihood (section 2.2): Gaussian (amplitude) noise gives the
   modulus projection, χ̂ = Ψ(√I/|Ψ| − 1); Poisson noise gives χ̂ = −a_j ξ Ψ with
   ξ = 1 − I/(Î + δ) (δ: a floor, :data:`POISSON_FLOOR`), and the per-position step
   a_j ∈ [0, 1] from a few fixed-point iterations of ∂/∂a of the Poisson likelihood along
   that direction (as PtychoShelves/Pty-Chi do).
2. Preconditioned search directions accumulated over the batch (eq. 24–25):
   ΔO = Σ_j conj(P_j)χ_j / (Σ_j|P_j|² + δ_O),  ΔP = Σ_j S_j^H[conj(O_j)χ_j] / (Σ_j|O_j|² + δ_P),
   δ = alpha × the largest denominator.
3. The step lengths (β_O, β_P) solve the 2×2 least-squares problem
   min Σ_j ‖χ_j − β_O P_j ΔO_j − β_P O_j S_j[ΔP]‖² (eq. 22–23) summed over the batch's
   positions — one step pair for the directions the batch shares, not the mean of each
   position's own (which overshoots where the batch's windows overlap); clipped at 0 and
   damped by ``beta``, they update O ← O + β_O ΔO and P ← P + β_P ΔP.

This costs five FFTs per position and mode (the fifth shifts ΔP to each position for the
step-length system).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .algorithm import Algorithm, PartSums, Sweep
from .forward import Chunk

__all__ = ["LSQML"]

# The Poisson correction −ξΨ = (I/Î − 1)Ψ is singular where the model is dark (Î → 0, I > 0):
# there it grows like I/|Ψ| along the phase of a near-zero Ψ, which is float32 rounding
# noise, so two devices (or FFT libraries, or summation orders) that round Ψ differently
# take visibly different steps and drift apart (0.4 % in the loss after 5 iterations,
# 10 % after 30; float64 sums do not help: the sums are not where the error is made).
# Î is floored at this fraction of the mean measured intensity: it removes the drift (to
# ~1e-7 after 5 iterations, 3e-4 after 30) and leaves the reconstruction's quality alone
# (docs/performance.md, "LSQ-ML on two devices").
POISSON_FLOOR = 1e-3


def _rdot(a: Any, b: Any) -> Any:
    """Re Σ conj(a)·b over all axes but the first → (b,)."""
    return (a.real * b.real + a.imag * b.imag).sum(axis=tuple(range(1, a.ndim)))


def _systems(dirs: Any, chi: Any, xp: Any) -> tuple[Any, Any]:
    """The step-length systems' sums for directions ``dirs`` (b, n, K, M, M) and the
    corrections ``chi`` (b, K, M, M): Re Σ conj(d_s)·d_t → (b, n, n) and Re Σ conj(d_s)·χ
    → (b, n), each sum over (K, M, M). The CPU's (a GPU makes the directions and these sums
    in one kernel, :meth:`.kernels.GpuKernels.step_systems`)."""
    b, n = dirs.shape[:2]
    gram = xp.empty((b, n, n), np.float32)
    rhs = xp.empty((b, n), np.float32)
    for s in range(n):
        for t in range(s, n):
            gram[:, s, t] = gram[:, t, s] = _rdot(dirs[:, s], dirs[:, t])
        rhs[:, s] = _rdot(dirs[:, s], chi)
    return gram, rhs


class LSQML(Algorithm):
    name = "lsqml"
    batch_graphs = True

    def poisson_correction(self, big: Any, c: Chunk, scale: Any = None) -> Any:
        """Turn Ψ into the Poisson-likelihood far-field correction in place (times ``scale``
        when one is given); return the loss."""
        core, xp = self.core, self.core.xp
        amp, _, loss = core.amplitude_residual(big, c)
        imod = xp.square(amp)
        meas = xp.square(core.frames.amplitudes(c.idx, c.didx))
        xi = 1.0 - meas / (imod + np.float32(POISSON_FLOOR * core.mean_intensity))
        xi *= core.mask
        den = (xp.square(xi) * imod).sum(axis=(1, 2)) + 1e-30
        a = xp.full((len(c.idx),), 0.5, np.float32)
        for _ in range(3):  # fixed point of the 1-D likelihood optimum, damped
            t = xp.maximum(1.0 - a[:, None, None] * xi, 1e-3)
            num = (xi * (imod - meas / t)).sum(axis=(1, 2))
            # float32 already (a, num and den are): no astype copy.
            a = xp.clip(0.5 * a + 0.5 * num / den, 0.0, 1.0)
        a *= -1.0 if scale is None else -scale
        xi *= a[:, None, None]
        big *= xi[:, None]
        return loss

    @classmethod
    def device_bytes(cls, params: Any, n: int, k: int, m: int) -> int:
        # The batch's kept P_j, O_j and χ_j for the step-length systems.
        return params.batch_size_for(n) * (2 * k + 1) * m * m * 8

    def fourier_constraint(self, big: Any, c: Chunk, scale: Any = None) -> Any:
        if self.params.noise_model == "poisson":
            return self.poisson_correction(big, c, scale)
        return self.core.modulus_projection(big, c, scale)

    def chunk_update(self, sw: Sweep, sums: PartSums, c: Chunk, pd: Any, oj: Any, big: Any,
                     chi: Any) -> None:
        # The step-length systems need P_j, O_j and χ_j after the batch: the terms are made
        # into new arrays instead of over them (no copies to keep).
        core = self.core
        sums.kept.append((c, pd, oj, chi))
        if sums.acc is not None:
            core.accumulate_object(sums.acc, pd, chi, c, keep_probe=True)
        if sums.probe:
            sums.probe_num, sums.probe_den = core.probe_terms(
                oj, chi, c, sums.probe_num, sums.probe_den, keep=True)

    def update(self, sw: Sweep, sums: list[PartSums]) -> None:
        core, xp, be = self.core, self.core.xp, self.core.backend
        upd_obj, upd_probe, bb = sw.update_object, sw.update_probe, sw.bbox
        alpha = self.params.alpha_value
        d_obj = acc = dmax = None
        # A GPU never writes ΔO = num / (den + α·max) over the object: the step systems make
        # it at the windows from the accumulator and the maximum its scatter took, and the
        # step adds β_O·ΔO to the object and clears the accumulator in one pass.
        fused = upd_obj and core.fused_step(sw.accs)
        if fused:
            acc = sw.accs[0]
            dmax = core.accumulated_max(acc)
        elif upd_obj:
            # ΔO is made in place in the first part's numerator, where the parts' sums are
            # combined (only its box is read): no copy into another array.
            d_obj = sw.accs[0].num

            def direction(num: Any, den: Any, dmax: float, _sl: Any) -> Any:
                den += alpha * dmax
                xp.reciprocal(den, out=den)
                num *= den
                return num

            core.update_object(sw.accs, bb, direction, write=False)
        d_probe = d_probe_hat = None
        if upd_probe:
            pnum, pden = self.probe_sums(sums)
            # In place on the new array from probe_from_terms: complex64 already.
            d_probe = core.probe_from_terms(pnum)
            if be.kernels is not None:
                be.kernels.preconditioned_step(d_probe, pden, be.scalar(pden.max()), 1.0, alpha)
            else:
                pden += alpha * be.scalar(pden.max())
                xp.reciprocal(pden, out=pden)
                d_probe *= pden
            if core.subpixel:
                d_probe_hat = core.spectrum(d_probe)

        def systems(t: int, _part: np.ndarray) -> Any:
            rows = []
            for c, pd, oj, chi in sums[t].kept:
                sp = None  # S_j[ΔP], the probe direction at each position
                if upd_probe:
                    if c.ramp is None:
                        sp = d_probe[None]
                    else:
                        hat = (be.kernels.ramp_product(c.ramp, d_probe_hat[None])
                               if be.kernels is not None else c.ramp[:, None] * d_probe_hat[None])
                        sp = be.ifft2(hat, workers=core.fft_workers, scale=False)
                if be.kernels is not None and d_obj is None:  # directions and sums, one pass
                    rows.append(be.kernels.step_systems(
                        pd, None if acc is None else acc.buffer, dmax, alpha, c.flat, oj, sp,
                        chi, core.H, core.W))
                    continue
                # The directions at the positions, side by side (b, n, K, M, M): P_j ΔO_j
                # and O_j S_j[ΔP], each written by its product into its slot.
                dirs = xp.empty((len(c.idx), int(upd_obj) + int(upd_probe)) + chi.shape[1:],
                                np.complex64)
                if upd_obj:
                    xp.multiply(pd, core.object_patches(c, d_obj)[:, None],
                                out=dirs[:, 0])
                if upd_probe:
                    xp.multiply(oj[:, None], sp, out=dirs[:, -1])
                gram, rhs = _systems(dirs, chi, xp)
                zero = xp.zeros(len(c.idx), np.float32)
                if upd_obj and upd_probe:
                    cols = [gram[:, 0, 0], gram[:, 0, 1], gram[:, 1, 1], rhs[:, 0], rhs[:, 1]]
                elif upd_obj:
                    cols = [gram[:, 0, 0], zero, zero, rhs[:, 0], zero]
                else:
                    cols = [zero, zero, gram[:, 0, 0], zero, rhs[:, 0]]
                rows.append(xp.stack(cols, axis=1))
            if len(rows) > 1:
                return xp.concatenate(rows)
            return rows[0] if rows else None

        if upd_obj or upd_probe:
            # Solved on the device, in float64: no copy to the host inside the iteration.
            parts = [r for r in core.map_list(systems, sw.parts) if r is not None]
            sys = parts[0] if len(parts) == 1 else xp.concatenate(parts)
            if sys.dtype != np.float64:  # the fused kernel's rows are float64 already
                sys = sys.astype(np.float64)
            # One step pair for the batch, from the positions' systems summed: rows of sys
            # are a11, a12, a22, b1, b2 per position, so the sums are the normal equations of
            #   min over (β_O, β_P) of Σ_j ‖χ_j − β_O P_j ΔO_j − β_P O_j S_j[ΔP]‖²,
            # the least-squares step for the update as it is applied: one ΔO and one ΔP
            # shared by every position of the batch. The mean of each position's own
            # solution (what this did before) overshoots wherever the batch's windows
            # overlap: ΔO at position j is its χ_j averaged with its neighbours' over the
            # summed illumination, so P_j ΔO_j carries ~1/k of χ_j where k windows of the
            # batch overlap, and j alone asks for β_O ≈ k — yet every pixel then gets k
            # times the average of k corrections. On the 400-position benchmark scan
            # (random batches of 128, object alone) the per-position β_O had a mean of ~2
            # (90th percentile 4-5) from the second iteration on, where the batch's
            # least-squares step was 0.5-0.7: 0.9 × the mean is 3-4 times the optimum,
            # past the 2x beyond which a step along the direction grows the residual it
            # should shrink, and LSQ-ML diverged (object alone: to a loss of 3e12 in 20
            # iterations). The sum weights each position by its ‖d_j‖², so positions with
            # a tiny a11 and a huge ratio do not dominate either.
            tot = sys.sum(axis=0)
            step_o, step_p = self._step_lengths(tot, upd_obj and upd_probe)
            if fused:
                core.apply_object_step(acc, bb, dmax, 1.0, alpha, step=step_o)
            elif upd_obj:
                region = core.obj[bb]
                xp.add(region, step_o * d_obj[bb], out=region)
            if upd_probe:
                if be.kernels is not None:
                    be.kernels.axpy(core.probe, step_p, d_probe)
                else:
                    core.probe += step_p * d_probe
                core.probe_changed()

    def _step_lengths(self, tot: Any, both: bool) -> tuple[Any, Any]:
        """(β_O, β_P) from the batch's summed system ``tot`` = [a11, a12, a22, b1, b2]:
        the 2×2 solve (each alone when one direction is not updated), clipped at 0 — never
        a step against the direction — and damped by ``beta``; as
        :meth:`ArrayBackend.scalars` gives them. On a GPU one kernel does it."""
        be, xp = self.core.backend, self.core.xp
        if be.kernels is not None:
            steps = be.kernels.step_lengths(tot, both, self.params.beta_value)
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
        step_o, step_p = be.scalars(xp.maximum(betas, 0.0), self.params.beta_value)
        return step_o, step_p
