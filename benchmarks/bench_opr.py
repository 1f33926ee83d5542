"""The variable probe's cost: seconds per iteration with and without ``opr_modes``.

The same simulated fly scan (a beam drifting 0.5 px along acquisition order) is reconstructed
by one algorithm with one probe and with each K of ``--opr-modes``, iterations alternated
between the runs so that the VM's drifting speed hits all alike. The variable probe adds an
FFT pair per position (each position's probe step shifted back), the per-position probes and
a power-iteration step per iteration. One JSON line per K: the median seconds per iteration
of each and their ratio.

    .venv/bin/python benchmarks/bench_opr.py [--algorithm rpie] [--opr-modes 3,5]
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
from alternated import iteration_seconds

from beamflow.ptycho import PtychoData, ReconParams, Reconstructor, array_backend, initial_state
from beamflow.simulate import detector_frames, make_ground_truth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithm", default="rpie")
    ap.add_argument("--opr-modes", default="3,5")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--positions", type=int, default=400)
    ap.add_argument("--size", type=int, default=64)
    args = ap.parse_args()
    gt = make_ground_truth(positions=args.positions, probe_size=args.size, seed=0,
                           probe_drift_px=0.5)
    frames = detector_frames(gt, 0, gt.n_positions, np.random.default_rng(1)).astype(np.float32)
    backend = array_backend("cpu")
    ks = [0] + [int(k) for k in args.opr_modes.split(",")]
    recs = {}
    for k in ks:
        data = PtychoData(intensities=frames.copy(), positions_px=gt.positions_px,
                          object_shape=gt.object.shape, mask=gt.mask)
        params = ReconParams(algorithm=args.algorithm, iterations=10**6, opr_modes=k)
        recs[k] = Reconstructor(data, initial_state(data, params, probe=gt.probe), backend)
    times = iteration_seconds(recs, args.iterations, backend)
    base = statistics.median(times[0][1:])
    for k in ks[1:]:
        s = statistics.median(times[k][1:])
        print(json.dumps({"benchmark": "opr", "algorithm": args.algorithm, "opr_modes": k,
                          "positions": args.positions, "frame": args.size, "fft": backend.fft,
                          "one_probe_s": round(base, 5), "opr_s": round(s, 5),
                          "opr_over_one_probe": round(s / base, 3)}))


if __name__ == "__main__":
    main()
