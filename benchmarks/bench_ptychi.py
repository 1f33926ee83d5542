"""beamflow vs Pty-Chi on the same simulated scan: seconds per iteration and NRMSE (CPU).

Run from the repository root with the project's interpreter::

    .venv/bin/python benchmarks/bench_ptychi.py [--positions 400] [--iterations 100]
        [--algorithms rpie lsqml] [--batch 32] [--setup-only] [--skip-beamflow]

What it does:

1. Builds Pty-Chi in its own virtual environment ``benchmarks/.peers/venv`` (gitignored) if
   it is not there yet, as /work/shared/RECIPES.md describes: ``torch==2.13.0`` (the CPU
   wheel on disk), ``ptychi==2.2.0`` with ``--no-deps`` plus the modules it imports at run
   time — but not torchvision, whose wheel does not import beside CPU torch; the runner
   registers a stand-in module instead (see ``ptychi_runner.py``).
2. Simulates one scan with ``beamflow.simulate`` (Fermat spiral with sub-pixel positions,
   Poisson counts, dead/hot pixels masked) and an initial probe guess: the true probe
   defocused until its complex NRMSE from the truth is ``--guess-nrmse`` (0.6), scaled to the
   measured counts. Both engines get exactly these frames, mask, positions, object size and
   probe guess, written to ``benchmarks/results/ptychi/data.npz``.
3. Runs ``ptychi_runner.py`` in the peer venv (Pty-Chi's rPIE and LSQ-ML, CPU, same iteration
   count and batch size), then beamflow's engine in this process.
4. Scores every object with ``beamflow.ptycho.quality.metrics.compare`` against the true object over
   the well-illuminated region (summed true-probe intensity ≥ 30 % of its maximum), and
   prints one JSON line per result (``engine``, ``algorithm``, ``seconds_per_iteration`` —
   wall clock: iterations 2..N are split into ``--blocks`` blocks and this is the median of
   the block means; ``min_seconds_per_iteration`` is the smallest block mean, the least
   disturbed by other work on a shared machine —, ``cpu_seconds_per_iteration`` (CPU time
   summed over threads), ``nrmse``, ``phase_nrmse``) and one per algorithm with the ratio
   ``ptychi_seconds_per_iteration / beamflow_seconds_per_iteration``, the ratio of the
   minima, the ratio of CPU times, and both NRMSEs. Each Pty-Chi block is one
   ``task.run(n)`` call: one call per epoch would charge its fixed per-call overhead
   (~0.25 s) to every epoch.
5. Thick samples: ``--slices S --slice-spacing M`` (one spacing, or S−1 comma-separated, in
   metres) simulates S layers (``beamflow.simulate``'s exact multislice, not either engine's
   model) and runs Pty-Chi's multislice model (``object_options.slice_spacings_m``;
   ``--multislice-regularization W`` turns on its depth regulariser). Each line then also
   carries ``projection_nrmse``, ``layer_nrmse`` and ``cutoff_cycles_per_px``
   (``beamflow.ground_truth.score_layers``: each layer above the frequency its spacing
   separates); ``nrmse`` is that of the projection. beamflow's engine runs beside it only
   once its ``ReconParams`` has ``slices`` (until then: ``--skip-beamflow``, or it says so
   and skips). The issue's sample: ``--slices 2 --slice-spacing 4e-4 --algorithms lsqml``
   (400 × 64², 58.7 nm pixels at 8.8 keV: 16 depths of field apart).
6. With ``--timing-rounds R``: R pairs of short runs (``--timing-iterations``, default 20)
   of the two engines, alternated (and which goes first alternating too), and one line with
   each pair's ratio and their median: on a machine whose speed drifts between the long
   runs, the pairs see the same machine. Each short run is timed in ``--blocks`` blocks
   too: ``ratios_of_minima`` compares their fastest blocks, which a burst of slow
   iterations in one run does not carry.

Not part of the test suite: it takes minutes (torch install on the first run, ~1 minute per
Pty-Chi algorithm at 400 positions on two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # ptychi_runner.block_sizes (stdlib-only import)
PEERS = ROOT / "benchmarks" / ".peers"
VENV = PEERS / "venv"
PEER_PYTHON = VENV / "bin" / "python"
RESULTS = ROOT / "benchmarks" / "results" / "ptychi"
RUNNER = ROOT / "benchmarks" / "ptychi_runner.py"

TORCH = "torch==2.13.0"
PTYCHI = "ptychi==2.2.0"
# What ptychi 2.2.0 imports at run time (its metadata also pulls torchvision, mypy, pytest,
# ruff; torchvision is replaced by a stand-in, the rest are development tools).
PTYCHI_RUNTIME = [
    "numpy>=2.1",
    "scipy",
    "h5py",
    "tqdm",
    "matplotlib>=3.10.6",
    "scikit-image",
    "scikit-learn",
    "pandas",
    "pydantic>=2,<3",
]


def log(msg: str) -> None:
    print(f"[bench_ptychi] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- peer venv


def _peer_ok() -> bool:
    if not PEER_PYTHON.exists():
        return False
    probe = (
        "import torch, importlib.util as u; assert u.find_spec('ptychi'); print(torch.__version__)"
    )
    r = subprocess.run([str(PEER_PYTHON), "-c", probe], capture_output=True, text=True)
    return r.returncode == 0


def ensure_peer_venv() -> None:
    """Create ``benchmarks/.peers/venv`` with CPU torch and Pty-Chi (idempotent)."""
    if _peer_ok():
        return
    log(f"building Pty-Chi's venv in {VENV} (torch install takes a few minutes)")
    PEERS.mkdir(parents=True, exist_ok=True)
    if not PEER_PYTHON.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(PEER_PYTHON), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, TORCH], check=True)
    wheels = PEERS / "wheels"
    subprocess.run(
        [
            str(PEER_PYTHON),
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "-d",
            str(wheels),
            PTYCHI,
        ],
        check=True,
    )
    wheel = sorted(wheels.glob("ptychi-2.2.0-*.whl"))
    if not wheel:
        raise SystemExit(f"pip download left no ptychi 2.2.0 wheel in {wheels}")
    subprocess.run([*pip, "--no-deps", str(wheel[-1])], check=True)
    subprocess.run([*pip, *PTYCHI_RUNTIME], check=True)
    if not _peer_ok():
        raise SystemExit(f"the peer venv {VENV} was built but torch/ptychi do not import")


# --------------------------------------------------------------------------- data


def _defocus(probe: np.ndarray, dz: float, wavelength: float, dx: float) -> np.ndarray:
    """Probe propagated by ``dz`` (Fresnel transfer function exp(−iπλΔz|k|²))."""
    m = probe.shape[-1]
    k = np.fft.fftfreq(m, dx)
    h = np.exp(-1j * np.pi * wavelength * dz * (k[:, None] ** 2 + k[None, :] ** 2))
    return np.fft.ifft2(np.fft.fft2(probe) * h)


def probe_guess(
    probe, target_nrmse: float, wavelength: float, dx: float
) -> tuple[np.ndarray, float]:
    """The true probe defocused until its NRMSE (after the optimal complex scalar) is
    ``target_nrmse`` — a realistic "wrong focus" starting guess. Bisection on Δz."""
    from beamflow.ptycho.quality.metrics import compare

    def err(dz: float) -> float:
        return compare(
            _defocus(probe, dz, wavelength, dx), probe, register=False, remove_ramp=False
        ).nrmse

    lo, hi = 0.0, 1e-6
    while err(hi) < target_nrmse:
        hi *= 2
        if hi > 1.0:
            raise SystemExit("could not defocus the probe far enough from the truth")
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if err(mid) < target_nrmse else (lo, mid)
    dz = 0.5 * (lo + hi)
    return _defocus(probe, dz, wavelength, dx).astype(np.complex64), dz


def make_data(args) -> dict:
    from beamflow.ptycho.probe import mean_counts_per_frame, scale_probe
    from beamflow.ptycho.quality.metrics import compare, illumination_mask
    from beamflow.simulate import detector_frames, make_ground_truth

    gt = make_ground_truth(
        positions=args.positions, probe_size=args.probe_size, photons=args.photons,
        seed=args.seed, slices=args.slices, slice_spacing_m=args.slice_spacing,
    )
    n = gt.n_positions
    frames = detector_frames(gt, 0, n, np.random.default_rng(args.seed + 1)).astype(np.float32)
    mask = gt.mask
    frames[:, ~mask] = 0.0  # invalid (dead/hot) pixels carry no information; keep them tidy
    wavelength = gt.geometry.wavelength_m
    dx = gt.object_pixel_size_m
    guess, dz = probe_guess(gt.probe, args.guess_nrmse, wavelength, dx)
    guess = scale_probe(guess, mean_counts_per_frame(frames, mask), mask=mask)
    shape = gt.layers.shape[1:]
    region = illumination_mask(shape, gt.probe, gt.positions_px, fraction=0.3)
    return {
        "intensities": frames,
        "mask": mask,
        "corners_px": gt.positions_px.astype(np.float64),
        "object_shape": np.array(shape),
        "slice_spacings_m": gt.object_layer_spacing_m,
        "probe": guess,
        "wavelength_m": wavelength,
        "pixel_size_m": dx,
        "true_object": gt.object,
        "true_probe": gt.probe,
        "region": region,
        "guess_defocus_m": dz,
        "guess_nrmse": compare(guess[0], gt.probe, register=False, remove_ramp=False).nrmse,
    }


# --------------------------------------------------------------------------- engines


def run_ptychi(data_path: Path, args, name: str = "ptychi"
               ) -> tuple[list[dict], dict[str, np.ndarray]]:
    prefix = RESULTS / name
    cmd = [
        str(PEER_PYTHON),
        str(RUNNER),
        str(data_path),
        str(prefix),
        "--algorithms",
        *args.algorithms,
        "--iterations",
        str(args.iterations),
        "--batch",
        str(args.batch),
        "--alpha",
        str(args.alpha),
        "--beta",
        str(args.beta),
        "--step",
        str(args.ptychi_step),
        "--seed",
        str(args.seed),
        "--blocks",
        str(args.blocks),
        "--multislice-regularization",
        str(args.multislice_regularization),
    ]
    log("running Pty-Chi: " + " ".join(cmd[1:]))
    subprocess.run(cmd, check=True, cwd=ROOT)
    records = json.loads(prefix.with_suffix(".json").read_text())
    with np.load(prefix.with_suffix(".npz")) as f:
        arrays = {k: f[k] for k in f.files}
    return records, arrays


def run_beamflow(d: dict, alg: str, args) -> tuple[dict, np.ndarray]:
    from beamflow.ptycho import (
        PtychoData,
        ReconParams,
        Reconstructor,
        array_backend,
        initial_state,
    )

    data = PtychoData(
        intensities=d["intensities"],
        positions_px=d["corners_px"],
        object_shape=tuple(int(v) for v in d["object_shape"]),
        mask=d["mask"],
    )
    kwargs = {"alpha": args.alpha, "beta": args.beta} if alg in ("rpie", "epie") else {}
    if args.slices > 1:
        from beamflow.ptycho.forward.propagation import Propagation

        kwargs.update(slices=args.slices, slice_spacing_m=list(d["slice_spacings_m"]),
                      layer_regularization=args.layer_regularization,
                      propagation=Propagation(wavelength_m=d["wavelength_m"],
                                              pixel_size_m=d["pixel_size_m"]))
    params = ReconParams(
        algorithm=alg, iterations=args.iterations, batch_size=args.batch, seed=args.seed, **kwargs
    )
    state = initial_state(data, params, probe=d["probe"])
    seconds: list[float] = []
    cpu_marks = [time.process_time()]

    def on_iteration(_view, info) -> None:
        seconds.append(info["seconds"])
        cpu_marks.append(time.process_time())

    backend = array_backend("cpu")
    t0 = time.perf_counter()
    with Reconstructor(data, state, backend) as rec:
        final = rec.run(callback=on_iteration)
    total = time.perf_counter() - t0
    # As for Pty-Chi (ptychi_runner.py): iterations 2..N in the same blocks, block means.
    from ptychi_runner import block_sizes  # noqa: E402 (path set above)

    cpu_each = np.diff(cpu_marks)
    wall_blocks, cpu_blocks, start = [], [], 1
    for n in block_sizes(len(seconds) - 1, args.blocks):
        wall_blocks.append(float(np.mean(seconds[start : start + n])))
        cpu_blocks.append(float(np.mean(cpu_each[start : start + n])))
        start += n
    wall_blocks = wall_blocks or seconds[:1]
    cpu_blocks = cpu_blocks or [float(cpu_each[0])]
    record = {
        "engine": "beamflow",
        "algorithm": alg,
        "iterations": len(seconds),
        "batch_size": args.batch,
        "threads": backend.threads,
        "seconds_per_iteration": float(np.median(wall_blocks)),
        "min_seconds_per_iteration": float(np.min(wall_blocks)),
        "cpu_seconds_per_iteration": float(np.median(cpu_blocks)),
        "block_seconds_per_iteration": wall_blocks,
        "first_iteration_seconds": seconds[0] if seconds else None,
        "total_seconds": total,
        "final_loss": final.loss_history[-1] if final.loss_history else None,
    }
    return record, final.object


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--positions", type=int, default=400)
    ap.add_argument("--probe-size", type=int, default=64)
    ap.add_argument("--photons", type=float, default=3e5)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument(
        "--algorithms", nargs="+", default=["rpie", "lsqml"], choices=["rpie", "epie", "lsqml"]
    )
    ap.add_argument("--alpha", type=float, default=0.1, help="rPIE object alpha (both engines)")
    ap.add_argument("--beta", type=float, default=0.1, help="rPIE probe alpha (both engines)")
    ap.add_argument(
        "--ptychi-step",
        type=float,
        default=0.1,
        help="Pty-Chi PIE step size γ (Maiden 2017, eq. 22); 0.1 as in Pty-Chi's own tests, "
        "the best of 1, 0.5, 0.25, 0.1 on this scan (1 diverges at batch 32)",
    )
    ap.add_argument("--slices", type=int, default=1, help="layers of a thick sample")
    ap.add_argument("--slice-spacing", default=None, metavar="M",
                    help="metres between the layers: one value or S−1 comma-separated")
    ap.add_argument("--multislice-regularization", type=float, default=0.0, metavar="W",
                    help="Pty-Chi's depth regulariser weight for thick samples (0: off)")
    ap.add_argument("--layer-regularization", type=float, default=0.0, metavar="B",
                    help="beamflow's depth regulariser strength for thick samples (0: off)")
    ap.add_argument("--guess-nrmse", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--blocks", type=int, default=4, help="timed blocks of iterations 2..N (median, min)"
    )
    ap.add_argument(
        "--timing-rounds", type=int, default=0,
        help="then this many rounds of --timing-iterations iterations of each engine, "
        "alternated: per-round ratios that a machine whose speed drifts affects alike",
    )
    ap.add_argument("--timing-iterations", type=int, default=20)
    ap.add_argument("--setup-only", action="store_true", help="build the peer venv and stop")
    ap.add_argument("--skip-ptychi", action="store_true")
    ap.add_argument("--skip-beamflow", action="store_true")
    args = ap.parse_args()
    from beamflow.ptycho.forward.slices import slice_spacings

    try:
        slice_spacings(args.slices, args.slice_spacing)
    except ValueError as exc:
        ap.error(f"--slices/--slice-spacing: {exc}")
    if args.slices > 1 and not args.skip_beamflow:
        from beamflow.ptycho import ReconParams

        if "slices" not in ReconParams.model_fields:
            log("beamflow's engine has no layers (ReconParams.slices) yet: Pty-Chi only")
            args.skip_beamflow = True

    if not args.skip_ptychi:
        ensure_peer_venv()
    if args.setup_only:
        return
    from beamflow.ground_truth import score_layers
    from beamflow.ptycho.quality.metrics import compare

    RESULTS.mkdir(parents=True, exist_ok=True)
    log(f"simulating {args.positions} positions of {args.probe_size} px, {args.photons:g} photons")
    d = make_data(args)
    data_path = RESULTS / "data.npz"
    np.savez(data_path, **{k: v for k, v in d.items()})
    log(f"probe guess: defocus {d['guess_defocus_m'] * 1e6:.1f} µm, NRMSE {d['guess_nrmse']:.3f}")
    common = {
        "positions": int(d["intensities"].shape[0]),
        "frame": int(d["intensities"].shape[-1]),
        "object_shape": [int(v) for v in d["object_shape"]],
        "cpus": os.cpu_count(),
    }

    def load() -> dict:
        # The machine is shared: a busy neighbour inflates both engines' timings.
        return {"load_avg_1min": round(os.getloadavg()[0], 2)}

    def score(obj: np.ndarray) -> dict:
        if args.slices > 1:
            layers = score_layers(obj, d["true_object"], d["slice_spacings_m"],
                                  d["wavelength_m"], d["pixel_size_m"], d["region"])
            return {"nrmse": round(layers.projection_nrmse, 5),
                    "phase_nrmse": round(layers.projection.phase_nrmse, 5),
                    "slices": args.slices,
                    "slice_spacings_m": [float(v) for v in d["slice_spacings_m"]],
                    **layers.as_dict()}
        c = compare(obj, d["true_object"], d["region"])
        return {"nrmse": round(c.nrmse, 5), "phase_nrmse": round(c.phase_nrmse, 5)}

    results: dict[tuple[str, str], dict] = {}
    if not args.skip_ptychi:
        records, arrays = run_ptychi(data_path, args)
        for r in records:
            r.pop("epoch_seconds", None)
            r.pop("losses", None)
            r.update(score(arrays[f"object_{r['algorithm']}"]), **common, **load())
            results[("ptychi", r["algorithm"])] = r
            print(json.dumps(r), flush=True)
    if not args.skip_beamflow:
        for alg in args.algorithms:
            log(f"running beamflow {alg}")
            r, obj = run_beamflow(d, alg, args)
            r.update(score(obj), **common, **load())
            results[("beamflow", alg)] = r
            print(json.dumps(r), flush=True)
    for alg in args.algorithms:
        p, b = results.get(("ptychi", alg)), results.get(("beamflow", alg))
        if p and b:
            print(
                json.dumps(
                    {
                        "metric": "ptychi_over_beamflow_seconds_per_iteration",
                        "algorithm": alg,
                        "ratio": round(p["seconds_per_iteration"] / b["seconds_per_iteration"], 2),
                        # Minimum over iterations: the least disturbed by a busy shared machine.
                        "ratio_of_minima": round(
                            p["min_seconds_per_iteration"] / b["min_seconds_per_iteration"], 2
                        ),
                        # CPU time summed over threads: the work done, robust to load.
                        "ratio_cpu_time": round(
                            p["cpu_seconds_per_iteration"] / b["cpu_seconds_per_iteration"], 2
                        ),
                        "ptychi_seconds_per_iteration": p["seconds_per_iteration"],
                        "beamflow_seconds_per_iteration": b["seconds_per_iteration"],
                        "nrmse_ptychi": p["nrmse"],
                        "nrmse_beamflow": b["nrmse"],
                        "iterations": args.iterations,
                        "batch_size": args.batch,
                        **common,
                    }
                ),
                flush=True,
            )


    if args.timing_rounds and not (args.skip_ptychi or args.skip_beamflow):
        alternated(d, data_path, args, common)


def alternated(d: dict, data_path: Path, args, common: dict) -> None:
    """Short runs of the two engines in alternation (the first of each pair alternating too);
    the ratio of each pair's seconds per iteration, and their median. Each run's iterations
    2..N are timed in ``--blocks`` blocks: ``ratios`` are of the blocks' medians,
    ``ratios_of_minima`` of their fastest blocks — the figure that a burst of slow
    iterations in one run (other work on a shared machine; Pty-Chi's multislice runs had
    blocks 10–20× slower than the rest) does not carry."""
    for alg in args.algorithms:
        short = argparse.Namespace(**{**vars(args), "algorithms": [alg],
                                      "iterations": args.timing_iterations})
        ratios, minima = [], []
        for r in range(args.timing_rounds):
            runs = {}
            for engine in (("ptychi", "beamflow") if r % 2 == 0 else ("beamflow", "ptychi")):
                if engine == "ptychi":
                    runs[engine] = run_ptychi(data_path, short, "ptychi_short")[0][0]
                else:
                    runs[engine] = run_beamflow(d, alg, short)[0]
            ratios.append(runs["ptychi"]["seconds_per_iteration"]
                          / runs["beamflow"]["seconds_per_iteration"])
            minima.append(runs["ptychi"]["min_seconds_per_iteration"]
                          / runs["beamflow"]["min_seconds_per_iteration"])
            log(f"{alg} round {r + 1}: Pty-Chi / beamflow = {ratios[-1]:.2f} "
                f"(fastest blocks: {minima[-1]:.2f})")
        print(json.dumps({
            "metric": "ptychi_over_beamflow_alternated", "algorithm": alg,
            "rounds": args.timing_rounds, "iterations_per_run": args.timing_iterations,
            "blocks_per_run": args.blocks, "ratios": [round(v, 2) for v in ratios],
            "ratio_median": round(float(np.median(ratios)), 2),
            "ratios_of_minima": [round(v, 2) for v in minima],
            "ratio_of_minima_median": round(float(np.median(minima)), 2),
            "batch_size": args.batch, "slices": args.slices, **common,
            "load_avg_1min": round(os.getloadavg()[0], 2),
        }), flush=True)


if __name__ == "__main__":
    main()
