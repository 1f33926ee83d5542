"""DM — the difference map.

P. Thibault, M. Dierolf, A. Menzel, O. Bunk, C. David & F. Pfeiffer, "High-resolution
scanning X-ray diffraction microscopy", Science 321, 379 (2008); P. Thibault, M. Dierolf,
O. Bunk, A. Menzel & F. Pfeiffer, "Probe retrieval in ptychographic coherent diffractive
imaging", Ultramicroscopy 109, 338 (2009).

All exit waves ψ_j are kept. With φ_j = P_j·O_j from the current overlap projection,

    ψ_j ← ψ_j + Π_F(2φ_j − ψ_j) − φ_j

and then the overlap projection refits object and probe to the new ψ:

    O = (Σ_j conj(P_j) ψ_j + δ_O O) / (Σ_j |P_j|² + δ_O),
    P = (Σ_j S_j^H[conj(O_j) ψ_j] + δ_P P) / (Σ_j |O_j|² + δ_P),

with δ = (alpha, beta) × the largest denominator (the δ·O term keeps unscanned regions
as they were instead of zeroing them). Choices made here:

* The exit waves are stored in the far field, Ψ_j = F[ψ_j]; then the update is
  Ψ_j ← Φ_j + c(2Φ_j − Ψ_j), where c(Z) = Π_F(Z) − Z, and costs no FFT beyond Φ_j = F[φ_j]
  (which also gives the model's loss). Memory: N·K·M² complex64.
* One alternation of Thibault's inner loop: the object is refitted first, then the probe
  with the new object (refitting both from the same old pair is a Jacobi step on a
  bilinear problem and lets the object/probe scale run away). The probe pass recomputes
  ψ_j = F⁻¹[Ψ_j] rather than holding a second copy of all exit waves, so an iteration
  costs five FFTs per position and mode.
* ``batch_size`` only sets how many positions are processed at once; DM is global.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import Chunk, Core
from ..forward import Waves
from .base import Algorithm, PartSums, Sweep

__all__ = ["DM"]


class DM(Algorithm):
    name = "dm"

    def __init__(self, core: Core, params: Any):
        super().__init__(core, params)
        self.exit: Any = None

    # -- memory -----------------------------------------------------------------------------
    @classmethod
    def device_bytes(cls, params: Any, n: int, k: int, m: int) -> int:
        # Every exit wave (complex64), twice: a snapshot copies them device→device before
        # the copy to the host (the engine goes on meanwhile), so the memory plan keeps room
        # for that copy rather than running out of memory at a checkpoint.
        return 2 * n * k * m * m * 8

    def load_extras(self, extras: dict[str, np.ndarray]) -> None:
        core, xp = self.core, self.core.xp
        shape = (core.N, core.K, core.M, core.M)
        self.exit = xp.zeros(shape, np.complex64)
        have = 0
        ew = extras.get("dm_exit_waves")
        if ew is not None:
            ew = np.asarray(ew)
            if ew.ndim != 4 or ew.shape[1:] != shape[1:] or ew.shape[0] > core.N:
                raise ValueError(
                    f"DM: extra 'dm_exit_waves' has shape {ew.shape}, expected up to {shape}"
                )
            have = ew.shape[0]
            self.exit[:have] = core.backend.to_device(ew)
        if have < core.N:  # fresh start, or frames appended: start from φ_j = P_j·O_j
            for part in core.subchunks(np.arange(have, core.N)):
                c = core.chunk(part)
                self.exit[c.didx] = self.model.forward(self.model.shifted_probe(c), c).detector

    def device_extras(self) -> dict[str, Any]:
        return {"dm_exit_waves": self.exit}

    def modes_mixed(self, transform: Any) -> None:
        xp = self.core.xp
        t = xp.asarray(transform, np.complex64)
        self.exit = xp.einsum("kl,nlij->nkij", t, self.exit).astype(np.complex64)

    def shifted(self, s: tuple[float, float]) -> None:
        # ψ_j(u) → ψ_j(u + s): a phase ramp on the stored far-field exit waves.
        core = self.core
        ramp = core.shift_ramp((core.M, core.M), s)
        for part in core.subchunks(np.arange(core.N)):
            self.exit[core.backend.to_device(part)] *= ramp

    # -- iteration --------------------------------------------------------------------------
    probe_terms_in_sweep = False  # the probe is refitted to the new ψ with the new object

    def exit_correction(self, sw: Sweep, c: Chunk, big: Any) -> tuple[Any, Any]:
        """The model's loss; χ (for position steps only) from the model's own modulus
        correction Π_F(φ)−φ (the DM update ψ_new − φ carries the iterate's memory, not a data
        residual). ``big`` (Φ) is kept for the exit-wave update."""
        model = self.model
        if sw.grads is None:
            return model.amplitude_residual(big, c)[2], None
        chi = big.copy()
        loss = model.modulus_projection(chi, c)
        return loss, model.to_sample(chi, c)

    def chunk_update(self, sw: Sweep, sums: PartSums, c: Chunk, w: Waves,
                     chis: list[Any]) -> None:
        """ψ ← ψ + Π_F(2φ−ψ) − φ, and the object refit's sums from the new ψ."""
        model, big = self.model, w.detector
        z = self.exit[c.didx]  # a copy (fancy index)
        z *= -1
        z += big
        z += big  # 2Φ − Ψ
        model.modulus_projection(z, c)  # z ← Π_F(2Φ−Ψ) − (2Φ−Ψ)
        z += big  # Ψ + Π_F(2Φ−Ψ) − Φ
        self.exit[c.didx] = z
        if sums.accs is not None:
            model.accumulate_object(sums.accs[0], w, [model.to_sample(z, c)], c, 0, keep=True,
                                    exact=True)

    def probe_pass(self, _t: int, part: np.ndarray) -> PartSums:
        """Σ_j S_j^H[conj(O_j) ψ_j] and Σ_j |O_j|² with the refitted object."""
        core, model = self.core, self.model
        sums = PartSums(None, probe=True)
        for sub in core.subchunks(part):
            c = core.chunk(sub)
            w = Waves([], [model.object_patches(c, 0)], None)
            psi = model.to_sample(self.exit[c.didx], c)
            sums.probe_num, sums.probe_den = model.probe_terms(
                w, [psi], c, sums.probe_num, sums.probe_den)
        return sums

    def update(self, sw: Sweep, sums: list[PartSums]) -> None:
        core, xp = self.core, self.core.xp
        if sw.accs is not None:
            alpha = self.params.alpha_value

            def refit(num: Any, den: Any, dmax: float, sl: tuple[slice, slice]) -> Any:
                delta = alpha * dmax
                num += delta * core.obj[0][sl]
                den += delta
                xp.reciprocal(den, out=den)
                num *= den
                return num

            self.objects.update(sw.accs[0], 0, sw.bbox, refit, replace=True)
        if sw.update_probe:
            pnum, pden = self.probe_sums(core.map_list(self.probe_pass, sw.parts))
            delta = self.params.beta_value * core.backend.scalar(pden.max())
            new = self.model.probe_from_terms(pnum)
            new += delta * core.probe
            new /= pden + delta
            core.probe = new.astype(np.complex64)
            core.probe_changed()
