"""Variable probe: orthogonal probe relaxation (OPR).

M. Odstrčil, P. Baksh, S. A. Boden et al., "Ptychographic coherent diffractive imaging with
orthogonal probe relaxation", Opt. Express 24, 8360 (2016); M. Odstrčil, A. Menzel &
M. Guizar-Sicairos, Opt. Express 26, 3108 (2018), section 3.3.

In a fly scan the beam drifts and the stage vibrates, so each position sees a slightly
different probe. The first (dominant) probe mode at position j is modelled as

    P_j = Σ_k w_jk U_k          (k = 0..K−1, real weights, w_j0 ≈ 1)

with U_0 the engine's own first probe mode (the mean probe, updated by the algorithm as
before) and U_1..U_{K−1} eigen-probes, orthonormal in the real inner product Re⟨a, b⟩ (so
real weights can follow any re-mixing of them). The other incoherent modes stay shared.

Per batch, after the algorithm's own update (from :data:`LEARNING_DELAY` iterations after
the probe starts updating; until then every position has the mean probe):

1. each position's probe step d_j = S_j^H[conj(O_j) χ_j] / ((1−γ)|O_j|² + γ·max|O_j|²)
   (the rPIE probe step of that position alone, γ = 0.1); the batch mean of d_j is what the
   algorithm already put into U_0, so the rest, r_j = d_j − mean(d), is the variation;
2. weights by least squares per position: Δw_j = G⁻¹ Re(Uᴴ r_j) with G = Re(Uᴴ U)
   (K×K); what the basis cannot express, r_j − Σ_k Δw_jk U_k, is accumulated as
   Y += Σ_j w_j (r_j − Σ_k Δw_jk U_k).

Once per iteration:

3. eigen-probes by one block power iteration of the per-position probes' variations
   V_j = Σ_k w_jk U_k + r_j over the whole scan: U ← orth(Σ_j w_j V_j) = orth(WᵀW·U + Y),
   orthonormalised in the real inner product (Cholesky of the K−1 × K−1 Gram matrix); the
   weights follow the new basis (w_j ← Re⟨U_new, Σ_k w_jk U_k⟩);
4. the gauge: the weights' means move into U_0 (mean w_j0 = 1, mean w_jk = 0 for k ≥ 1),
   so U_0 stays the mean probe;
5. optionally (``opr_weight_smoothing`` s, default 0.5) the weights are pulled towards the
   mean of their neighbours in acquisition order: w ← (1−s)·w + s·smooth(w) — a fly scan's
   beam varies slowly in time, and unsmoothed weights also absorb object errors.

The object's preconditioners see the mean illumination over positions
(:meth:`VariableProbe.mean_intensity`, through ``Core.set_illumination``), not |U_0|²: when
the eigen-probes carry much of the power, |U_0|² alone makes the object steps overshoot.

The eigen-probes start as the mean probe times low-order polynomials (the shapes a small
drift or defocus change adds), the weights at (1, 0, …, 0). Both are algorithm memory
(``opr_eigen_probes``, ``opr_weights`` in :meth:`VariableProbe.device_extras`): checkpoints carry
them, and the product file stores them as Ptychodus does (probe (K, modes, M, M), weights
(N, K); see :func:`ptychodus_layout`).

Everything lives on the device, the weights too (float64): the small K×K systems are
solved there (``xp.linalg``), so an iteration never waits for the device on their account
— no host read per batch, none for the once-per-iteration steps either.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import Chunk, Core
from ..modes import make_modes

__all__ = ["VariableProbe", "ptychodus_layout"]

# The probe step's regularisation (the rPIE form with β = γ): a position's update is only
# an estimate of its probe's change, trusted where the object transmits.
STEP_REGULARISATION = 0.1

# Iterations after the probe starts updating before the weights and eigen-probes learn.
# Early on a position's probe step is mostly the object's and the mean probe's errors, not
# the beam's variation; weights that learn them keep them (eigen-probes grown from them by
# the power iteration): from a probe guessed from the data, opr_modes=3 ended at NRMSE
# 0.060 against 0.038 for one probe on an unseen fly scan, 0.036 when OPR waited 20
# iterations (tests/ptycho/test_unseen_scans.py, docs/reconstruction.md).
LEARNING_DELAY = 20


class VariableProbe:
    """Eigen-probes and per-position weights (float64) of the first mode, on the device."""

    def __init__(self, core: Core, n_modes: int, smoothing: float, seed: int,
                 probe_start: int = 0):
        self.core = core
        self.K = int(n_modes)
        self.smoothing = float(smoothing)
        #: the first iteration whose probe steps update the weights and eigen-probes
        self.start = int(probe_start) + LEARNING_DELAY
        weights = np.zeros((core.N, self.K), np.float64)
        weights[:, 0] = 1.0
        self.weights = core.backend.to_device(weights)
        xp = core.xp
        m = core.M
        if self.K > 1:
            u0 = core.backend.to_host(core.probe[0])
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x0F12]))
            extra = make_modes(np.asarray(u0), self.K, rng)[1:]
            self.eigen = core.backend.to_device(_orthonormal(extra, np)[0])
        else:
            self.eigen = xp.zeros((0, m, m), np.complex64)
        self._eigen_hat: Any = None
        self._y: Any = None  # Σ_j w_j r_j over the iteration's batches (K−1, M·M)

    # -- state ------------------------------------------------------------------------------
    def device_extras(self) -> dict[str, Any]:
        """The eigen-probes and weights on the device (see ``Algorithm.device_extras``)."""
        return {"opr_eigen_probes": self.eigen, "opr_weights": self.weights}

    def load_extras(self, extras: dict[str, np.ndarray]) -> None:
        """Restore eigen-probes and weights. A state with another number of OPR modes gives
        its first ones (fresh eigen-probes with zero weights make up the rest); positions
        appended since start at the mean probe."""
        u, w = extras.get("opr_eigen_probes"), extras.get("opr_weights")
        if u is None or w is None:
            return
        w = np.asarray(w, np.float64)
        u = np.asarray(u, np.complex64)
        if w.ndim != 2 or u.ndim != 3 or tuple(u.shape[1:]) != (self.core.M,) * 2 or (
                w.shape[1] != u.shape[0] + 1):
            raise ValueError(
                f"variable probe: the state's eigen-probes {u.shape} and weights {w.shape} do "
                f"not fit {self.core.M}x{self.core.M} frames")
        n, k = min(len(w), self.core.N), min(w.shape[1], self.K)
        be = self.core.backend
        weights = np.array(be.to_host(self.weights), copy=True)
        weights[:n, :k] = w[:n, :k]
        if k == self.K:  # as saved (fewer modes: the first, already orthonormal)
            self.eigen = be.to_device(np.ascontiguousarray(u[: self.K - 1]))
        elif self.K > 1:
            eigen = np.concatenate([u[: k - 1], np.asarray(be.to_host(self.eigen))[k - 1:]])
            q, tri = _orthonormal(eigen, np)
            weights[:, 1:] = weights[:, 1:] @ tri.T
            self.eigen = be.to_device(q)
        self.weights = be.to_device(weights)
        self._eigen_hat = None

    def shifted(self, s: tuple[float, float]) -> None:
        if self.K > 1:
            self.eigen = self.core.fourier_shift(self.eigen, s)
            self._eigen_hat = None

    # -- the forward model ------------------------------------------------------------------
    def prepare(self) -> None:
        """Eigen-probe spectra and the mean illumination, before the threads read them."""
        if self.K > 1 and self.core.subpixel and self._eigen_hat is None:
            self._eigen_hat = self.core.spectrum(self.eigen)
        self.core.set_illumination(self.mean_intensity())

    def mean_intensity(self) -> Any:
        """mean_j Σ_k |P_jk|² (M, M): the first mode's Σ_kl C_kl Re(U_k conj(U_l)) with
        C = mean_j w_jk w_jl, plus the shared modes' intensities."""
        core, xp = self.core, self.core.xp
        p = core.probe
        inten = (xp.square(p[1:].real) + xp.square(p[1:].imag)).sum(axis=0)
        basis = xp.concatenate([p[:1], self.eigen])
        c = (self.weights.T @ self.weights / len(self.weights)).astype(np.float32)
        # Σ_kl C_kl Re(U_k conj(U_l)): on the float views, Σ_k (C U)_k · U_k.
        bv = basis.reshape(self.K, -1).view(np.float32)
        mixed = xp.einsum("kl,lp->kp", c, bv)  # not BLAS (see _rdot_matrix)
        mixed *= bv
        inten += mixed.sum(axis=0).reshape(core.M, core.M, 2).sum(axis=-1)
        return inten

    def _weights(self, c: Chunk) -> Any:
        return self.weights[c.didx].astype(np.float32)

    def shifted_probe(self, c: Chunk) -> Any:
        """(b, K_incoherent, M, M) probes of the chunk's positions (owned): the first mode
        Σ_k w_jk U_k, shifted by each position's sub-pixel offset like the others."""
        core, xp = self.core, self.core.xp
        w = self._weights(c)
        b = len(c.idx)
        if c.ramp is None:
            pd = xp.broadcast_to(core.probe[None], (b,) + core.probe.shape).copy()
            pd[:, 0] = self._combine(w, core.probe[0], self.eigen)
            return pd
        ph = core.probe_hat()
        spec = xp.broadcast_to(ph[None], (b,) + ph.shape).copy()
        spec[:, 0] = self._combine(w, ph[0], self._eigen_hat)
        spec = core.backend.ramp_product(c.ramp, spec, out=spec)
        return core.backend.ifft2(spec, workers=core.fft_workers, scale=False)

    def _combine(self, w: Any, u0: Any, eigen: Any) -> Any:
        """Σ_k w_jk U_k for a chunk → (b, M, M)."""
        out = w[:, 0, None, None] * u0[None]
        if self.K > 1:
            out += _mix(w[:, 1:], eigen, self.core.xp)
        return out

    # -- the update -------------------------------------------------------------------------
    def learns(self, it: int) -> bool:
        """Whether iteration ``it`` (0-based) updates the weights and eigen-probes (until then
        every position has the mean probe)."""
        return it >= self.start

    def chunk_steps(self, c: Chunk, oj: Any, chi: Any) -> tuple[Any, Any]:
        """Each position's own probe step d_j for the first mode (before the algorithm's
        terms overwrite ``oj``/``chi``): (device indices, (b, M, M))."""
        core, xp, be = self.core, self.core.xp, self.core.backend
        g = xp.conj(oj) * chi[:, 0]
        if c.ramp is not None:  # S_j^H: shift back by −δ_j
            g = be.fft2(g, workers=core.fft_workers)
            be.ramp_product(c.ramp, g[:, None], out=g[:, None], conj=True)
            g = be.ifft2(g, workers=core.fft_workers)
        den = xp.square(oj.real) + xp.square(oj.imag)
        dmax = den.max(axis=(1, 2), keepdims=True)
        den *= 1.0 - STEP_REGULARISATION
        den += STEP_REGULARISATION * dmax + 1e-30
        xp.reciprocal(den, out=den)  # complex / real is a complex division: multiply instead
        g *= den
        return c.didx, g

    def update(self, steps: list[tuple[Any, Any]]) -> None:
        """Weights and eigen-probes from the batch's per-position steps (device indices and
        steps, from :meth:`chunk_steps`)."""
        if not steps:
            return
        core, xp = self.core, self.core.xp
        idx = xp.concatenate([s[0] for s in steps])
        r = xp.concatenate([s[1] for s in steps]).reshape(len(idx), -1)
        r -= r.mean(axis=0, keepdims=True)
        basis = xp.concatenate([core.probe[:1], self.eigen]).reshape(self.K, -1)
        # Real least squares per position, G Δw_j = Re(Uᴴ r_j), solved on the device in
        # float64 (one K×K system, the batch's positions its right-hand sides).
        gram = _rdot_matrix(basis, basis, xp).astype(np.float64)
        proj = _rdot_matrix(r, basis, xp).astype(np.float64)  # (B, K)
        gram += (1e-9 * xp.trace(gram)) * xp.eye(self.K)
        dw = xp.linalg.solve(gram, proj.T).T
        self.weights[idx] += dw
        if self.K == 1:
            return
        # What the basis cannot express feeds the eigen-probes' power iteration.
        r -= _mix(dw, basis, xp)
        y = _mix(self.weights[idx, 1:].T.copy(), r, xp)
        self._y = y if self._y is None else self._y + y

    def end_iteration(self) -> None:
        """The eigen-probes' power-iteration step over the whole scan, then the weights'
        smoothing."""
        if self._y is not None:
            self._refresh_eigen_probes()
        self._recentre()
        s = self.smoothing
        if s > 0 and self.core.N > 2:
            w = self.weights
            nb = self.core.xp.empty_like(w)
            nb[1:-1] = 0.5 * (w[:-2] + w[2:])
            nb[0], nb[-1] = w[1], w[-2]
            self.weights = (1.0 - s) * w + s * nb

    def _recentre(self) -> None:
        """Keep U_0 the mean probe: mean_j w_j0 = 1 and mean_j w_jk = 0 (k ≥ 1), moving the
        means into U_0. Without this gauge the eigen-probes can take over the mean probe's
        power, and the object step, preconditioned by |U_0|², overshoots."""
        core, xp = self.core, self.core.xp
        mean = self.weights.mean(axis=0)
        # A degenerate mean (≤ 0, never seen) leaves everything as it is: decided on the
        # device, so the host does not wait for the weights.
        ok = mean[0] > 0
        scale = xp.where(ok, mean[0], 1.0)
        shift = xp.where(ok, mean[1:], 0.0)
        u0 = core.probe[0] * scale.astype(np.float32)
        self.weights[:, 0] /= scale
        if self.K > 1:
            # exact for w_j0 = 1; the rest is second order in the variation
            u0 += _mix(shift[None], self.eigen, xp)[0]
            self.weights[:, 1:] -= shift
        core.probe[0] = u0
        core.probe_changed()

    def _refresh_eigen_probes(self) -> None:
        """U ← orth(Σ_j w_j V_j) with V_j = Σ_k w_jk U_k + r_j each position's target
        variation: one block power iteration of the per-position probes; the weights follow
        the new basis (w_j ← Re⟨U_new, Σ_k w_jk U_k⟩)."""
        xp = self.core.xp
        old = self.eigen
        w = self.weights[:, 1:]
        y = _mix(w.T @ w, old, xp) + self._y.reshape(old.shape)
        self._y = None
        new, _ = _orthonormal(y, xp)
        t = _rdot_matrix(new.reshape(len(new), -1), old.reshape(len(old), -1), xp)
        self.weights[:, 1:] = w @ t.T.astype(np.float64)
        self.eigen = new
        self._eigen_hat = None


