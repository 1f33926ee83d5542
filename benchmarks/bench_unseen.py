"""Scans the engine was not tuned on: complex NRMSE before and after the item-6 defaults.

Issue 34, item 6: on scans no test had seen, mPIE in the near field and the variable probe
(OPR) fell short of what the project's own simulations showed. This runs the same scans with
the old and the new defaults side by side, in one process, so the two columns differ by the
defaults alone:

* ``before``: mPIE's ``probe_momentum`` 0.5; the variable probe learning from the first
  iteration (``opr.LEARNING_DELAY = 0``);
* ``after``: the defaults (``probe_momentum`` 0.9, ``LEARNING_DELAY`` 20).

Scans: the independent simulators of ``tests/kits/sim_kit.py`` (cone beams from a KB pair or a
zone plate with aberrations, cells / nano-particles / a porous material, rings and jittered
rasters; fly scans along a snake whose beam drifts in position, focus and flux) and, so
that nothing regresses at home, the project's own simulator (``beamflow.simulate``). Every
run starts from the probe guessed from the data (the job's default without a probe file or
optics) unless ``probe`` says ``truth``. One JSON line per scan and setting; one thread.

    .venv/bin/python benchmarks/bench_unseen.py [--only near|opr|near-modes] [--quick]

``--only near-modes``: the near-field scans with mPIE (the near field's default algorithm)
and one probe mode against two, 200 iterations each, and the second mode's share of the
power (``minor_power``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kits"))

import sim_kit  # noqa: E402

from beamflow.ptycho import (  # noqa: E402
    PtychoData,
    ReconParams,
    ReconState,
    Reconstructor,
    initial_state,
)
from beamflow.ptycho.algorithms import opr as opr_module  # noqa: E402
from beamflow.ptycho.arrays import array_backend  # noqa: E402
from beamflow.simulate import (  # noqa: E402
    detector_frames,
    make_ground_truth,
    make_near_field_ground_truth,
)

BEFORE = {"probe_momentum": 0.5, "delay": 0}
AFTER = {"probe_momentum": None, "delay": opr_module.LEARNING_DELAY}


def project_scan(near: bool, n: int, m: int, seed: int, photons: float,
                 drift: float = 0.0) -> sim_kit.Scan:
    """The project's own simulator as a :class:`sim_kit.Scan` (its mask and noise seed 5,
    as tests/ptycho/algorithms/test_mpie.py and tests/ptycho/algorithms/test_opr.py draw them)."""
    if near:
        gt = make_near_field_ground_truth(positions=n, probe_size=m, photons=photons, seed=seed)
    else:
        gt = make_ground_truth(positions=n, probe_size=m, photons=photons, seed=seed,
                               probe_drift_px=drift)
    frames = detector_frames(gt, 0, gt.n_positions, np.random.default_rng(5))
    scan = sim_kit.Scan(frames.astype(np.float32), gt.positions_px, gt.object, gt.probe,
                        gt.propagation)
    scan.mask = gt.mask
    return scan


def reconstruct(scan: sim_kit.Scan, iterations: int, setting: dict[str, Any],
                probe: np.ndarray | None, **kw: Any) -> float:
    """The object's NRMSE after :func:`run`."""
    return round(scan.nrmse(run(scan, iterations, setting, probe, **kw).object), 4)


def run(scan: sim_kit.Scan, iterations: int, setting: dict[str, Any],
        probe: np.ndarray | None, **kw: Any) -> ReconState:
    """The final state of a reconstruction of ``scan`` with ``setting``'s defaults, one
    thread."""
    data = PtychoData(intensities=scan.frames.copy(), positions_px=scan.positions_px,
                      object_shape=scan.object.shape, mask=getattr(scan, "mask", None))
    if setting["probe_momentum"] is not None and kw.get("algorithm") == "mpie":
        kw["probe_momentum"] = setting["probe_momentum"]
    params = ReconParams(iterations=iterations, propagation=scan.propagation, **kw)
    opr_module.LEARNING_DELAY = setting["delay"]
    try:
        state = initial_state(data, params, probe=probe)
        with Reconstructor(data, state, array_backend("cpu", threads=1)) as rec:
            out = rec.run()
    finally:
        opr_module.LEARNING_DELAY = AFTER["delay"]
    return out


def near_cases(quick: bool) -> list[tuple[str, Callable[[], sim_kit.Scan]]]:
    cases: list[tuple[str, Callable[[], sim_kit.Scan]]] = [
        ("project near field 100x64 seed 1", lambda: project_scan(True, 100, 64, 1, 1e7)),
        ("project near field 200x64 1e6 seed 0", lambda: project_scan(True, 200, 64, 0, 1e6)),
        ("project near field 49x32 seed 1 (test_mpie)", lambda: project_scan(True, 49, 32, 1, 1e7)),
    ]
    seeds = range(10, 12) if quick else range(10, 16)
    for seed in seeds:
        cases.append((f"kb cells rings 100x64 figure 1.5 seed {seed}", lambda seed=seed:
                      sim_kit.cone_beam_scan(100, 64, optics="kb", sample="cells",
                                             pattern="rings", figure_rad=1.5, seed=seed,
                                             size=2)))
        cases.append((f"zone-plate particles raster 100x64 figure 1.5 seed {seed}",
                      lambda seed=seed: sim_kit.cone_beam_scan(
                          100, 64, optics="zone-plate", sample="particles", pattern="raster",
                          figure_rad=1.5, seed=seed, size=2)))
    for seed in range(3):
        cases.append((f"kb cells rings 49x32 figure 1.5 seed {seed}", lambda seed=seed:
                      sim_kit.cone_beam_scan(49, 32, optics="kb", sample="cells",
                                             pattern="rings", figure_rad=1.5, seed=seed)))
        cases.append((f"zone-plate particles raster 49x32 figure 1.5 seed {seed}",
                      lambda seed=seed: sim_kit.cone_beam_scan(
                          49, 32, optics="zone-plate", sample="particles", pattern="raster",
                          figure_rad=1.5, seed=seed)))
    return cases


