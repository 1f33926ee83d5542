"""beamflow.ptycho — the ptychographic reconstruction engine (arrays in, arrays out).

Public API::

    from beamflow.ptycho import (ReconParams, PtychoData, ReconState, Reconstructor,
                                 initial_state, array_backend, ArrayBackend)

Algorithms (:mod:`.algorithms`): ePIE, rPIE, mPIE, DM and LSQ-ML (Gaussian or Poisson), all
with mini-batches, mixed-state probe modes, exact sub-pixel positions, position correction
and update schedules; a variable probe (rPIE, mPIE, LSQ-ML); thin samples or thick ones as
layers (:mod:`.forward`); on numpy (FFTW or pocketfft threads) or CuPy (:mod:`.gpu`); the
verdict, metrics and previews of a result (:mod:`.quality`). Of the rest of beamflow it uses
only :mod:`beamflow.atomic` (the previews' atomic file writes); beyond that numpy, scipy,
pydantic, matplotlib for the previews, and CuPy where a GPU is used.
"""

from .algorithms.catalog import CATALOG
from .arrays import ArrayBackend, ArrayBackendError, array_backend
from .engine import Reconstructor, StateView, initial_state, probe_from_data
from .state import PtychoData, ReconParams, ReconState

__all__ = [
    "CATALOG",
    "ArrayBackend",
    "ArrayBackendError",
    "PtychoData",
    "ReconParams",
    "ReconState",
    "Reconstructor",
    "StateView",
    "array_backend",
    "initial_state",
    "probe_from_data",
]
