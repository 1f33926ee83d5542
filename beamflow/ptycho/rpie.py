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

from typing import Any

from .pie import PIEFamily

__all__ = ["RPIE"]


class RPIE(PIEFamily):
    name = "rpie"

    @property
    def object_preconditioner(self) -> tuple[float, float]:
        a = self.params.alpha_value
        return 1.0 - a, a

    def object_step(self, num: Any, den: Any, den_max: float) -> Any:
        return self.object_step_rule(num, den, den_max, *self.object_preconditioner)

    def object_step_rule(self, num: Any, den: Any, den_max: float, c_den: float,
                         c_max: float) -> Any:
        kernels = self.core.backend.kernels
        if kernels is not None:  # a GPU: the same step in one kernel
            return kernels.preconditioned_step(num, den, den_max, c_den, c_max)
        den *= c_den
        den += c_max * den_max
        # num/den for complex/real is a complex division in numpy: a real reciprocal and a
        # multiply are 2x faster.
        self.core.xp.reciprocal(den, out=den)
        num *= den
        return num

    @property
    def probe_preconditioner(self) -> tuple[float, float]:
        b = self.params.beta_value
        return 1.0 - b, b

    def probe_step(self, num: Any, den: Any, den_max: float) -> Any:
        return self.object_step_rule(num, den, den_max, *self.probe_preconditioner)
