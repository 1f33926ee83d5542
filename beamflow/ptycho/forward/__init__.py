"""The forward models: how a probe and the sample make the waves the detector records, and
the adjoints the algorithms' updates flow back through.

* :mod:`.propagation` — the geometry (far or near field) and the angular-spectrum transfer
  function;
* :mod:`.detector` — from the last exit wave to the detector and back (far field: an FFT;
  near field: Fresnel);
* :mod:`.thin` — a thin sample: the exit wave is the probe times one object layer.

An algorithm sweeps a batch through a model (:meth:`~.thin.ThinModel.forward`, the Fourier
constraint, :meth:`~.thin.ThinModel.backward`) and accumulates the update terms it gives, so a
new physics is a new model, not edits in every algorithm.
"""

from __future__ import annotations

from typing import Any

from .detector import detector_for
from .propagation import Propagation
from .thin import ThinModel, Waves

__all__ = ["Propagation", "ThinModel", "Waves", "make_model"]


def make_model(core: Any, propagation: Propagation) -> ThinModel:
    """The forward model of the reconstruction on ``core``."""
    return ThinModel(core, detector_for(core, propagation))
