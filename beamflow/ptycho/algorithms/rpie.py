"""rPIE — regularised PIE.

A. M. Maiden, D. Johnson & P. Li, "Further improvements to the ptychographical iterative
engine", Optica 4, 736–745 (2017):

    O ← O + conj(P) χ / ((1−α)|P|² + α·max|P|²),   P ← P + conj(O) χ / ((1−β)|O|² + β·max|O|²)

With mini-batches the numerators and denominators are accumulated over the batch into
object-sized (probe-sized) arrays and the update uses the accumulated denominator and its
maximum, which keeps overlapping ("compact"/"random") batches stable; ``batch_selection=
"sparse"`` gives the per-position rule exactly. Default: random batches of 32 positions.
"""

from __future__ import annotations

from .pie import PIEFamily

__all__ = ["RPIE"]


class RPIE(PIEFamily):
    name = "rpie"

    @property
    def object_preconditioner(self) -> tuple[float, float]:
        # Each of S layers takes its share 1/S of a correction (PIEFamily).
        a, share = self.params.alpha_value, self.model.layers
        return share * (1.0 - a), share * a

    @property
    def probe_preconditioner(self) -> tuple[float, float]:
        b = self.params.beta_value
        return 1.0 - b, b
