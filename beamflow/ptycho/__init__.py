"""beamflow.ptycho — the ptychographic reconstruction engine (arrays in, arrays out).

Public API::

    from beamflow.ptycho import (ReconParams, PtychoData, ReconState, Reconstructor,
                                 initial_state, get_backend, Backend)

Algorithms: ePIE, rPIE, DM, LSQ-ML (Gaussian/Poisson), all with mini-batches, mixed-state
probe modes, exact sub-pixel positions, position correction and update schedules, on numpy
(scipy.fft threads) or cupy. It imports nothing else of beamflow.
"""

from .backend import Backend, BackendError, get_backend
from .engine import ALGORITHMS, Reconstructor, StateView, initial_state, probe_from_data
from .state import PtychoData, ReconParams, ReconState

__all__ = [
    "ALGORITHMS",
    "Backend",
    "BackendError",
    "PtychoData",
    "ReconParams",
    "ReconState",
    "Reconstructor",
    "StateView",
    "get_backend",
    "initial_state",
    "probe_from_data",
]
