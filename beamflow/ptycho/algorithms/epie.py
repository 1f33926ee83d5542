"""ePIE — extended ptychographical iterative engine.

A. M. Maiden & J. M. Rodenburg, "An improved ptychographical phase retrieval algorithm for
diffractive imaging", Ultramicroscopy 109, 1256–1262 (2009):

    O_j ← O_j + α · conj(P) χ_j / max|P|²,     P ← P + β · conj(O_j) χ_j / max|O_j|²

ePIE is sequential (one position at a time). The engine keeps those semantics by default with
``batch_selection="sparse"``: each batch is a random set of windows that do not overlap, so
their object updates commute and are exactly the sequential ones; their probe updates are
summed and normalised by the largest summed ``Σ_j |O_j|²`` (for one position this is ePIE's
rule; for a set it is their average step). With overlapping ("random") batches the object
step uses the accumulated denominator's maximum instead.
"""

from __future__ import annotations

from typing import Any

from .pie import PIEFamily

__all__ = ["EPIE"]


class EPIE(PIEFamily):
    name = "epie"
    object_step_writes_den = False

    def object_step(self, num: Any, den: Any, den_max: Any) -> Any:
        # Each of S layers takes its share 1/S of a correction (PIEFamily).
        num *= (self.params.alpha_value / self.model.layers
                / self.core.backend.at_least(den_max, 1e-30))
        return num

    def add_probe_step(self, num: Any, den: Any, den_max: Any) -> None:
        self.core.probe += num * (self.params.beta_value
                                  / self.core.backend.at_least(den_max, 1e-30))
