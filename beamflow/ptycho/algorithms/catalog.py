"""The algorithms the engine knows: each one's name, meaning of ``alpha``/``beta``, defaults,
limits and what it models — the one place a new algorithm is written into (beside its
class, named by ``implementation``).

The settings (:class:`~beamflow.ptycho.state.ReconParams`) check and resolve against this
table, the engine builds the algorithm it names, and the command line, the configuration and
the flows' schemas take their choices from it. It imports nothing of the engine, so the
settings can use it before any algorithm is loaded.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["AUTO", "CATALOG", "AlgorithmChoice", "AlgorithmTraits", "algorithm_class",
           "algorithm_for"]


@dataclass(frozen=True)
class AlgorithmTraits:
    """What is known of an algorithm before it runs."""

    #: ``module.Class`` in :mod:`beamflow.ptycho.algorithms`
    implementation: str
    #: what ``alpha`` and ``beta`` mean, their defaults and their ranges (lo < value <= hi)
    alpha_means: str
    beta_means: str
    alpha: float
    beta: float
    alpha_range: tuple[float, float]
    beta_range: tuple[float, float]
    #: the default batch (None: every position, or one-at-a-time sets), its selection, and
    #: the batch a large far-field scan takes (ReconParams.batch_size_for)
    batch_size: int | None
    batch_selection: str
    large_scan_batch: int | None = None
    #: a global update from all positions at once (batch_selection "all" only)
    global_update: bool = False
    #: models a variable probe (opr_modes), the Poisson likelihood, several object layers
    variable_probe: bool = False
    poisson: bool = False
    layers: bool = True
    #: takes mPIE's momentum settings
    momentum: bool = False
    #: re-centres the far-field probe by default (its probe and object drift together)
    centres_probe: bool = False


CATALOG: dict[str, AlgorithmTraits] = {
    # Maiden & Rodenburg 2009: steps of the object and the probe.
    "epie": AlgorithmTraits(
        "epie.EPIE", "object step", "probe step", 1.0, 1.0, (0.0, 2.0), (0.0, 2.0),
        batch_size=None, batch_selection="sparse"),
    # Maiden, Johnson & Li 2017: regularisation weights of the max-denominator.
    "rpie": AlgorithmTraits(
        "rpie.RPIE", "object regularisation", "probe regularisation", 0.1, 0.1, (0.0, 1.0),
        (0.0, 1.0), batch_size=32, batch_selection="random", variable_probe=True),
    # rPIE's weights, plus momentum (Maiden et al. 2017, section 4); the near field needs the
    # object's low frequencies, which rPIE moves slowly, so alpha is rPIE's.
    "mpie": AlgorithmTraits(
        "mpie.MPIE", "object regularisation", "probe regularisation", 0.1, 0.1, (0.0, 1.0),
        (0.0, 1.0), batch_size=32, batch_selection="random", variable_probe=True,
        momentum=True),
    # Thibault et al. 2008/2009: Tikhonov weights, as fractions of the largest denominator.
    "dm": AlgorithmTraits(
        "dm.DM", "object Tikhonov weight (× max)", "probe Tikhonov weight (× max)", 1e-2, 1e-2,
        (0.0, 1.0), (0.0, 1.0), batch_size=None, batch_selection="all", global_update=True,
        layers=False, centres_probe=True),
    # Odstrčil et al. 2018: the preconditioner's regularisation (a fraction of the largest
    # illumination) and the damping of the least-squares step lengths.
    "lsqml": AlgorithmTraits(
        "lsqml.LSQML", "preconditioner regularisation", "step-length damping", 0.1, 0.9,
        (0.0, 1.0), (0.0, 1.0), batch_size=32, batch_selection="random", large_scan_batch=256,
        variable_probe=True, poisson=True),
}

#: What a user chooses, for settings' types (pydantic, typer's choices, JSON schemas): an
#: algorithm's name, or ``auto``, the best known for the scan's regime.
AUTO = "auto"
AlgorithmChoice = Literal[(AUTO, *CATALOG)]  # type: ignore[valid-type]


def algorithm_for(choice: str, near_field: bool) -> str:
    """The algorithm ``choice`` names; ``auto``: rPIE in the far field, mPIE in the near
    field. A hologram encodes the object's low spatial frequencies weakly and rPIE moves
    them slowly: after 200 iterations on 21 near-field scans (this project's simulator and
    KB and zone-plate cone beams of an independent one, benchmarks/bench_unseen.py) rPIE's
    NRMSE was 0.99–7.4× mPIE's (median 2.0), and on the measured PETRA III scan mPIE ends
    at the lower misfit; in the far field rPIE converges as well and is the engine's
    fastest (docs/reconstruction.md)."""
    if choice != AUTO:
        return choice
    return "mpie" if near_field else "rpie"


def algorithm_class(name: str) -> Any:
    """The class that implements algorithm ``name`` (imported on first use)."""
    module, _, cls = CATALOG[name].implementation.rpartition(".")
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)
