"""From the sample's exit wave to the detector and back: the far field (Fraunhofer) or the
near field (Fresnel), on a chunk of positions (see :mod:`.propagation` for the physics).

Far field: Ψ = F[ψ_j] (FFT order; the data are held ifftshifted). Near field:
Ψ = F⁻¹[G_j · F[ψ_j]] with G_j = H · conj(r_j): the angular-spectrum propagator H, and the
sub-pixel ramp r_j undone. The probe is fixed relative to the detector; the engine's window
moves the probe by δ_j against the object instead, so the detector sees its wave shifted back
by δ_j (a shift the far field's intensity cannot see, a hologram can).

``to_sample`` is the adjoint of ``to_detector``'s propagation. On a GPU the inverse FFT's
1/M² is folded into a product made anyway (:attr:`.core.Core.ifft_scale`): the Fourier
constraint's (``scaled``: the correction carries it already) or the propagator's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .propagation import Propagation

__all__ = ["Detector", "FarField", "NearField", "detector_for"]


class Detector:
    """The propagation from the last exit wave to the detector plane, and its adjoint."""

    def __init__(self, core: Any):
        self.core = core

    def to_detector(self, psi: Any, c: Any) -> Any:  # pragma: no cover - an interface
        """The wave at the detector (b, K, M, M) of exit waves ψ (may be overwritten)."""
        raise NotImplementedError

    def to_sample(self, big_chi: Any, c: Any, scaled: bool = False) -> Any:  # pragma: no cover
        """A detector-plane correction back to the exit-wave plane (may be overwritten);
        ``scaled``: it carries the inverse FFT's 1/M² already."""
        raise NotImplementedError


class FarField(Detector):
    """Ψ = F[ψ]; back: F⁻¹."""

    def to_detector(self, psi: Any, c: Any) -> Any:
        return self.core.backend.fft2(psi, workers=self.core.fft_workers)

    def to_sample(self, big_chi: Any, c: Any, scaled: bool = False) -> Any:
        return self.core.backend.ifft2(big_chi, workers=self.core.fft_workers, scale=not scaled)


class NearField(Detector):
    """Ψ = F⁻¹[H·conj(r_j)·F[ψ]]; back: F⁻¹[conj(H)·r_j·F[·]]."""

    def __init__(self, core: Any, transfer: np.ndarray):
        super().__init__(core)
        be = core.backend
        self.transfer = be.to_device(transfer)
        scale = core.ifft_scale
        self._transfer_scaled = (None if scale is None
                                 else be.to_device((transfer * scale).astype(transfer.dtype)))

    def to_detector(self, psi: Any, c: Any) -> Any:
        core, be = self.core, self.core.backend
        big = be.fft2(psi, workers=core.fft_workers)
        fold = core.ifft_scale is not None
        big *= self._propagator(c, scaled=fold)[:, None]
        return be.ifft2(big, workers=core.fft_workers, scale=not fold)

    def to_sample(self, big_chi: Any, c: Any, scaled: bool = False) -> Any:
        core, be = self.core, self.core.backend
        spec = be.fft2(big_chi, workers=core.fft_workers)
        fold = not scaled and core.ifft_scale is not None  # the 1/M² goes into G_j here
        spec *= self._propagator(c, adjoint=True, scaled=fold)[:, None]
        return be.ifft2(spec, workers=core.fft_workers, scale=not (scaled or fold))

    def _propagator(self, c: Any, adjoint: bool = False, scaled: bool = False) -> Any:
        """G_j = H·conj(r_j) per position (b, M, M), or its conjugate; (1, M, M) H without
        sub-pixel shifts. ``scaled``: times the inverse FFT's 1/M² (a GPU's fold)."""
        xp = self.core.xp
        transfer = self._transfer_scaled if scaled else self.transfer
        if c.ramp is None:
            g = transfer[None]
            return xp.conj(g) if adjoint else g
        h = xp.conj(transfer) if adjoint else transfer
        return self.core.backend.ramp_product(c.ramp, h[None, None], conj=not adjoint)[:, 0]


def detector_for(core: Any, propagation: Propagation) -> Detector:
    """The detector propagation of ``propagation``'s model."""
    h = propagation.transfer(core.M)
    return FarField(core) if h is None else NearField(core, h)
