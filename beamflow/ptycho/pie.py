"""The PIE family (ePIE, rPIE): one sweep, and an object and probe step rule per algorithm.

For each batch: forward model and modulus projection for every position (the sweep of
:class:`~.algorithm.Algorithm`), then

    O ← O + object_step(Σ_j conj(P_j)χ_j, Σ_j |P_j|², max)
    P ← P + probe_step(Σ_j S_j^H[conj(O_j)χ_j], Σ_j |O_j|², max)

both from the values before the batch. With ``sparse`` batches (no two windows overlap)
the object update is applied per window inside the chunk — identical to sequential PIE
for the object — and needs no object-sized accumulator.
"""

from __future__ import annotations

from typing import Any

from .algorithm import Algorithm, PartSums, Sweep
from .forward import Chunk

__all__ = ["PIEFamily"]


class PIEFamily(Algorithm):
    """ePIE/rPIE-style updates from a batch, sharing everything but the step rule."""

    # Whether object_step writes into ``den``: in sparse mode it then gets a copy of the
    # shared probe intensity per set (ePIE's step reads only the maximum: no copy kernel).
    object_step_writes_den = True
    # (c_den, c_max) when object_step (probe_step) is num / (c_den·den + c_max·max): a GPU
    # then adds it to the object (probe) in the same kernel (Core.update_object, update).
    object_preconditioner: tuple[float, float] | None = None
    probe_preconditioner: tuple[float, float] | None = None
    batch_graphs = True  # random batches only (Algorithm.run_batch): sparse sets vary

    def object_step(self, num: Any, den: Any, den_max: float) -> Any:  # pragma: no cover
        """The object increment from Σconj(P)χ, Σ|P|² and its maximum (may overwrite
        ``num``/``den``; in sparse mode ``den`` is the shared probe intensity — read only).
        ``den_max`` is a :meth:`ArrayBackend.scalar`: a float, or a 0-d array on a GPU."""
        raise NotImplementedError

    def probe_step(self, num: Any, den: Any, den_max: float) -> Any:  # pragma: no cover
        raise NotImplementedError

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

    def chunk_update(self, sw: Sweep, sums: PartSums, c: Chunk, pd: Any, oj: Any, big: Any,
                     chi: Any) -> None:
        if sw.update_object and self.sparse:
            core = self.core
            den = self._pint.copy() if self.object_step_writes_den else self._pint
            num = self.object_step(core.object_num(pd, chi, c), den, self._pmax)
            num += oj
            core.set_object_patches(c, num)
        super().chunk_update(sw, sums, c, pd, oj, big, chi)

    def update(self, sw: Sweep, sums: list[PartSums]) -> None:
        core = self.core
        if sw.accs is not None:
            core.update_object(sw.accs, sw.bbox, lambda num, den, dmax, _sl: self.object_step(
                num, den, dmax), preconditioner=self.object_preconditioner)
        if sw.update_probe:
            pnum, pden = self.probe_sums(sums)
            delta = core.probe_from_terms(pnum)
            dmax = core.backend.scalar(pden.max())
            kernels = core.backend.kernels
            if kernels is not None and self.probe_preconditioner is not None:
                # a GPU: the step added to the probe in the same kernel
                kernels.preconditioned_step(delta, pden, dmax, *self.probe_preconditioner,
                                            into=core.probe)
            else:
                core.probe += self.probe_step(delta, pden, dmax)
            core.probe_changed()
