"""Near field against far field: seconds per iteration on the same frames, side by side.

The same simulated near-field scan (frames, positions, probe guess) is reconstructed with the
far-field and the near-field model, iterations alternated between the two so that the VM's
drifting speed hits both alike. The near field costs two more FFTs per position and mode (the
propagation there and back) and one Fourier multiplier per chunk. One JSON line per
algorithm: the median seconds per iteration of each and their ratio.

    .venv/bin/python benchmarks/bench_near_field.py [--algorithms rpie,lsqml] [--iterations 20]
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
from alternated import iteration_seconds

from beamflow.ptycho import PtychoData, ReconParams, Reconstructor, array_backend, initial_state
from beamflow.ptycho.forward.propagation import Propagation
from beamflow.simulate import detector_frames, make_near_field_ground_truth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithms", default="rpie,lsqml")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--positions", type=int, default=400)
    ap.add_argument("--size", type=int, default=64)
    args = ap.parse_args()
    gt = make_near_field_ground_truth(positions=args.positions, probe_size=args.size, seed=0)
    frames = detector_frames(gt, 0, gt.n_positions, np.random.default_rng(1)).astype(np.float32)
    backend = array_backend("cpu")
    for algorithm in args.algorithms.split(","):
        recs = {}
        for name, prop in (("far", Propagation()), ("near", gt.propagation)):
            data = PtychoData(intensities=frames.copy(), positions_px=gt.positions_px,
                              object_shape=gt.object.shape, mask=gt.mask)
            params = ReconParams(algorithm=algorithm, iterations=10**6, propagation=prop)
            recs[name] = Reconstructor(data, initial_state(data, params), backend)
        times = iteration_seconds(recs, args.iterations, backend)
        far, near = (statistics.median(times[k][1:]) for k in ("far", "near"))
        print(json.dumps({"benchmark": "near_field", "algorithm": algorithm,
                          "positions": args.positions, "frame": args.size, "fft": backend.fft,
                          "far_field_s": round(far, 5), "near_field_s": round(near, 5),
                          "near_over_far": round(near / far, 3)}))


if __name__ == "__main__":
    main()
