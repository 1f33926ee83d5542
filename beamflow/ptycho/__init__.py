"""beamflow.ptycho — the ptychographic reconstruction engine (arrays in, arrays out).

Public API::

    from beamflow.ptycho import (ReconParams, PtychoData, ReconState, Reconstructor,
                                 initial_state, array_backend, ArrayBackend)

Algorithms: ePIE, rPIE, DM, LSQ-ML (Gaussian/Poisson), all with mini-batches, mixed-state
probe modes, exact sub-pixel positions, position correction and update schedules, on numpy
(scipy.fft threads) or cupy. It imports nothing else of beamflow.
"""

from .arrays import ArrayBackend, ArrayBackendError, array_backend
from .engine import ALGORITHMS, Reconstructor, StateView, initial_state, probe_from_data
from .state import PtychoData, ReconParams, ReconState

__all__ = [
    "ALGORITHMS",
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
