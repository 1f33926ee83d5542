"""The multislice forward model: a thick sample as S thin layers (3PIE).

A. M. Maiden, M. J. Humphry & J. M. Rodenburg, "Ptychographic transmission microscopy in
three dimensions using a multi-slice approach", JOSA A 29, 1606 (2012); E. H. R. Tsai et al.,
"X-ray ptychography with extended depth of field", Opt. Express 24, 29089 (2016). At position
j (see /work/shared/PTYCHO_MATH.md, "Multislice"):

    ψ_1 = P_j,   e_s = ψ_s · O_s(r − r_j),   ψ_{s+1} = 𝒫_{Δz_s}[e_s],   Ψ = 𝒟[e_S]

with 𝒫 the band-limited angular-spectrum propagator between layers (:mod:`.slices`) and 𝒟
the far- or near-field propagation to the detector (:mod:`.detector`). Backward, from the
correction χ_S of the last exit wave: each layer's object takes conj(ψ_s)·χ_s (over Σ|ψ_s|²,
each position's own incident intensity), and the correction of the wave incident on it,
Δψ_s = conj(O_s)·χ_s, is propagated back to the layer before, χ_{s−1} = 𝒫_{−Δz}[Δψ_s]
(the adjoint, conj(H)); the probe takes Δψ_1 as it takes a thin sample's. These are the
chain rule's terms, so PIE's steps and LSQ-ML's directions follow for every layer; the
first layer's incident wave is the shifted probe, as for a thin sample.

Cost per position and mode: 2(S − 1) more FFTs forward and as many back; memory: S incident
waves, patches and corrections per position of a chunk.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .detector import Detector
from .thin import ThinModel, Waves

__all__ = ["MultisliceModel", "depth_filter"]


class MultisliceModel(ThinModel):
    """S object layers joined by angular-spectrum propagation."""

    def __init__(self, core: Any, detector: Detector, transfers: list[np.ndarray]):
        super().__init__(core, detector)
        be, scale = core.backend, core.ifft_scale
        # A GPU folds the inverse FFT's 1/M² into the propagator (core.ifft_scale).
        fold = 1.0 if scale is None else scale
        self._forward = [be.to_device((h * fold).astype(np.complex64)) for h in transfers]
        self._back = [be.to_device((np.conj(h) * fold).astype(np.complex64)) for h in transfers]

    @property
    def layers(self) -> int:
        return len(self._forward) + 1

    def _propagate(self, a: Any, gap: int, back: bool = False) -> Any:
        """𝒫_{±Δz} of a (b, K, M, M) stack across gap ``gap`` (overwritten)."""
        core, be = self.core, self.core.backend
        spec = be.fft2(a, workers=core.fft_workers)
        spec *= (self._back if back else self._forward)[gap]
        return be.ifft2(spec, workers=core.fft_workers, scale=core.ifft_scale is None)

    def forward(self, pd: Any, c: Any) -> Waves:
        be, obj = self.core.backend, self.core.obj
        incident, patches = [pd], []
        for s in range(self.layers):
            oj, e = be.exit_wave(obj[s], incident[s], c)
            patches.append(oj)
            if s + 1 < self.layers:
                incident.append(self._propagate(e, s))
        return Waves(incident, patches, self.detector.to_detector(e, c))

    def backward(self, w: Waves, chi: Any, c: Any) -> list[Any]:
        xp = self.core.xp
        chis = [None] * self.layers
        chis[-1] = chi
        for s in range(self.layers - 1, 0, -1):
            d = xp.conj(w.patches[s])[:, None] * chis[s]  # Δψ_s = conj(O_s)·χ_s
            chis[s - 1] = self._propagate(d, s - 1, back=True)
        return chis

    def _owned(self, w: Waves, c: Any, layer: int) -> bool:
        return layer > 0 or c.ramp is not None

    def accumulate_object(self, acc: Any, w: Waves, chis: list[Any], c: Any, layer: int,
                          keep: bool = False, exact: bool = False) -> None:
        # Behind the first layer the incident waves differ from position to position: the
        # illumination is each one's own.
        super().accumulate_object(acc, w, chis, c, layer, keep, exact or layer > 0)

    def incident_intensity(self, w: Waves, layer: int) -> tuple[Any, Any]:
        """Σ_k |ψ_s,k|² of each position (b, M, M) and each one's maximum (b, 1, 1): a
        layer's own illumination, for steps made window by window (sparse PIE)."""
        xp = self.core.xp
        psi = w.incident[layer]
        inten = (xp.square(psi.real) + xp.square(psi.imag)).sum(axis=1)
        return inten, inten.max(axis=(1, 2), keepdims=True)

    def regularize(self, strength: float) -> None:
        """The regulariser along depth (fold_slice's and Pty-Chi's kz filter): the layers'
        amplitude and phase are filtered in the 3-D Fourier transform of the stack by
        :func:`depth_filter`, which keeps the layers' sum (k_z = 0) and damps their
        differences most at low lateral frequencies, where the data cannot tell the layers
        apart (πλΔz f² < 1); the object takes the filtered amplitude and phase. The phase
        is the wrapped angle (the layers of a weak object stay within ±π)."""
        if strength <= 0:
            return
        core, xp = self.core, self.core.xp
        obj = core.obj
        w = core.backend.to_device(depth_filter(self.layers, core.H, core.W, strength))
        amp = xp.abs(obj)
        phase = xp.angle(obj)
        amp_f = self._filter(amp, w)
        phase_f = self._filter(phase, w)
        obj[...] = (amp_f * xp.exp(1j * phase_f)).astype(np.complex64)

    def _filter(self, a: Any, w: Any) -> Any:
        """Re F⁻¹_3D[w · F_3D[a]] of a real (S, H, W) stack: FFTs across each layer and a
        direct transform along the few layers."""
        be, xp, s = self.core.backend, self.core.xp, self.layers
        lat = be.fft2(a.astype(np.complex64))
        k = np.arange(s)
        fwd = np.exp(-2j * np.pi * np.outer(k, k) / s)
        spec = [sum(complex(fwd[q, p]) * lat[p] for p in range(s)) * w[q] for q in range(s)]
        out = [sum(complex(np.conj(fwd[q, p])) * spec[q] for q in range(s)) / s
               for p in range(s)]
        return xp.stack([be.ifft2(o).real for o in out]).astype(np.float32)


def depth_filter(layers: int, h: int, w: int, strength: float) -> np.ndarray:
    """W(k_z, k_r) = 1 − (2/π)·atan((β·|k_z| / |k_r|)²) on the (S, H, W) FFT grid (cycles
    per sample), float32: 1 on the layers' sum (k_z = 0), towards 0 where the depth frequency
    is large against the lateral one. A small floor under |k_r| keeps the lateral DC
    finite."""
    kz = np.abs(np.fft.fftfreq(layers))[:, None, None]
    kr = np.sqrt(np.fft.fftfreq(h)[None, :, None] ** 2 + np.fft.fftfreq(w)[None, None, :] ** 2
                 + 1e-3)
    return (1.0 - (2.0 / np.pi) * np.arctan((strength * kz / kr) ** 2)).astype(np.float32)