def opr_cases(quick: bool) -> list[tuple[str, Callable[[], sim_kit.Scan], int, str]]:
    """(name, scan, iterations, probe: data or truth)."""
    cases: list[tuple[str, Callable[[], sim_kit.Scan], int, str]] = [
        ("project fly scan 64x32 d=0.3 seed 2 (test_opr)",
         lambda: project_scan(False, 64, 32, 2, 1e6, 0.3), 300, "truth"),
        ("project fly scan 100x64 d=0.5 seed 2", lambda: project_scan(False, 100, 64, 2, 1e6, 0.5),
         150, "truth"),
    ]
    fly = [("pinhole cells 100x64 moving d=1 seed 0",
            dict(n=100, m=64, optics="pinhole", sample="cells", drift=1.0), "data"),
           ("pinhole particles 100x64 moving d=0.7 seed 3",
            dict(n=100, m=64, optics="pinhole", sample="particles", drift=0.7, seed=3), "data")]
    for sample in ("cells", "particles"):
        for seed in range(2) if quick else range(3):
            fly.append((f"pinhole {sample} 64x32 moving d=1 seed {seed}",
                        dict(n=64, m=32, optics="pinhole", sample=sample, drift=1.0, seed=seed),
                        "data"))
            fly.append((f"pinhole {sample} 64x32 focus+flux d=2 seed {seed}",
                        dict(n=64, m=32, optics="pinhole", sample=sample, drift=2.0, seed=seed,
                             moves=False), "data"))
    fly.append(("kb particles 64x32 focus+flux d=2 seed 1",
                dict(n=64, m=32, optics="kb", sample="particles", drift=2.0, seed=1,
                     moves=False), "truth"))
    cases += [(name, _fly(name, **kw), 150, probe) for name, kw, probe in fly]
    return cases


#: each independent fly scan's stable twin (filled by opr_cases)
TWINS: dict[str, Callable[[], sim_kit.Scan]] = {}


def _fly(name: str, **kw: Any) -> Callable[[], sim_kit.Scan]:
    """A fly scan and, under its name in :data:`TWINS`, its stable twin (drift 0)."""
    TWINS[name] = lambda: sim_kit.fly_scan(**{**kw, "drift": 0.0})
    return lambda: sim_kit.fly_scan(**kw)


def reconstruct_modes(scan: sim_kit.Scan, iterations: int, modes: int) -> tuple[float, float]:
    """mPIE with ``modes`` probe modes from the probe guessed from the data: (NRMSE, the
    share of the power beyond the first mode)."""
    out = run(scan, iterations, AFTER, None, algorithm="mpie", probe_modes=modes)
    power = np.sum(np.abs(out.probe) ** 2, axis=(-2, -1))
    return round(scan.nrmse(out.object), 4), round(float(1 - power[0] / power.sum()), 3)


def emit(row: dict[str, Any]) -> None:
    print(json.dumps({"benchmark": "unseen", **row}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("near", "opr", "near-modes"))
    ap.add_argument("--quick", action="store_true", help="fewer seeds")
    args = ap.parse_args()
    if args.only in (None, "near"):
        for name, make in near_cases(args.quick):
            scan = make()
            for algorithm, its in (("mpie", 200), ("rpie", 200)):
                t0 = time.perf_counter()
                before = reconstruct(scan, its, BEFORE, None, algorithm=algorithm)
                after = before if algorithm == "rpie" else reconstruct(
                    scan, its, AFTER, None, algorithm=algorithm)
                emit({"scan": name, "algorithm": algorithm, "iterations": its, "probe": "data",
                      "before": before, "after": after,
                      "seconds": round(time.perf_counter() - t0, 1)})
    if args.only == "near-modes":
        for name, make in near_cases(args.quick):
            scan = make()
            one, _ = reconstruct_modes(scan, 200, 1)
            two, minor = reconstruct_modes(scan, 200, 2)
            emit({"scan": name, "algorithm": "mpie", "iterations": 200, "probe": "data",
                  "one_mode": one, "two_modes": two, "minor_power": minor})
    if args.only in (None, "opr"):
        for name, make, its, probe_from in opr_cases(args.quick):
            scan = make()
            probe = scan.probe if probe_from == "truth" else None
            if name in TWINS:
                twin = TWINS[name]()
                emit({"scan": name, "stable_twin": reconstruct(
                    twin, its, AFTER, twin.probe if probe_from == "truth" else None,
                    algorithm="rpie"), "iterations": its, "probe": probe_from})
            for k in (0, 2, 3, 5):
                before = reconstruct(scan, its, BEFORE, probe, algorithm="rpie", opr_modes=k)
                after = before if k == 0 else reconstruct(scan, its, AFTER, probe,
                                                          algorithm="rpie", opr_modes=k)
                emit({"scan": name, "algorithm": "rpie", "opr_modes": k, "iterations": its,
                      "probe": probe_from, "before": before, "after": after})


if __name__ == "__main__":
    main()
