"""The PIE family (ePIE, rPIE): one sweep, and an object and probe step rule per algorithm.

For each batch: forward model and modulus projection for every position (the sweep of
:class:`~.algorithm.Algorithm`), then for each object layer

    O ← O + object_step(Σ_j conj(ψ_j)χ_j, Σ_j |ψ_j|², max)
    P ← P + probe_step(Σ_j S_j^H[conj(O_j)χ_j], Σ_j |O_j|², max)

both from the values before the batch (ψ_j the wave incident on the layer: the shifted probe
for a thin sample). With S layers (3PIE: Maiden, Humphry & Rodenburg, JOSA A 29, 1606
(2012)) each layer's correction χ_s comes back from the layer behind it whole, so every
layer's step would explain the same residual again; applied together, as a batch applies
them, they overshoot S-fold and diverge. Each layer's object step is therefore its share,
1/S of the rule's (measured on a two-layer scan 400 µm apart: the full step diverges, the
share converges). With ``sparse`` batches (no two windows overlap) the
object update is applied per window inside the chunk — identical to sequential PIE for the
object — and needs no object-sized accumulator.
"""

from __future__ import annotations

from typing import Any

from ..core import Chunk
from ..forward import Waves
from .base import Algorithm, PartSums, Sweep

__all__ = ["PIEFamily"]


class PIEFamily(Algorithm):
    """ePIE/rPIE-style updates from a batch, sharing everything but the step rule.

    The default rule is rPIE's form, num / (c_den·den + c_max·max), with the
    (c_den, c_max) of :attr:`object_preconditioner` and :attr:`probe_preconditioner`."""

    # Whether object_step writes into ``den``: in sparse mode it then gets a copy of the
    # shared probe intensity per set (ePIE's step reads only the maximum: no copy kernel).
    object_step_writes_den = True
    batch_graphs = True  # random batches only (Algorithm.run_batch): sparse sets vary

    @property
    def object_preconditioner(self) -> tuple[float, float] | None:
        """(c_den, c_max) of the object step, or None for a rule of another form (then a
        GPU does not add the step in the accumulators' pass: ObjectSteps.update)."""
        return None

    @property
    def probe_preconditioner(self) -> tuple[float, float]:  # pragma: no cover
        raise NotImplementedError

    def object_step(self, num: Any, den: Any, den_max: Any) -> Any:
        """The object increment from Σconj(ψ)χ, Σ|ψ|² and its maximum (may overwrite
        ``num``/``den``; in sparse mode ``den`` is the shared probe intensity — read only
        unless :attr:`object_step_writes_den`). ``den_max`` is a
        :meth:`ArrayBackend.scalar`: a float, or a 0-d array on a GPU."""
        return self.core.backend.preconditioned_step(num, den, den_max,
                                                     *self.object_preconditioner)

    def add_probe_step(self, num: Any, den: Any, den_max: Any) -> None:
        """P ← P + the probe step from Σ S^H[conj(O)χ], Σ|O|² and its maximum (may overwrite
        ``num``/``den``)."""
        core = self.core
        core.backend.preconditioned_step(num, den, den_max, *self.probe_preconditioner,
                                         into=core.probe)

    @property
    def sparse(self) -> bool:
        return self.params.selection == "sparse"

    def accumulates_object(self, update_object: bool) -> bool:
        return update_object and not self.sparse

    def begin_batch(self, idx: Any, it: int) -> Sweep:
        sw = super().begin_batch(idx, it)
        # Sparse batches step each window with the unshifted probe intensity and its max.
        self._pint = self.core.probe_intensity()
        self._pmax = self.core.backend.scalar(self._pint.max()) if self.sparse else 0.0
        return sw

    def chunk_update(self, sw: Sweep, sums: PartSums, c: Chunk, w: Waves,
                     chis: list[Any]) -> None:
        if sw.update_object and self.sparse:
            model = self.model
            for layer in range(model.layers):
                if layer == 0:  # the probe's: the same for every window
                    den = self._pint.copy() if self.object_step_writes_den else self._pint
                    dmax = self._pmax
                else:
                    den, dmax = model.incident_intensity(w, layer)
                num = self.object_step(model.object_num(w, chis, c, layer), den, dmax)
                num += w.patches[layer]
                model.set_object_patches(c, layer, num)
        super().chunk_update(sw, sums, c, w, chis)

    def update(self, sw: Sweep, sums: list[PartSums]) -> None:
        core = self.core
        if sw.accs is not None:
            for layer, accs in enumerate(sw.accs):
                self.objects.update(
                    accs, layer, sw.bbox,
                    lambda num, den, dmax, _sl: self.object_step(num, den, dmax),
                    preconditioner=self.object_preconditioner)
        if sw.update_probe:
            pnum, pden = self.probe_sums(sums)
            self.add_probe_step(self.model.probe_from_terms(pnum), pden,
                                core.backend.scalar(pden.max()))
            core.probe_changed()
