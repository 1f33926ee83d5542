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

from ..core import Chunk
from ..forward import Waves
from .base import Algorithm, PartSums, Sweep

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


class LSQML(Algorithm):
    name = "lsqml"
    batch_graphs = True

    def poisson_correction(self, big: Any, c: Chunk, scale: Any = None) -> Any:
        """Turn Ψ into the Poisson-likelihood far-field correction in place (times ``scale``
        when one is given); return the loss."""
        core, xp = self.core, self.core.xp
        amp, _, loss = self.model.amplitude_residual(big, c)
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
        return self.model.modulus_projection(big, c, scale)

    def chunk_update(self, sw: Sweep, sums: PartSums, c: Chunk, w: Waves,
                     chis: list[Any]) -> None:
        # The step-length systems need the waves and corrections after the batch: the terms
        # are made into new arrays instead of over them (no copies to keep).
        model = self.model
        sums.kept.append((c, w, chis))
        if sums.accs is not None:
            for layer, acc in enumerate(sums.accs):
                model.accumulate_object(acc, w, chis, c, layer, keep=True)
        if sums.probe:
            sums.probe_num, sums.probe_den = model.probe_terms(
                w, chis, c, sums.probe_num, sums.probe_den, keep=True)

    def update(self, sw: Sweep, sums: list[PartSums]) -> None:
        core, xp, be = self.core, self.core.xp, self.core.backend
        alpha = self.params.alpha_value
        # Each layer's direction ΔO = num / (den + α·max) (a GPU never writes it over the
        # object: the step systems make it at the windows from the accumulator and the
        # maximum its scatter took, and the step adds β_O·ΔO and clears the accumulator in
        # one pass).
        dirs = [self.objects.direction(accs, layer, sw.bbox, alpha)
                for layer, accs in enumerate(sw.accs)] if sw.update_object else None
        d_probe = d_probe_hat = None
        if sw.update_probe:
            pnum, pden = self.probe_sums(sums)
            # In place on the new array from probe_from_terms: complex64 already.
            d_probe = self.model.probe_from_terms(pnum)
            be.preconditioned_step(d_probe, pden, be.scalar(pden.max()), 1.0, alpha)
            if core.subpixel:
                d_probe_hat = core.spectrum(d_probe)

        def probe_at(c: Chunk) -> Any:
            """S_j[ΔP], the probe direction at each position."""
            if c.ramp is None:
                return d_probe[None]
            hat = be.ramp_product(c.ramp, d_probe_hat[None])
            return be.ifft2(hat, workers=core.fft_workers, scale=False)

        # One step length per layer: the first layer's jointly with the probe's, each from
        # its own plane's system (the corrections χ_s there; for a thin sample the exit wave).
        for layer in range(self.model.layers):
            d_obj = None if dirs is None else dirs[layer]
            probe = sw.update_probe and layer == 0
            if d_obj is None and not probe:
                continue

            def systems(t: int, _part: np.ndarray, layer: int = layer, d_obj: Any = d_obj,
                        probe: bool = probe) -> Any:
                rows = [be.step_systems(c, w.incident[layer], d_obj, w.patches[layer],
                                        probe_at(c) if probe else None, chis[layer])
                        for c, w, chis in sums[t].kept]
                if len(rows) > 1:
                    return xp.concatenate(rows)
                return rows[0] if rows else None

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
            step_o, step_p = be.step_lengths(tot, d_obj is not None and probe,
                                             self.params.beta_value)
            if d_obj is not None:
                if self.model.layers > 1:
                    # Each layer's step length solves its own plane's system, as if the
                    # others stood still: each of S layers takes its share 1/S (pie.py).
                    step_o = step_o * (1.0 / self.model.layers)
                self.objects.add_direction(d_obj, step_o)
            if probe:
                be.axpy(core.probe, step_p, d_probe)
                core.probe_changed()
