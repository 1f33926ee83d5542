"""Position correction, gradient form (PTYCHO_MATH.md, "Position correction").

For position j the exit wave changes with the position r_j as ∂ψ_j/∂r = P_j · ∇O_j (probe
fixed, object window moving). The Gauss–Newton step that best explains the exit-wave
correction χ_j along each axis is

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


def position_steps(pd: Any, gyj: Any, gxj: Any, chi: Any, xp: Any) -> Any:
    """(b, 2) Gauss–Newton position steps (y, x) for a chunk (device array).

    pd: (b or 1, K, M, M) shifted probe; gyj/gxj: (b, M, M) object-gradient patches;
    chi: (b, K, M, M) real-space exit-wave corrections.
    """
    out = []
    for g in (gyj, gxj):
        a = pd * g[:, None]
        num = (a.real * chi.real + a.imag * chi.imag).sum(axis=(1, 2, 3))
        den = (xp.square(a.real) + xp.square(a.imag)).sum(axis=(1, 2, 3))
        out.append(num / (den + xp.float32(1e-30) + 1e-6 * den.max()))
    return xp.stack(out, axis=1)


def clip_steps(steps: np.ndarray, limit: float) -> np.ndarray:
    """Clip each (y, x) step to ±limit pixels (a non-finite step becomes 0)."""
    steps = np.where(np.isfinite(steps), steps, 0.0)
    return np.clip(steps, -limit, limit)


def remove_drift(pos: np.ndarray, nominal: np.ndarray) -> np.ndarray:
    """Positions with the mean correction (pos − nominal) removed."""
    return pos - (pos - nominal).mean(axis=0, keepdims=True)