# Complex arrays are handled through their float32 views (re, im interleaved): real weights
# mix real and imaginary parts alike, and Re⟨a, b⟩ is the dot product of the views. einsum,
# not BLAS: BLAS threads would compete with the engine's own.


def _rdot_matrix(a: Any, b: Any, xp: Any) -> Any:
    """Re(a bᴴ) for row stacks a (n, p), b (k, p) complex64 → (n, k) float32."""
    av = xp.ascontiguousarray(a).view(np.float32)
    bv = xp.ascontiguousarray(b).view(np.float32)
    return xp.einsum("np,kp->nk", av, bv)


def _mix(w: Any, z: Any, xp: Any) -> Any:
    """Σ_k w[b, k]·z[k] for real weights (B, K) and complex64 z (K, ...) → (B, ...)."""
    zv = xp.ascontiguousarray(z).view(np.float32)
    flat = xp.einsum("bk,kp->bp", w.astype(np.float32), zv.reshape(zv.shape[0], -1))
    # CuPy's einsum may return a transposed (non-contiguous) product: view needs rows.
    flat = xp.ascontiguousarray(flat)
    return flat.view(np.complex64).reshape((w.shape[0],) + z.shape[1:])


def _orthonormal(eigen: Any, xp: Any) -> tuple[Any, Any]:
    """Orthonormalise (k, M, M) complex modes in the real inner product Re⟨a, b⟩, in
    float64 where they live (``xp``).

    Returns (Q, T) with Σ_k w_k eigen_k = Σ_k (T w)_k Q_k: the modes' real Gram matrix
    G = L Lᵀ (Cholesky, positive diagonal: reproducible), Q = L⁻¹·eigen, T = Lᵀ."""
    k = eigen.shape[0]
    a = xp.ascontiguousarray(eigen.reshape(k, -1).astype(np.complex128)).view(np.float64)
    gram = xp.einsum("ip,jp->ij", a, a)
    gram += (1e-12 * xp.trace(gram)) * xp.eye(k)  # a vanishing mode stays finite
    low = xp.linalg.cholesky(gram)
    q = xp.ascontiguousarray(xp.linalg.solve(low, a))  # CuPy's solve answers in F order
    return q.view(np.complex128).reshape(eigen.shape).astype(np.complex64), low.T


def ptychodus_probes(u0: np.ndarray, eigen: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Σ_k w_jk U_k for every position (N, M, M) complex64."""
    out = weights[:, 0, None, None] * u0[None]
    if eigen.shape[0]:
        out = out + np.tensordot(weights[:, 1:], eigen, axes=1)
    return out.astype(np.complex64)


def ptychodus_layout(probe: np.ndarray, eigen: np.ndarray) -> np.ndarray:
    """The probe as Ptychodus stores a variable one: (K, modes, M, M), [0] the incoherent
    modes, [k, 0] the eigen-probes U_k (k ≥ 1), the rest zero; position j's first mode is
    Σ_k weights[j, k]·array[k, 0]."""
    k = 1 + eigen.shape[0]
    out = np.zeros((k,) + probe.shape, np.complex64)
    out[0] = probe
    out[1:, 0] = eigen
    return out
