"""The thin-sample forward model and its adjoint: one object layer.

For position j with window corner n_j and sub-pixel offset δ_j (see /work/shared/
PTYCHO_MATH.md):

    P_k,j = F⁻¹[ F[P_k] · exp(−2πi k·δ_j) ]      (probe mode k shifted by δ_j, exactly)
    ψ_jk  = P_k,j · O[n_j : n_j + M]               Ψ_jk = 𝒟[ψ_jk]      I_j = Σ_k |Ψ_jk|²

with 𝒟 the far- or near-field propagation (:mod:`.detector`). The adjoint of the sub-pixel
shift is applied wherever an update flows back to the probe:
``Σ_j S_δj^H g_j = F⁻¹[ Σ_j conj(exp(−2πi k·δ_j)) · F[g_j] ]`` — one FFT per position and a
single inverse FFT per batch. With the two exit-wave FFTs and the shifted probe this makes
four FFTs per position and mode per PIE iteration (the FFT floor counts two).

Denominators of PIE and LSQ-ML (preconditioners such as ``Σ_j |P_j|²``) use the unshifted
probe intensity: they only scale steps, so this costs no exactness. DM's object refit is a
least-squares projection and uses the shifted probes' intensities (``exact``).

A model's methods take a chunk (:class:`~..core.Chunk`) and document which arguments they
overwrite: the hot path works in place to keep memory traffic down. Everything that runs
differently on a GPU is an operation of the array backend (:mod:`..arrays.ops`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..arrays.ops import conj_mode_sum
from ..positions import object_gradient, position_steps
from .detector import Detector

__all__ = ["ThinModel", "Waves"]


@dataclass
class Waves:
    """A chunk's waves through the sample: per layer s the wave ψ_s incident on it (ψ_1 the
    shifted probe, (b or 1, K, M, M)) and the object's patches O_s (b, M, M); and the wave
    at the detector Ψ (b, K, M, M)."""

    incident: list[Any]
    patches: list[Any]
    detector: Any


class ThinModel:
    """ψ = P_j·O_j, Ψ = 𝒟[ψ]: the exit wave of one object layer."""

    def __init__(self, core: Any, detector: Detector):
        self.core = core
        self.detector = detector

    @property
    def layers(self) -> int:
        return 1

    # -- forward ----------------------------------------------------------------------------
    def shifted_probe(self, c: Any) -> Any:
        """(b, K, M, M) probe modes shifted by each position's sub-pixel offset (owned).

        Without sub-pixel offsets: the (1, K, M, M) probe itself (a view — do not modify).
        """
        core = self.core
        if c.ramp is None:
            return core.probe[None]
        pd = core.backend.ramp_product(c.ramp, core.probe_hat()[None])
        return core.backend.ifft2(pd, workers=core.fft_workers, scale=False)

    def forward(self, pd: Any, c: Any) -> Waves:
        """The chunk's waves for the probes ``pd`` (:meth:`shifted_probe`) at its positions."""
        oj, psi = self.core.backend.exit_wave(self.core.obj[0], pd, c)
        return Waves([pd], [oj], self.detector.to_detector(psi, c))

    def to_sample(self, big_chi: Any, c: Any, scaled: bool = False) -> Any:
        """A detector-plane correction back to the last layer's exit plane
        (:meth:`.detector.Detector.to_sample`)."""
        return self.detector.to_sample(big_chi, c, scaled)

    def backward(self, w: Waves, chi: Any, c: Any) -> list[Any]:
        """The exit-wave correction of each layer, from the last layer's ``chi``."""
        return [chi]

    # -- the Fourier constraint -------------------------------------------------------------
    def amplitude_residual(self, big: Any, c: Any) -> tuple[Any, Any, Any]:
        """``(amp, d, loss)``: the model amplitude √(Σ_k |Ψ_k|²) (b, M, M), the masked
        residual d = (√I − amp)·mask and its Σ d² (the numerator of PTYCHO_MATH's loss)."""
        core = self.core
        return core.backend.amplitude_residual(big, core.frames.amplitudes(c.idx, c.didx),
                                               core.mask, core.full_mask)

    def modulus_projection(self, big: Any, c: Any, scale: Any = None) -> Any:
        """Turn Ψ in place into the far-field correction Ψ' − Ψ (times ``scale`` when one is
        given); return the loss (:meth:`.arrays.ops.ArrayOps.modulus`)."""
        core = self.core
        return core.backend.modulus(big, core.frames, c, core.mask, core.full_mask, core.eps,
                                    scale)

    # -- update terms -----------------------------------------------------------------------
    def object_num(self, w: Waves, chis: list[Any], c: Any, layer: int) -> Any:
        """Σ_k conj(ψ_k)·χ_k of a layer (b, M, M); conjugates an owned incident wave in
        place (then it is spent)."""
        return conj_mode_sum(w.incident[layer], chis[layer], self.core.xp,
                             overwrite=self._owned(w, c, layer))

    def accumulate_object(self, acc: Any, w: Waves, chis: list[Any], c: Any, layer: int,
                          keep: bool = False, exact: bool = False) -> None:
        """Scatter-add a layer's numerators Σ_k conj(ψ_k)·χ_k and illumination into the
        accumulator pair ``acc`` (:meth:`.arrays.ops.ArrayOps.object_terms`); ``keep`` leaves the
        incident wave as it is (else an owned one may be spent).

        The illumination Σ_k|ψ_k|² is each position's own with ``exact`` (DM needs the exact
        least-squares denominator), else the unshifted probe intensity: for PIE and LSQ-ML
        it only preconditions the step, and a constant patch saves computing |P_j|² per
        position."""
        owned = self._owned(w, c, layer)
        inten = None if exact and owned else self.core.probe_intensity()
        self.core.backend.object_terms(acc, w.incident[layer], chis[layer], c, inten,
                                       overwrite=owned and not keep)

    def _owned(self, w: Waves, c: Any, layer: int) -> bool:
        """Whether the layer's incident wave is the chunk's own array (not the shared
        probe)."""
        return c.ramp is not None

    def probe_terms(self, w: Waves, chis: list[Any], c: Any, out_num: Any, out_den: Any,
                    keep: bool = False) -> tuple[Any, Any]:
        """Accumulate Σ_j S_j^H[conj(O_j)·χ_jk] and Σ_j |O_j|² of the first layer; return
        (num, den).

        ``out_num``/``out_den`` are the sums so far, added to in place; None for the first
        chunk, whose terms become new sums (no zeroed arrays to add them to: two kernels
        fewer per batch, and the same values — 0 + x is x). The numerator is accumulated
        conjugated, and with sub-pixel shifts in the Fourier domain (:meth:`probe_from_terms`
        undoes both): conj(conj(O_j)·χ_j) = O_j·conj(χ_j), and conj(F[g]) is the unscaled
        inverse FFT of conj(g) — no conjugate after the FFT. Overwrites the first layer's
        χ unless ``keep``; the patches are left as they are."""
        core, be = self.core, self.core.backend
        oj = w.patches[0]
        out_den = be.intensity_sum(oj, out_den)
        g = be.conj_product(oj, chis[0], overwrite=not keep)
        if c.ramp is not None:
            # Σ_j conj(r_j)·F[conj(O_j)χ_j] = conj(Σ_j r_j·F⁻¹[O_j·conj(χ_j)]·M²).
            g = be.ifft2(g, workers=core.fft_workers, scale=False)
        return be.position_sum(c.ramp, g, out_num), out_den

    def probe_from_terms(self, num: Any) -> Any:
        """Finish the probe adjoint from the summed terms (a new array)."""
        core = self.core
        if not core.subpixel:
            return core.xp.conj(num)
        return core.backend.conj_ifft2(num)

    # -- sparse object steps (each window on its own) ---------------------------------------
    def object_patches(self, c: Any, layer: int) -> Any:
        return self.core.backend.patches(self.core.obj[layer], c)

    def set_object_patches(self, c: Any, layer: int, patches: Any) -> None:
        """Write (b, M, M) windows into an object layer; the windows must not overlap."""
        be = self.core.backend
        be.scatter_set(self.core.obj[layer], patches, c.dy, c.dx, index=be.window_index(c))

    # -- position correction ----------------------------------------------------------------
    def position_gradients(self) -> Any:
        """What :meth:`position_steps` needs of the whole object, made once per batch: each
        layer's gradient."""
        core = self.core
        return [object_gradient(core.obj[s], core.xp) for s in range(self.layers)]

    def position_steps(self, w: Waves, chis: list[Any], grads: Any, c: Any) -> Any:
        """(b, 2) Gauss–Newton position steps of the chunk (:func:`..positions.position_steps`):
        each layer's exit-wave derivative ψ_s·∇O_s against its correction."""
        be = self.core.backend
        return position_steps([(w.incident[s], be.patches(gy, c), be.patches(gx, c), chis[s])
                               for s, (gy, gx) in enumerate(grads)], self.core.xp)
