"""Mixed-state probe modes (Thibault & Menzel, Nature 494, 68 (2013)).

K mutually incoherent probe modes share one modulus constraint (their intensities add). The
modes are only defined up to a unitary mixing, so they are kept orthogonal and ordered by
power: the SVD of the (K, M·M) mode stack, A = U S Vᴴ, gives new modes S Vᴴ, which leaves
the probe's coherence function Σ_k P_k(r)* P_k(r') — everything the data can see — unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["orthogonalize_modes", "make_modes"]


def orthogonalize_modes(probe: Any, xp: Any = np, return_transform: bool = False) -> Any:
    """(K, M, M) modes → orthogonal modes ordered by decreasing power (same dtype).

    With ``return_transform`` also returns the (K, K) matrix T with new = T @ old (over the
    mode axis), so per-mode quantities such as exit waves can follow the same mixing.
    """
    k, m1, m2 = probe.shape
    if k == 1:
        return (probe, xp.ones((1, 1), xp.complex128)) if return_transform else probe
    a = probe.reshape(k, m1 * m2).astype(xp.complex128)
    u, s, vh = xp.linalg.svd(a, full_matrices=False)
    modes = s[:, None] * vh  # = Uᴴ A
    # Fix each mode's global phase (the SVD leaves it arbitrary) so results are reproducible:
    # make the largest-magnitude pixel real and positive.
    peak = modes[xp.arange(k), xp.argmax(xp.abs(modes), axis=1)]
    phase = peak / xp.maximum(xp.abs(peak), 1e-300)
    modes = (modes / phase[:, None]).reshape(k, m1, m2).astype(probe.dtype)
    if return_transform:
        return modes, u.conj().T / phase[:, None]
    return modes


def make_modes(first: np.ndarray, k: int, rng: np.random.Generator,
               power_fraction: float = 0.05) -> np.ndarray:
    """K modes from a first guess: mode k>0 is the first mode times a low-order
    Hermite-like polynomial (plus a little random phase), holding ``power_fraction`` of the
    first mode's power each; the stack is then orthogonalised. Host numpy."""
    p0 = np.asarray(first, np.complex128)
    m = p0.shape[-1]
    out = [p0]
    y, x = np.mgrid[0:m, 0:m].astype(np.float64)
    w = np.abs(p0) ** 2
    tot = max(w.sum(), 1e-300)
    cy, cx = (w * y).sum() / tot, (w * x).sum() / tot
    sy = np.sqrt(max((w * (y - cy) ** 2).sum() / tot, 1.0))
    sx = np.sqrt(max((w * (x - cx) ** 2).sum() / tot, 1.0))
    yy, xx = (y - cy) / sy, (x - cx) / sx
    orders = [(a, b) for n in range(1, 2 * k + 2) for a in range(n + 1) for b in [n - a]]
    p0pow = float((np.abs(p0) ** 2).sum())
    for i in range(1, k):
        a, b = orders[i - 1]
        poly = (yy**a) * (xx**b) * np.exp(1j * 0.1 * rng.standard_normal((m, m)))
        mode = p0 * poly
        mode *= np.sqrt(power_fraction * p0pow / max(float((np.abs(mode) ** 2).sum()), 1e-300))
        out.append(mode)
    modes = orthogonalize_modes(np.stack(out).astype(np.complex128))
    return modes.astype(np.complex64)
