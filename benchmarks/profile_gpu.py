"""Where one engine iteration spends the card's time, kernel by kernel, under Nsight Compute.

Two modes, run from the repository root on a GPU machine with ``ncu`` on the PATH::

    ncu --profile-from-start off --clock-control none --print-units base \\
        --print-kernel-base function --csv --log-file ncu.csv \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python3 benchmarks/profile_gpu.py --cases 4000x128 --algorithms rpie
    python3 benchmarks/profile_gpu.py --summarize ncu.csv

The first reconstructs each case (from ``bench_gpu.py``'s scan cache, ``--scan-cache``) for
``--warmup`` iterations, then brackets one iteration with the CUDA profiler's start and stop
(``cupy.cuda.profiler``), so ``ncu --profile-from-start off`` records exactly that
iteration's kernels. It prints, per case, the iteration's wall seconds without the profiler
(median of 3) so the kernels' sum can be set beside it: when the sum is far below the wall
time, the host (launches, CuPy's checks) is what limits the iteration, not the card.
``--modes K``, ``--slices S --slice-spacing M`` and ``--thin-frames`` profile
``bench_gpu.py``'s thick cases (its docstring).

With ``--host`` (no ``ncu``) the profiled iteration runs under cProfile instead: one JSON
line per Python function, by its own time, for the ``--top`` first; a function holding the
host long waits for the card (launches return at once) or is the host's own cost.

The second prints one JSON line per kernel name of each profiled iteration (launches, summed
device µs, DRAM bytes read and written, achieved GB/s; the ``--top`` most costly), after a
total line: ``kernel_us`` (the card's busy time), ``dram_gb`` and the achieved GB/s. It
sums every profiled iteration in the file: profile one algorithm and case per ``ncu`` call.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import json
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import CASES, _setup, load_case, log, start  # noqa: E402

from beamflow.ptycho import Reconstructor, array_backend  # noqa: E402
from beamflow.ptycho.forward.slices import slice_spacings  # noqa: E402


def profile(args: argparse.Namespace) -> None:
    backend = array_backend(args.device)
    for name in args.cases:
        n, m = CASES[name]
        case = load_case(args.scan_cache, args.field, n, m, args.seed, args.slices,
                         args.spacings, args.thin_frames)
        for algorithm in args.algorithms:
            data, params = _setup(case, algorithm, args.warmup + 4, args)
            with Reconstructor(data, start(case, data, params), backend) as rec:
                for _ in range(args.warmup):
                    rec.iterate()
                walls = []
                for _ in range(3):
                    backend.synchronize()
                    t = time.perf_counter()
                    rec.iterate()
                    backend.synchronize()
                    walls.append(time.perf_counter() - t)
                if args.host:
                    _host_profile(rec, backend, args.top)
                else:
                    import cupy  # noqa: PLC0415 - a GPU machine only

                    cupy.cuda.profiler.start()
                    rec.iterate()
                    backend.synchronize()
                    cupy.cuda.profiler.stop()
            print(json.dumps({"profiled": f"{algorithm} {args.field} {name}",
                              "slices": args.slices, "modes": args.modes,
                              "batch_size": params.batch_size_for(n),
                              "wall_seconds": float(np.median(walls))}), flush=True)
            log(f"profiled {algorithm} {args.field} {name}")


def _host_profile(rec: Reconstructor, backend: Any, top: int) -> None:
    """The host's side of one iteration under cProfile: the ``top`` functions by their own
    time. Launches return at once, so a function that holds the host long is one that
    waits for the card (a hidden synchronisation) or costs the host itself."""
    prof = cProfile.Profile()
    prof.enable()
    rec.iterate()
    backend.synchronize()
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tottime, cumtime, ...)}
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (file, line, name), (_cc, calls, own, cum, _callers) in ranked:
        print(json.dumps({"function": f"{Path(file).name}:{line}:{name}", "calls": calls,
                          "own_ms": round(own * 1e3, 2), "cumulative_ms": round(cum * 1e3, 2)}))


def summarize(path: Path, top: int) -> None:
    """ncu's CSV (one row per kernel and metric, in launch order) -> per-kernel sums."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own log lines come first
    rows = list(csv.DictReader(lines))
    if not rows:
        print(json.dumps({"summary": "no kernels in " + str(path)}))
        return
    # ncu's units: --print-units base gives ns and byte (an unknown one stops the summary).
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, "byte": 1.0, "Kbyte": 1e3,
             "Mbyte": 1e6, "Gbyte": 1e9}
    kernels: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    seen: set[tuple[str, str]] = set()
    for row in rows:
        unit = row["Metric Unit"]
        if unit not in scale:
            raise SystemExit(f"{path}: unknown unit {unit!r} of {row['Metric Name']}")
        value = float(row["Metric Value"].replace(",", "")) * scale[unit]
        k = kernels[row["Kernel Name"][:80]]
        k[row["Metric Name"]] += value
        key = (row["ID"], row["Kernel Name"])
        if key not in seen:
            seen.add(key)
            k["launches"] += 1
    total_us = sum(k["gpu__time_duration.sum"] for k in kernels.values())
    total_bytes = sum(k["dram__bytes_read.sum"] + k["dram__bytes_write.sum"]
                      for k in kernels.values())
    print(json.dumps({"total_kernels": len(seen), "kernel_us": round(total_us, 1),
                      "dram_gb": round(total_bytes / 1e9, 3),
                      "gbs": round(total_bytes / total_us / 1e3, 1)}))
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1]["gpu__time_duration.sum"])
    for name, k in ranked[:top]:
        nbytes = k["dram__bytes_read.sum"] + k["dram__bytes_write.sum"]
        us = k["gpu__time_duration.sum"]
        print(json.dumps({"kernel": name, "launches": int(k["launches"]), "us": round(us, 1),
                          "share": round(us / total_us, 3), "dram_mb": round(nbytes / 1e6, 1),
                          "gbs": round(nbytes / us / 1e3, 1) if us else None}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--summarize", type=Path, metavar="NCU_CSV")
    ap.add_argument("--top", type=int, default=25,
                    help="kernels (--summarize) or functions (--host) listed")
    ap.add_argument("--host", action="store_true",
                    help="profile the host's side of the iteration (cProfile), not the card")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda",
                    help="cpu: only to try --host without a card")
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=["4000x128"])
    ap.add_argument("--field", choices=("far", "near"), default="far")
    ap.add_argument("--algorithms", nargs="+", default=["rpie", "lsqml"])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--scan-cache", type=Path, default=None, metavar="DIR")
    ap.add_argument("--modes", type=int, default=1, metavar="K", help="probe modes")
    ap.add_argument("--slices", type=int, default=1, metavar="S",
                    help="object layers (bench_gpu.py's thick cases)")
    ap.add_argument("--slice-spacing", default=None, metavar="M",
                    help="metres between the layers: one value, or S−1 comma-separated")
    ap.add_argument("--thin-frames", action="store_true",
                    help="layers from the thin scan's frames (bench_gpu.py --thin-frames)")
    args = ap.parse_args()
    try:
        args.spacings = slice_spacings(args.slices, args.slice_spacing)
    except ValueError as exc:
        ap.error(f"--slices/--slice-spacing: {exc}")
    if args.summarize:
        summarize(args.summarize, args.top)
    else:
        profile(args)


if __name__ == "__main__":
    main()
