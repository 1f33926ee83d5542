"""The algorithms' one sweep (beamflow/ptycho/algorithms/base.py): the loss sequences it gives are
pinned, and a new algorithm needs only its update.

The pinned losses were measured before the sweep was shared (each algorithm with its own
chunk loop, commit 35c1035) and the shared sweep reproduces them bit for bit on the same
machine (LSQ-ML's since its batch step and Poisson LSQ-ML's noise floor, deliberate changes
of the algorithm); the tolerance only absorbs other CPUs' rounding (SIMD widths in numpy's sums).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from engine_kit import data_of, simulate

from beamflow.ptycho import ReconParams, Reconstructor, array_backend, initial_state
from beamflow.ptycho.algorithms.base import Algorithm, PartSums, Sweep

PINNED = {
    "rpie": ({"algorithm": "rpie"},
             [0.07034182, 0.06428828, 0.05603878, 0.05318467, 0.04813891]),
    "rpie-modes-poscorr": ({"algorithm": "rpie", "probe_modes": 2, "position_correction": True,
                            "position_correction_start": 1},
                           [0.07034913, 0.06422262, 0.05604713, 0.05248551, 0.04665701]),
    "epie": ({"algorithm": "epie"},
             [0.09697662, 0.09495217, 0.08744265, 0.08738104, 0.08053802]),
    "dm": ({"algorithm": "dm"},
           [0.06535429, 0.04853289, 0.04347631, 0.05590514, 0.0657261]),
    # LSQ-ML's since its batch step is the least-squares step of the summed systems (it
    # was the mean of the positions' own steps, which diverged on larger scans; tests/
    # test_lsqml.py); before it, with the Poisson floor (lsqml.POISSON_FLOOR):
    # [0.0698592, 0.06204974, 0.05483821, 0.05157571, 0.04841669] (Poisson) and
    # [0.06796204, 0.05916092, 0.05183855, 0.04797743, 0.04224499] (modes-poscorr).
    "lsqml-poisson": ({"algorithm": "lsqml", "noise_model": "poisson"},
                      [0.06980064, 0.06210534, 0.05504707, 0.05191912, 0.04883558]),
    "lsqml-modes-poscorr": ({"algorithm": "lsqml", "probe_modes": 2,
                             "position_correction": True, "position_correction_start": 1},
                            [0.0679447, 0.05949411, 0.05205157, 0.04850523, 0.04332392]),
}


@pytest.fixture(scope="module")
def sim():
    return simulate(n=60)


def _run(sim, iterations: int, **kw: Any):
    data = data_of(sim)
    params = ReconParams(iterations=iterations, **kw)
    backend = array_backend("cpu", threads=1, fft="pocketfft")
    with Reconstructor(data, initial_state(data, params), backend) as rec:
        return rec, rec.run()


@pytest.mark.parametrize("name", list(PINNED))
def test_loss_sequence_is_pinned(sim, name):
    kw, losses = PINNED[name]
    _, out = _run(sim, len(losses), **kw)
    np.testing.assert_allclose(out.loss_history, losses, rtol=2e-5)


class _Counting(Algorithm):
    """A plain gradient step on the object from the sweep's default sums: the least an
    algorithm must write (its update), with the sweep's chunks counted."""

    name = "counting"

    def __init__(self, core: Any, params: Any):
        super().__init__(core, params)
        self.chunks = 0

    def chunk_update(self, sw: Sweep, sums: PartSums, c: Any, *args: Any) -> None:
        self.chunks += 1
        super().chunk_update(sw, sums, c, *args)

    def update(self, sw: Sweep, sums: list[PartSums]) -> None:
        def step(num: Any, den: Any, dmax: float, _sl: Any) -> Any:
            return num * (0.5 / dmax)

        self.objects.update(sw.accs[0], 0, sw.bbox, step)


def test_an_algorithm_that_writes_only_its_update_reconstructs(sim):
    rec, _ = _run(sim, 0, algorithm="rpie", batch_size=16, batch_selection="random",
                  probe_update_start=100)
    algo = _Counting(rec.core, rec.params)
    rec.algorithm = algo
    losses = [rec.iterate() for _ in range(6)]
    # 60 positions in batches of 16: 4 batches, each one chunk on one thread.
    assert algo.chunks == 6 * 4
    assert losses[-1] < 0.95 * losses[0]  # and the object converges
