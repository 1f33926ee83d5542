"""A simulated detector scan for the job's tests, with its true probe beside it
(``probe.npy``): a job started from the truth's probe converges in few iterations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from beamflow.ground_truth import read_ground_truth
from beamflow.simulate import simulate_scan


def scan_with_its_probe(root: Path, name: str, **simulate: Any) -> Path:
    """:func:`beamflow.simulate.simulate_scan` into ``root``, and ``root/probe.npy``, the
    scan's true probe; returns the master file."""
    master = simulate_scan(root, name, **simulate)
    np.save(root / "probe.npy", read_ground_truth(master.parent / "ground_truth.h5").probe)
    return master
