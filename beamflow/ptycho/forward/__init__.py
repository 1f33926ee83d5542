"""The forward models: how a probe and the sample make the waves the detector records, and
the adjoints the algorithms' updates flow back through.

* :mod:`.propagation` — the geometry (far or near field) and the angular-spectrum transfer
  function;
* :mod:`.detector` — from the last exit wave to the detector and back (far field: an FFT;
  near field: Fresnel);
* :mod:`.thin` — a thin sample: the exit wave is the probe times one object layer;
* :mod:`.multislice` — a thick sample: S layers joined by angular-spectrum propagation
  (:mod:`.slices`: the layers' spacings and the propagator between them).

An algorithm sweeps a batch through a model (:meth:`~.thin.ThinModel.forward`, the Fourier
constraint, :meth:`~.thin.ThinModel.backward`) and accumulates the update terms it gives, so a
new physics is a new model, not edits in every algorithm.
"""

from __future__ import annotations

from typing import Any

from .detector import detector_for
from .multislice import MultisliceModel
from .propagation import Propagation
from .slices import slice_transfer
from .thin import ThinModel, Waves

__all__ = ["MultisliceModel", "Propagation", "ThinModel", "Waves", "make_model"]


def make_model(core: Any, params: Any) -> ThinModel:
    """The forward model of the reconstruction on ``core`` with parameters ``params``
    (:class:`~..state.ReconParams`): thin, or ``params.slices`` layers.

    Between layers only the band limit that keeps the periodic window from wrapping applies
    (Matsushima & Shimobaba): the engine's product of wave and layer is the thin model's, and
    a tighter cut would take measured high frequencies from the first layers."""
    detector = detector_for(core, params.propagation)
    if params.slices == 1:
        return ThinModel(core, detector)
    g = params.propagation
    missing = [n for n in ("wavelength_m", "pixel_size_m") if getattr(g, n) is None]
    if missing:
        raise ValueError(f"slices={params.slices} needs the propagation geometry's "
                         f"{' and '.join(missing)} (the layers are propagated between)")
    transfers = [slice_transfer(core.M, g.wavelength_m, dz, g.pixel_size_m,
                                nyquist_fraction=None) for dz in params.slice_spacings]
    return MultisliceModel(core, detector, transfers)
