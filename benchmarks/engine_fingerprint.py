"""Fingerprints of the engine's results on a fixed set of set-ups: one JSON line each, with
sha256 digests of the loss history, object, probe and positions after a few iterations.

A refactor of ``beamflow.ptycho`` that must not change behaviour is checked by running this
before and after on the same machine and comparing the lines (``--compare OLD.jsonl``):
every digest must match bit for bit. The set-ups cover each algorithm, probe modes, the
variable probe, position correction, sub-pixel and integer positions, far and near field,
layers,
one and two threads, and the GPU code path on the tests' counting stand-in for CuPy (whose
fused kernels are their reference array code).

    python benchmarks/engine_fingerprint.py > before.jsonl
    ... refactor ...
    python benchmarks/engine_fingerprint.py --compare before.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kits"))

from beamflow.ptycho import PtychoData, ReconParams, Reconstructor, initial_state  # noqa: E402
from beamflow.ptycho.arrays import array_backend  # noqa: E402
from beamflow.ptycho.forward.propagation import Propagation  # noqa: E402

NEAR = {"model": "near-field", "wavelength_m": 1.0e-10, "distance_m": 0.02,
        "pixel_size_m": 5.0e-8}

LAYERS = {"model": "far-field", "wavelength_m": 1.409e-10, "pixel_size_m": 5.87e-8}

SETUPS: dict[str, dict[str, Any]] = {
    "rpie": {"algorithm": "rpie"},
    "rpie-compact": {"algorithm": "rpie", "batch_selection": "compact", "batch_size": 8},
    "rpie-sparse": {"algorithm": "rpie", "batch_selection": "sparse"},
    "rpie-modes-poscorr": {"algorithm": "rpie", "probe_modes": 2, "position_correction": True,
                           "position_correction_start": 1},
    "rpie-opr": {"algorithm": "rpie", "opr_modes": 2},
    "rpie-near": {"algorithm": "rpie", "propagation": NEAR},
    "mpie": {"algorithm": "mpie", "momentum_every": 2},
    "mpie-near-modes": {"algorithm": "mpie", "probe_modes": 2, "propagation": NEAR},
    "epie": {"algorithm": "epie"},
    "epie-random": {"algorithm": "epie", "batch_selection": "random"},
    "dm": {"algorithm": "dm"},
    "dm-modes": {"algorithm": "dm", "probe_modes": 2},
    "lsqml": {"algorithm": "lsqml"},
    "lsqml-poisson": {"algorithm": "lsqml", "noise_model": "poisson"},
    "lsqml-modes-poscorr": {"algorithm": "lsqml", "probe_modes": 2,
                            "position_correction": True, "position_correction_start": 1},
    "lsqml-opr-near": {"algorithm": "lsqml", "opr_modes": 2, "propagation": NEAR},
    "lsqml-probe-late": {"algorithm": "lsqml", "probe_update_start": 2},
    # thick samples: two layers on the same (thin) scan
    "rpie-layers": {"algorithm": "rpie", "slices": 2, "slice_spacing_m": 4e-4,
                    "propagation": LAYERS},
    "epie-layers-reg": {"algorithm": "epie", "slices": 3, "slice_spacing_m": 2e-4,
                        "layer_regularization": 0.05, "propagation": LAYERS},
    "lsqml-layers-modes-poscorr": {"algorithm": "lsqml", "slices": 2, "slice_spacing_m": 4e-4,
                                   "probe_modes": 2, "position_correction": True,
                                   "position_correction_start": 1, "propagation": LAYERS},
}


def _digest(a: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def _scan(integer: bool) -> dict[str, Any]:
    from engine_kit import simulate  # noqa: PLC0415 - the tests' simulator

    sim = simulate(n=40)
    if integer:
        sim["positions"] = np.rint(sim["positions"])
    return sim


@contextlib.contextmanager
def _backend(kind: str):
    if kind == "gpu-standin":
        from counting_cupy import installed  # noqa: PLC0415

        with installed() as be:
            yield be
        return
    threads = 2 if kind == "cpu2" else 1
    yield array_backend("cpu", threads=threads, fft="pocketfft")


def run(name: str, kw: dict[str, Any], kind: str, integer: bool, iterations: int) -> dict:
    sim = _scan(integer)
    data = PtychoData(sim["intensities"], sim["positions"], sim["shape"])
    kw = dict(kw)
    if "propagation" in kw:
        kw["propagation"] = Propagation(**kw["propagation"])
    params = ReconParams(iterations=iterations, **kw)
    with _backend(kind) as be, Reconstructor(data, initial_state(data, params), be) as rec:
        try:
            out = rec.run()
        except FloatingPointError as exc:
            return {"setup": name, "backend": kind, "integer": integer, "error": str(exc)}
    extras = {k: _digest(v) for k, v in sorted(out.extras.items())}
    return {"setup": name, "backend": kind, "integer": integer,
            "loss": _digest(np.asarray(out.loss_history, np.float64)),
            "last_loss": out.loss_history[-1], "object": _digest(out.object),
            "probe": _digest(out.probe), "positions": _digest(out.positions_px),
            "extras": extras}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--compare", type=Path, help="a file of earlier lines to compare with")
    ap.add_argument("--only", nargs="*", help="set-up names")
    args = ap.parse_args()
    old = {}
    if args.compare:
        for line in args.compare.read_text().splitlines():
            r = json.loads(line)
            old[(r["setup"], r["backend"], r["integer"])] = r
    bad = 0
    for name, kw in SETUPS.items():
        if args.only and name not in args.only:
            continue
        for kind in ("cpu1", "cpu2", "gpu-standin"):
            for integer in (False, True):
                r = run(name, kw, kind, integer, args.iterations)
                if args.compare:
                    o = old.get((name, kind, integer))
                    same = o is not None and all(o.get(k) == r.get(k) for k in (
                        "loss", "object", "probe", "positions", "extras", "error"))
                    r["same"] = same
                    bad += not same
                print(json.dumps(r), flush=True)
    if args.compare:
        print(json.dumps({"compared": True, "different": bad}))
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
