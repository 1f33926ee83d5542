"""Reconstructions timed side by side: one iteration of each in turn, so that a shared
machine's drifting speed touches them alike (bench_near_field.py, bench_opr.py)."""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any


def iteration_seconds(recs: dict[Hashable, Any], iterations: int,
                      backend: Any) -> dict[Hashable, list[float]]:
    """Seconds of each of ``recs``'s (Reconstructors) ``iterations`` iterations, taken in
    turn, the device synchronised after each; the reconstructors are closed."""
    times: dict[Hashable, list[float]] = {k: [] for k in recs}
    try:
        for _ in range(iterations):
            for k, rec in recs.items():
                t0 = time.perf_counter()
                rec.iterate()
                backend.synchronize()
                times[k].append(time.perf_counter() - t0)
    finally:
        for rec in recs.values():
            rec.close()
    return times
