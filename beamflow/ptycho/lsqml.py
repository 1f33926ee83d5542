"""LSQ-ML — least-squares maximum-likelihood ptychography.

M. Odstrčil, A. Menzel & M. Guizar-Sicairos, "Iterative least-squares solver for generalized
maximum-likelihood ptychography", Opt. Express 26, 3108–3123 (2018).

Per batch:

1. Far-field update from the likelihood (section 2.2): Gaussian (amplitude) noise gives the
   modulus projection, χ̂ = Ψ(√I/|Ψ| − 1); Poisson noise gives χ̂ = −a_j ξ Ψ with
   ξ = 1 − I/Î, and the per-position step a_j ∈ [0, 1] from a few fixed-point iterations of
   ∂/∂a of the Poisson likelihood along that direction (as PtychoShelves/Pty-Chi do).
2. Preconditioned search directions accumulated over the batch (eq. 24–25):
   ΔO = Σ_j conj(P_j)χ_j / (Σ_j|P_j|² + δ_O),  ΔP = Σ_j S_j^H[conj(O_j)χ_j] / (Σ_j|O_j|² + δ_P),
   δ = alpha × the largest denominator.
3. Per position, the step lengths (β_O, β_P) solve the 2×2 least-squares problem
   min ‖χ_j − β_O P_j ΔO_j − β_P O_j S_j[ΔP]‖² (eq. 22–23); their batch mean, clipped at 0
   and damped by ``beta``, updates O ← O + β_O ΔO and P ← P + β_P ΔP.

This costs five FFTs per position and mode (the fifth shifts ΔP to each position for the
step-length system).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .core import Algorithm, Chunk
from .positions import object_gradient, position_steps

__all__ = ["LSQML"]


def _rdot(a: Any, b: Any) -> Any:
    """Re Σ conj(a)·b over all axes but the first → (b,)."""
    return (a.real * b.real + a.imag * b.imag).sum(axis=tuple(range(1, a.ndim)))


class LSQML(Algorithm):
    name = "lsqml"

    def poisson_correction(self, big: Any, c: Chunk) -> Any:
        """Turn Ψ into the Poisson-likelihood far-field correction in place; return the loss."""
        core, xp = self.core, self.core.xp
        amp, _, loss = core.amplitude_residual(big, c)
        imod = xp.square(amp)
        meas = xp.square(core.sqrt_data[c.idx])
        xi = 1.0 - meas / (imod + core.eps**2)
        xi *= core.mask
        den = (xp.square(xi) * imod).sum(axis=(1, 2)) + 1e-30
        a = xp.full((len(c.idx),), 0.5, np.float32)
        for _ in range(3):  # fixed point of the 1-D likelihood optimum, damped
            t = xp.maximum(1.0 - a[:, None, None] * xi, 1e-3)
            num = (xi * (imod - meas / t)).sum(axis=(1, 2))
            a = xp.clip(0.5 * a + 0.5 * num / den, 0.0, 1.0).astype(np.float32)
        xi *= -a[:, None, None]
        big *= xi[:, None]
        return loss

    def run_batch(self, idx: np.ndarray, it: int) -> list[Any]:
        core, xp, be = self.core, self.core.xp, self.core.backend
        upd_obj, upd_probe, pos_corr = self.flags(it)
        k, m = core.K, core.M
        parts = core.split(idx)
        accs = core.accumulators(len(parts) + 1) if upd_obj else None
        bb = core.bbox(idx)
        grads = object_gradient(core.obj, xp) if pos_corr else None
        poisson = self.params.noise_model == "poisson"
        core.prepare()

        def work(t: int, part: np.ndarray):
            if accs is not None:
                accs[t][0][bb] = 0
                accs[t][1][bb] = 0
            pnum = xp.zeros((k, m, m), np.complex64) if upd_probe else None
            pden = xp.zeros((m, m), np.float32) if upd_probe else None
            losses, steps, kept = [], [], []
            for sub in core.subchunks(part):
                c = core.chunk(sub)
                pd = core.shifted_probe(c)
                oj = core.object_patches(c)
                big = core.to_detector(pd, oj, c)
                if poisson:
                    losses.append(self.poisson_correction(big, c))
                else:
                    losses.append(core.modulus_projection(big, c))
                chi = core.to_sample(big, c)
                if grads is not None:
                    steps.append(position_steps(pd, be.gather(grads[0], c.iy, c.ix, m),
                                                be.gather(grads[1], c.iy, c.ix, m), chi, xp))
                kept.append((c, pd if c.ramp is None else pd.copy(), oj.copy(), chi.copy()))
                if upd_obj:
                    core.accumulate_object(accs[t], core.object_num(pd, chi, c), c)
                if upd_probe:
                    core.probe_terms(oj, chi, c, pnum, pden)
            return losses, pnum, pden, steps, kept

        results = core.map_parts(work, idx)
        alpha = self.params.alpha_value
        d_obj = None
        if upd_obj:
            # ΔO lives in the spare accumulator (only its box is read).
            d_obj = accs[len(parts)][0]

            def direction(num: Any, den: Any, dmax: float, _sl: Any) -> Any:
                den += alpha * dmax
                xp.reciprocal(den, out=den)
                num *= den
                return num

            core.update_object(accs[: len(parts)], bb, direction, target=d_obj, replace=True)
        d_probe = d_probe_hat = None
        if upd_probe:
            pnum, pden = results[0][1], results[0][2]
            for r in results[1:]:
                pnum += r[1]
                pden += r[2]
            d_probe = core.probe_from_terms(pnum) / (pden + alpha * float(pden.max()))
            d_probe = d_probe.astype(np.complex64)
            if core.subpixel:
                d_probe_hat = core.spectrum(d_probe)

        def systems(t: int, part: np.ndarray):
            rows = []
            for c, pd, oj, chi in results[t][4]:
                a_o = pd * be.gather(d_obj, c.iy, c.ix, m)[:, None] if upd_obj else None
                if upd_probe:
                    if c.ramp is None:
                        sp = d_probe[None]
                    else:
                        sp = be.ifft2(d_probe_hat[None] * c.ramp[:, None],
                                      workers=core.fft_workers, scale=False)
                    a_p = oj[:, None] * sp
                zero = xp.zeros(len(c.idx), np.float32)
                rows.append(xp.stack([
                    _rdot(a_o, a_o) if upd_obj else zero,
                    _rdot(a_o, a_p) if upd_obj and upd_probe else zero,
                    _rdot(a_p, a_p) if upd_probe else zero,
                    _rdot(a_o, chi) if upd_obj else zero,
                    _rdot(a_p, chi) if upd_probe else zero,
                ], axis=1))
            return xp.concatenate(rows) if rows else None

        if upd_obj or upd_probe:
            sys = np.concatenate([be.to_host(r) for r in core.map_parts(systems, idx)
                                  if r is not None]).astype(np.float64)
            a11, a12, a22, b1, b2 = sys.T
            lam = 1e-6 * (a11 + a22) + 1e-30
            if upd_obj and upd_probe:
                det = (a11 + lam) * (a22 + lam) - a12**2
                beta_o = ((a22 + lam) * b1 - a12 * b2) / det
                beta_p = ((a11 + lam) * b2 - a12 * b1) / det
            else:
                beta_o = b1 / (a11 + lam)
                beta_p = b2 / (a22 + lam)
            damp = self.params.beta_value
            if upd_obj:
                step = damp * float(np.mean(np.clip(beta_o, 0.0, None)))
                core.obj[bb] += step * d_obj[bb]
            if upd_probe:
                step = damp * float(np.mean(np.clip(beta_p, 0.0, None)))
                core.probe += step * d_probe
                core.probe_changed()
        if pos_corr:
            self.apply_position_steps(parts, [s for r in results for s in r[3]])
        return [v for r in results for v in r[0]]
