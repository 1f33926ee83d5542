"""Position correction, gradient form (PTYCHO_MATH.md, "Position correction").

For position j the exit wave changes with the position r_j as ∂ψ_j/∂r = P_j · ∇O_j (probe
fixed, object window moving); with several layers, each layer's term is summed (its incident
wave times its object's gradient, against the correction in its plane). The Gauss–Newton
step that best explains the exit-wave correction χ_j along each axis is

    δr_j = Re Σ conj(P_j ∇O_j) · χ_j / Σ |P_j ∇O_j|²

(summed over pixels and probe modes), clipped to ``position_step_limit_px`` per update.
(Using −∇P_j·O_j instead gives the same numerator: the two differ by ∇ψ_j, and
Re⟨∇ψ_j, χ_j⟩ = 0 for a modulus projection, whose far-field correction is a real factor.)
The object gradient is the central finite difference. After every iteration the mean
correction is removed so the scan cannot drift as a whole (a pure translation is invisible
in the data); see Odstrčil et al., Opt. Express 26, 3108 (2018), section 4, and
Zhang et al., Opt. Express 21, 13592 (2013) for the cross-correlation alternative.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["object_gradient", "position_steps", "clip_steps", "remove_drift"]


def object_gradient(obj: Any, xp: Any) -> tuple[Any, Any]:
    """Central-difference gradient (∂/∂y, ∂/∂x) of the object in pixels⁻¹ (edges zero)."""
    gy = xp.zeros_like(obj)
    gx = xp.zeros_like(obj)
    gy[1:-1] = obj[2:] - obj[:-2]
    gx[:, 1:-1] = obj[:, 2:] - obj[:, :-2]
    gy *= 0.5
    gx *= 0.5
    return gy, gx


def position_steps(layers: Sequence[tuple[Any, Any, Any, Any]], xp: Any) -> Any:
    """(b, 2) Gauss–Newton position steps (y, x) for a chunk (device array).

    ``layers``: per object layer (ψ, ∂_y O, ∂_x O, χ): the incident wave (b or 1, K, M, M),
    the object-gradient patches (b, M, M) and the exit-wave corrections (b, K, M, M) of that
    layer's plane. A position moves every layer's window alike, so the step sums the layers'
    terms Re Σ conj(ψ_s ∇O_s)·χ_s and |ψ_s ∇O_s|² (for a thin sample, one layer with
    ψ the shifted probe).
    """
    out = []
    for axis in (1, 2):
        num = den = None
        for layer in layers:
            a = layer[0] * layer[axis][:, None]
            chi = layer[3]
            n = (a.real * chi.real + a.imag * chi.imag).sum(axis=(1, 2, 3))
            d = (xp.square(a.real) + xp.square(a.imag)).sum(axis=(1, 2, 3))
            num, den = (n, d) if num is None else (num + n, den + d)
        out.append(num / (den + xp.float32(1e-30) + 1e-6 * den.max()))
    return xp.stack(out, axis=1)


def clip_steps(steps: np.ndarray, limit: float) -> np.ndarray:
    """Clip each (y, x) step to ±limit pixels (a non-finite step becomes 0)."""
    steps = np.where(np.isfinite(steps), steps, 0.0)
    return np.clip(steps, -limit, limit)


def remove_drift(pos: np.ndarray, nominal: np.ndarray) -> np.ndarray:
    """Positions with the mean correction (pos − nominal) removed."""
    return pos - (pos - nominal).mean(axis=0, keepdims=True)
