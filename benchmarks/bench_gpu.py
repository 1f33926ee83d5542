"""The engine against the memory floor of the device: seconds per iteration of every algorithm
on simulated far- and near-field scans, beside what moving the bytes alone would take.

Run from the repository root with the project's interpreter::

    .venv/bin/python benchmarks/bench_gpu.py --device cuda --json          # all cases
    .venv/bin/python benchmarks/bench_gpu.py --device cpu --quick --json   # 400 x 64² only

Cases: far- and near-field scans of 400 positions × 64², 4000 × 128² and 10000 × 256²
(``--quick``: 400 × 64²; ``--cases 4000x128`` picks), each with every algorithm (ePIE, rPIE,
DM, LSQ-ML; ``--algorithms`` picks). Scans come from ``beamflow.simulate`` (Poisson counts,
dead and hot pixels masked, sub-pixel positions); every reconstruction, beamflow's and
Pty-Chi's, starts from the true probe defocused to NRMSE 0.6 (``bench_ptychi.py``'s guess, as
in the issue's NRMSE figures). From the engine's own guess (``probe_from_data``) these far-field
scans stagnate: object NRMSE 0.40, phase NRMSE 1.06 after 100 rPIE iterations at 400 × 64²
(0.012 from the true probe), so its NRMSE said nothing of the GPU path.

Simulating a scan costs the host more than timing it on a card (10000 × 256²: about 70 s
on one core, mostly Poisson draws that hold the GIL). ``--scan-cache DIR`` keeps each
simulated scan there (``{field}_{N}x{M}_seed{S}_frames.npy``, ``_region.npy`` and
``_ground_truth.h5``, written under temporary names and renamed, the ground truth last) and
loads it in later invocations; ``--simulate-only`` fills the cache for the selected cases
and fields without touching the device, so scans can be made in other processes while the
card is busy (``benchmarks/gpu_check.sh``). The cache is keyed by the
case and seed only: empty it when the simulator changes.

Timing: ``--warmup`` iterations (default 2: plans, caches, kernel compilation), then
``--iterations`` timed ones; the engine synchronises the device after each iteration, so
each is its true duration; ``seconds_per_iteration`` is their median.

The floor (``floor_seconds``): the bytes an iteration must move at least, divided by the
device's measured copy bandwidth (``copy_gbs``: a large device-to-device copy, read + write
counted, best of 5). Bytes moved, per iteration, counted as passes — one read or one write
of the (N, K, M, M) complex64 stack of a scan (8·N·K·M² bytes) — plus one read of the
frames in the dtype the engine keeps them (float32 amplitudes, or uint16 counts on a GPU):

=============================  ===  ==========================================================
step                           far  what is read or written
=============================  ===  ==========================================================
object patches O_j               1  write the gathered windows (object reads hit the cache)
sub-pixel shifted probe P_j      3  write ramp × spectrum, inverse FFT (read + write)
exit wave ψ = P_j·O_j            3  read P_j and O_j, write ψ
FFT to the detector              2  read + write
modulus constraint               2  read Ψ, write the correction (+ the frames, apart)
FFT to the sample                2  read + write
object terms conj(P_j)·χ         3  read P_j and χ, scatter-add
probe terms conj(O_j)·χ          3  read O_j and χ, write
probe adjoint FFT (sub-pixel)    2  read + write
=============================  ===  ==========================================================

PIE (ePIE, rPIE): the 21 passes above. LSQ-ML: + 15 (keep P_j, O_j, χ: 3; shift ΔP: 3;
P_j·ΔO_j and O_j·ΔP_j: 6; the five dot products of the step-length systems, fused: 3) = 36.
DM: 30 (the forward model's 9; read and write the stored exit waves: 2; modulus of 2Φ−Ψ:
3 + 2; to the sample: 2; object terms: 3; the probe pass: read Ψ, FFT, gather, terms,
adjoint FFT: 9). Near field: + 12 (to the detector and back, each an extra FFT pair and a
propagator product: 2 × (4 + 2)). Object- and probe-sized traffic is left out (small beside
the stacks). So for rPIE at 4000 × 128² far field: 21 × 0.52 GB + 0.07 GB of frames = 11.1
GB, 3.7 ms at an H100's ~3 TB/s.

Pty-Chi side by side: when an interpreter with Pty-Chi is there (``--ptychi-python``,
default ``benchmarks/.peers/venv/bin/python`` as built by ``bench_ptychi.py``), the far-field
ePIE, rPIE and LSQ-ML cases also run in Pty-Chi on the same device, frames, probe guess and
batch size (``benchmarks/ptychi_runner.py --device``), one line each with
``"engine": "ptychi"``. Without it, one line says it was skipped. ``--skip-beamflow`` runs
Pty-Chi alone (beamflow's lines taken earlier, with the same arguments).

Launches: a kernel launch costs the host ~5-10 µs (CuPy's Python side and the CUDA launch)
whatever the kernel's size, so an iteration that launches more kernels than its bytes take
to move is launch-bound, whatever the card. ``launches_per_iteration`` counts them on the
counting stand-in for CuPy (``tests/counting_cupy.py``: the engine's GPU code path on numpy
memory; an iteration after one warm-up, the same batches as the timed run), on any
machine; ``launch_seconds`` is that count times an assumed :data:`LAUNCH_SECONDS` (7.5 µs,
the middle of CuPy's 5-10 µs on a current CPU — measure it on the GPU host and pass
``--launch-us``; on a GPU ``measured_launch_us`` gives the host cost of a tiny in-place
kernel there), ``launch_ratio`` that over ``floor_seconds``: above 1 the case is
launch-bound before it is memory-bound. The stand-in runs the iteration's arithmetic in
numpy on one thread (seconds at 4000 × 128², minutes at 10000 × 256²); ``--no-launches``
skips it. The fused kernels (``beamflow/ptycho/gpu/kernels.py``) run there as their numpy
references (``tests/reference_kernels.py``), each counted as the one launch it is on CuPy
(the modulus kernel two: it and its sum). What it counts differs from CuPy in small ways:
CuPy's allocations (``zeros``) are not counted and its ``broadcast_to`` (a view) is.
An FFT costs the host more than a plain launch (CuPy's argument checks and plan lookup in
Python): ``ffts_per_iteration`` counts the FFTs among the launches, and on a GPU
``measured_fft_us`` is the host cost of one engine FFT on a small stack, so the host's time
per iteration is about launches × ``measured_launch_us`` + FFTs × (``measured_fft_us`` −
``measured_launch_us``), to set beside ``seconds_per_iteration``.

Counted traffic and the model: the stand-in also counts the bytes each kernel reads and
writes in device memory (``tests/counting_cupy.py`` says how), so the engine's own traffic
sits beside the floor's: ``counted_bytes_per_iteration`` and ``counted_passes`` (those bytes
in passes of the stack). ``model_seconds`` is what an iteration would take on a card with
``model_gbs`` of bandwidth (the measured copy bandwidth on a GPU; ``--model-gbs``, default
3000, an H100 SXM's copy rate, on the CPU) when nothing else limits it: the host enqueues
while the device works (no host reads inside an iteration), so it is the larger of the
host's launch time (``launch_seconds``) and the device's, the counted bytes over the
bandwidth plus :data:`KERNEL_SECONDS` per kernel (a kernel's start and tail on the device).
It is a model — it leaves out cuFFT's extra passes for large frames, atomics' contention and
the cache — so the timed figure on a card is the one that counts; the model says which of
launches and traffic to cut first, and is there before a card is.

Output (``--json``): one line per case: ``engine``, ``algorithm``, ``field``, ``positions``,
``frame``, ``device``, ``iterations``, ``seconds_per_iteration``, ``floor_seconds``,
``floor_ratio`` (seconds / floor), ``bytes_per_iteration``, ``copy_gbs``, ``nrmse``
(complex NRMSE of the object against the truth over the well-lit region), ``final_loss``,
``launches_per_iteration``, ``ffts_per_iteration``, ``launch_us`` (the assumed cost),
``launch_seconds``, on a GPU ``measured_launch_us`` and ``measured_fft_us``,
``launch_ratio``, ``counted_bytes_per_iteration``, ``counted_passes``, ``model_gbs``,
``model_seconds`` and ``batch_size``. A case's objects are scored (``nrmse``) after all its
timed runs, one after another or, with ``--score-workers N``, side by side in N spawned
processes: ``compare`` costs the host ~9 s at 4000 × 128² and ~70 s at 10000 × 256² on one
core, more than the timed iterations on a card (``--no-score``: ``nrmse`` null); each timing
is logged (stderr) as soon as it is taken. ``--sites N`` adds, per case, the N engine lines
(``file:line`` in ``beamflow/ptycho``) whose kernels move the most bytes on the stand-in,
one line each with ``site``, ``launches_per_iteration`` and ``counted_passes``: where to
fuse next.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from itertools import repeat
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))  # the counting stand-in for CuPy

from beamflow.atomic import atomic_path  # noqa: E402
from beamflow.ground_truth import read_ground_truth, write_ground_truth  # noqa: E402
from beamflow.ptycho import (  # noqa: E402
    ArrayBackend,
    PtychoData,
    ReconParams,
    Reconstructor,
    array_backend,
    initial_state,
)
from beamflow.ptycho.quality.metrics import compare, illumination_mask  # noqa: E402

CASES = {"400x64": (400, 64), "4000x128": (4000, 128), "10000x256": (10000, 256)}
QUICK = ("400x64",)
ALGORITHMS = ("epie", "rpie", "dm", "lsqml")
PTYCHI_ALGORITHMS = ("epie", "rpie", "lsqml")
PEER_PYTHON = ROOT / "benchmarks" / ".peers" / "venv" / "bin" / "python"
RESULTS = ROOT / "benchmarks" / "results" / "gpu"

# Passes over the (N, K, M, M) complex64 stack per iteration (see the module docstring).
PIE_PASSES = 1 + 3 + 3 + 2 + 2 + 2 + 3 + 3 + 2
PASSES = {"epie": PIE_PASSES, "rpie": PIE_PASSES, "lsqml": PIE_PASSES + 15, "dm": 30}
NEAR_FIELD_PASSES = 12
# Assumed host cost of one kernel launch on a GPU (CuPy: 5-10 µs; see the docstring).
LAUNCH_SECONDS = 7.5e-6
# Device-side cost of a kernel beyond its bytes (start, tail), for the model.
KERNEL_SECONDS = 2e-6
# The starting probe's NRMSE from the truth (bench_ptychi.py's default guess).
GUESS_NRMSE = 0.6
# The model's bandwidth on the CPU: an H100 SXM's device-to-device copy rate, bytes/s.
MODEL_BANDWIDTH = 3.0e12


def log(msg: str) -> None:
    print(f"[bench_gpu] {msg}", file=sys.stderr, flush=True)


def bytes_per_iteration(algorithm: str, near: bool, n: int, m: int, modes: int,
                        frame_bytes: int) -> int:
    """The floor model: bytes an iteration must move at least."""
    passes = PASSES[algorithm] + (NEAR_FIELD_PASSES if near else 0)
    return passes * n * modes * m * m * 8 + n * m * m * frame_bytes


def copy_bandwidth(backend: ArrayBackend, nbytes: int = 2**30) -> float:
    """Bytes per second of a large device-to-device copy (read + write), best of 5."""
    xp = backend.xp
    n = nbytes // 4
    a = xp.ones(n, np.float32)
    b = xp.empty_like(a)
    best = float("inf")
    for _ in range(6):
        backend.synchronize()
        t = time.perf_counter()
        xp.copyto(b, a)
        backend.synchronize()
        best = min(best, time.perf_counter() - t)
    del a, b
    if backend.is_gpu:  # give the 2 GiB back: the engine plans on the free memory
        xp.get_default_memory_pool().free_all_blocks()
    return 2 * n * 4 / best


def _host_seconds(backend: ArrayBackend, call: Any, n: int) -> float:
    """Seconds per ``call()`` on the device's queue, best of 5 runs of ``n``: the call is
    small enough that the queue never fills, so this is what the host spends on it."""
    best = float("inf")
    for _ in range(5):
        backend.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            call()
        backend.synchronize()
        best = min(best, (time.perf_counter() - t) / n)
    return best


def launch_cost(backend: ArrayBackend) -> float | None:
    """Seconds per launch of a tiny in-place kernel on a GPU; None on the CPU."""
    if not backend.is_gpu:
        return None
    xp = backend.xp
    a = xp.zeros(1, np.float32)
    return _host_seconds(backend, lambda: xp.add(a, 1, out=a), 2000)


def fft_cost(backend: ArrayBackend) -> float | None:
    """Seconds per call of the engine's FFT (``ArrayBackend.fft2``, in place) on a stack
    small enough that the host's side is what is timed: CuPy's argument checks and plan
    lookup, beyond a plain launch. None on the CPU."""
    if not backend.is_gpu:
        return None
    a = backend.xp.zeros((4, 32, 32), np.complex64)
    return _host_seconds(backend, lambda: backend.fft2(a), 500)


def cached_scan(cache: Path | None, field: str, n: int, m: int, seed: int
                ) -> dict[str, Any]:
    """The case's simulated scan, from ``cache`` when it holds it (both files), else
    simulated now and, with a ``cache``, stored there for the next invocation."""
    if cache is None:
        return simulate(field, n, m, seed)
    stem = cache / f"{field}_{n}x{m}_seed{seed}"
    frames_path = stem.with_name(stem.name + "_frames.npy")
    region_path = stem.with_name(stem.name + "_region.npy")
    gt_path = stem.with_name(stem.name + "_ground_truth.h5")
    if frames_path.exists() and region_path.exists() and gt_path.exists():
        log(f"loading {field} field {n} x {m}² from {stem}_*")
        return {"gt": read_ground_truth(gt_path), "frames": np.load(frames_path),
                "region": np.load(region_path)}
    case = simulate(field, n, m, seed)
    cache.mkdir(parents=True, exist_ok=True)
    # The ground truth last: a reader needs all three, so a step killed before it leaves a
    # scan that is simulated again, never half of one. No pickle: arrays and the simulator's
    # own ground-truth file.
    for path, array in ((frames_path, case["frames"]), (region_path, case["region"])):
        with atomic_path(path, durable=False) as tmp, open(tmp, "wb") as f:
            np.save(f, array)
    write_ground_truth(gt_path, case["gt"])
    return case


def simulate(field: str, n: int, m: int, seed: int) -> dict[str, Any]:
    log(f"simulating {field} field {n} x {m}²")
    from beamflow.simulate import (  # noqa: PLC0415
        detector_frames,
        make_ground_truth,
        make_near_field_ground_truth,
    )

    if field == "near":
        gt = make_near_field_ground_truth(positions=n, probe_size=m, photons=1e7, seed=seed)
    else:
        gt = make_ground_truth(positions=n, probe_size=m, photons=1e6, seed=seed)
    frames = np.empty((gt.n_positions, m, m), np.float32)
    for s in range(0, gt.n_positions, 256):  # bounded temporaries at 10000 × 256²
        e = min(s + 256, gt.n_positions)
        frames[s:e] = detector_frames(gt, s, e, np.random.default_rng(seed + 1 + s))
    return {"gt": gt, "frames": frames,
            "region": illumination_mask(gt.object.shape, gt.probe, gt.positions_px,
                                        fraction=0.3)}


def probe_start(case: dict[str, Any]) -> np.ndarray:
    """The case's starting probe: the true probe defocused to NRMSE ``GUESS_NRMSE``
    (``bench_ptychi.py``'s guess, from which the issue's NRMSE figures came); made once per
    case, scaled to the frames by ``initial_state``."""
    if "probe_start" not in case:
        from bench_ptychi import probe_guess  # noqa: PLC0415

        gt = case["gt"]
        case["probe_start"], _ = probe_guess(gt.probe, GUESS_NRMSE, gt.geometry.wavelength_m,
                                             gt.object_pixel_size_m)
    return case["probe_start"]


def start(case: dict[str, Any], data: PtychoData, params: ReconParams) -> Any:
    """The engine's initial state from the case's starting probe (:func:`probe_start`)."""
    return initial_state(data, params, probe=probe_start(case))


def _setup(case: dict[str, Any], algorithm: str, iterations: int,
           args: argparse.Namespace, batch: int | None = None) -> tuple[PtychoData, ReconParams]:
    """The engine's inputs for the case; ``batch`` (rPIE/LSQ-ML; default: the engine's by
    scan size) overrides ``args.batch`` where that is one number (profile_gpu.py's)."""
    gt = case["gt"]
    if batch is None and isinstance(args.batch, int):
        batch = args.batch
    data = PtychoData(intensities=case["frames"], positions_px=gt.positions_px,
                      object_shape=gt.object.shape, mask=gt.mask)
    params = ReconParams(algorithm=algorithm, iterations=iterations,
                         propagation=gt.propagation, seed=args.seed,
                         batch_size=batch if algorithm in ("rpie", "lsqml") else None)
    return data, params


def count_launches(case: dict[str, Any], algorithm: str, args: argparse.Namespace,
                   batch: int | None = None) -> tuple[int, int, int]:
    """Kernel launches, the bytes they move and the FFTs among them in the case's second
    iteration on the counting stand-in for CuPy."""
    from counting_cupy import COUNTS, by_site, installed  # noqa: PLC0415 - tests/, on the path

    data, params = _setup(case, algorithm, 2, args, batch)
    with installed() as backend, Reconstructor(data, start(case, data, params),
                                               backend) as rec:
        rec.iterate()  # caches and index offsets made once
        COUNTS.clear()
        with by_site() if args.sites else nullcontext({}) as sites:
            rec.iterate()
        stack = 8 * rec.core.N * rec.core.K * rec.core.M**2
        for site, (n, nbytes) in sorted(sites.items(), key=lambda kv: -kv[1][1])[:args.sites]:
            _emit(args, {"engine": "beamflow", "algorithm": algorithm, "site": site,
                         "launches_per_iteration": n, "counted_passes": nbytes / stack})
        return COUNTS["launch"], COUNTS["bytes"], COUNTS["fft"]


def model_seconds(launches: int, nbytes: int, bandwidth: float, launch_s: float) -> float:
    """An iteration's time when only launches and traffic limit it (module docstring)."""
    return max(launches * launch_s, nbytes / bandwidth + launches * KERNEL_SECONDS)


def run_beamflow(case: dict[str, Any], algorithm: str, backend: ArrayBackend,
                 args: argparse.Namespace, batch: int | None = None) -> dict[str, Any]:
    data, params = _setup(case, algorithm, args.warmup + args.iterations, args, batch)
    state = start(case, data, params)
    seconds: list[float] = []
    with Reconstructor(data, state, backend) as rec:
        final = rec.run(callback=lambda _view, info: seconds.append(info["seconds"]))
        frame_bytes = rec.core.frames.data.dtype.itemsize
        graphs = rec.algorithm.graphs
        replays = 0 if graphs is None else graphs.replays
    timed = seconds[args.warmup:] or seconds
    return {"seconds_per_iteration": float(np.median(timed)),
            "first_iteration_seconds": seconds[0], "frame_bytes": frame_bytes,
            "final_loss": final.loss_history[-1], "graph_replays": replays,
            "iterations": len(timed), "batch_size": params.batch_size_for(len(case["frames"])),
            "probe": state.probe, "object": final.object}


def nrmse(obj: np.ndarray, truth: np.ndarray, region: np.ndarray) -> float:
    return float(compare(obj, truth, region).nrmse)


def score(objects: list[np.ndarray], case: dict[str, Any], workers: int) -> list[float]:
    """The NRMSE of each finished object against the case's truth, after its timed runs.

    ``compare`` (sub-pixel registration, ramp fit) costs the host ~9 s at 4000 × 128² and
    ~70 s at 10000 × 256² on one core, more than the timed iterations on a card: with
    ``workers`` > 1 the objects are scored side by side in processes of their own (spawned:
    the parent may hold a CUDA context), never beside a timed iteration."""
    truth, region = case["gt"].object, case["region"]
    if workers <= 1 or len(objects) <= 1:
        return [nrmse(obj, truth, region) for obj in objects]
    with ProcessPoolExecutor(min(workers, len(objects)), mp_context=get_context("spawn")) as pool:
        return list(pool.map(nrmse, objects, repeat(truth), repeat(region)))


def run_ptychi(case: dict[str, Any], probe: np.ndarray, algorithms: list[str], batch: int,
               args: argparse.Namespace, name: str) -> list[dict[str, Any]]:
    """Pty-Chi on the same frames, probe guess and batch size as beamflow's rPIE/LSQ-ML
    (bench_ptychi.py's data format)."""
    gt = case["gt"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    data_path = RESULTS / f"{name}.npz"
    np.savez(data_path, intensities=case["frames"], mask=gt.mask,
             corners_px=gt.positions_px.astype(np.float64),
             object_shape=np.array(gt.object.shape), probe=probe.astype(np.complex64),
             wavelength_m=gt.geometry.wavelength_m, pixel_size_m=gt.object_pixel_size_m)
    prefix = RESULTS / f"{name}_ptychi"
    total = args.warmup + args.iterations
    cmd = [str(args.ptychi_python), str(ROOT / "benchmarks" / "ptychi_runner.py"),
           str(data_path), str(prefix), "--algorithms", *algorithms, "--iterations",
           str(total), "--batch", str(batch), "--seed", str(args.seed), "--blocks", "1",
           "--device", args.device]
    subprocess.run(cmd, check=True, cwd=ROOT)
    records = json.loads(prefix.with_suffix(".json").read_text())
    with np.load(prefix.with_suffix(".npz")) as f:
        for r in records:
            r["object"] = f[f"object_{r['algorithm']}"]
    return records


def ptychi_available(python: Path) -> bool:
    if not Path(python).exists():
        return False
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('ptychi') else 1)"
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="400 x 64² only")
    ap.add_argument("--cases", nargs="+", choices=list(CASES), help="default: all")
    ap.add_argument("--fields", nargs="+", choices=("far", "near"), default=["far", "near"])
    ap.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, nargs="+", default=None,
                    help="rPIE/LSQ-ML batch sizes, each run in turn (default: the engine's, "
                         "by scan size); a case's objects are scored side by side")
    ap.add_argument("--ptychi-python", type=Path, default=PEER_PYTHON)
    ap.add_argument("--json", action="store_true", help="one JSON line per case on stdout")
    ap.add_argument("--launch-us", type=float, default=LAUNCH_SECONDS * 1e6,
                    help="assumed host cost of a kernel launch, µs (default 7.5)")
    ap.add_argument("--model-gbs", type=float, default=MODEL_BANDWIDTH / 1e9,
                    help="the model's bandwidth on the CPU, GB/s (default 3000: an H100)")
    ap.add_argument("--sites", type=int, default=0, metavar="N",
                    help="also print the N engine lines that move the most bytes on the "
                         "stand-in (one line each: site, launches, passes)")
    ap.add_argument("--no-launches", action="store_true",
                    help="do not count launches on the stand-in (it costs a CPU iteration)")
    ap.add_argument("--scan-cache", type=Path, default=None, metavar="DIR",
                    help="keep simulated scans in DIR and reuse them (docstring)")
    ap.add_argument("--simulate-only", action="store_true",
                    help="only fill --scan-cache with the selected scans; no device")
    ap.add_argument("--skip-beamflow", action="store_true",
                    help="run only Pty-Chi (from beamflow's probe guess and batch size)")
    ap.add_argument("--score-workers", type=int, default=0, metavar="N",
                    help="score a case's objects (NRMSE) in N processes side by side "
                         "(default: one after another, in this process)")
    ap.add_argument("--no-score", action="store_true",
                    help="time only: no NRMSE (scoring 10000 x 256² costs a core ~70 s)")
    ap.add_argument("--no-graphs", action="store_true",
                    help="GPU: every launch from Python (no CUDA graphs of the batches)")
    args = ap.parse_args()
    names = args.cases or (list(QUICK) if args.quick else list(CASES))
    if args.simulate_only:
        if args.scan_cache is None:
            ap.error("--simulate-only needs --scan-cache DIR")
        for name in names:
            for field in args.fields:
                cached_scan(args.scan_cache, field, *CASES[name], args.seed)
        return

    backend = array_backend(args.device, graphs=not args.no_graphs)
    bandwidth = copy_bandwidth(backend)
    device = _describe(backend)
    log(f"{device}: copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    per_launch, per_fft = launch_cost(backend), fft_cost(backend)
    with_ptychi = ptychi_available(args.ptychi_python)
    if not with_ptychi:
        _emit(args, {"engine": "ptychi", "skipped": f"no Pty-Chi at {args.ptychi_python}"})
    for name in names:
        n, m = CASES[name]
        for field in args.fields:
            case = cached_scan(args.scan_cache, field, n, m, args.seed)
            common = {"field": field, "positions": n, "frame": m, "device": device,
                      "copy_gbs": bandwidth / 1e9}
            if per_launch is not None:
                common["measured_launch_us"] = per_launch * 1e6
            if per_fft is not None:
                common["measured_fft_us"] = per_fft * 1e6
            probe, batch = None, (args.batch or [32])[0]
            done: list[tuple[dict[str, Any], np.ndarray]] = []  # records to score, objects
            for algorithm in args.algorithms:
                if args.skip_beamflow:  # Pty-Chi alone: its probe guess and batch size
                    data, params = _setup(case, algorithm, 1, args,
                                          (args.batch or [None])[0])
                    probe = start(case, data, params).probe
                    if algorithm in ("rpie", "lsqml"):
                        batch = params.batch_size_for(n)
                    continue
                sizes = args.batch if algorithm in ("rpie", "lsqml") and args.batch else [None]
                for size in sizes:
                    log(f"beamflow {algorithm} {field} {n} x {m}²")
                    r = run_beamflow(case, algorithm, backend, args, size)
                    probe = r.pop("probe")
                    if algorithm in ("rpie", "lsqml"):
                        batch = r["batch_size"]
                    done.append(_beamflow_record(case, algorithm, field, r, common,
                                                 bandwidth, backend, args, size))
            peers = [a for a in args.algorithms if a in PTYCHI_ALGORITHMS]
            if with_ptychi and field == "far" and peers and probe is not None:
                for rec in run_ptychi(case, probe, peers, batch, args, f"{name}_{field}"):
                    nbytes = bytes_per_iteration(rec["algorithm"], False, n, m, 1, 4)
                    log(f"ptychi {rec['algorithm']} {field} {n} x {m}²: "
                        f"{rec['seconds_per_iteration']:.4g} s/iteration, batch {batch}")
                    done.append(({"engine": "ptychi", "algorithm": rec["algorithm"], **common,
                                  "seconds_per_iteration": rec["seconds_per_iteration"],
                                  "batch_size": batch, "floor_seconds": nbytes / bandwidth,
                                  "floor_ratio": rec["seconds_per_iteration"] * bandwidth
                                  / nbytes}, rec["object"]))
            scores = (score([obj for _, obj in done], case, args.score_workers)
                      if not args.no_score else [None] * len(done))
            for (record, _), value in zip(done, scores, strict=True):
                _emit(args, {**record, "nrmse": value})


def _beamflow_record(case: dict[str, Any], algorithm: str, field: str, r: dict[str, Any],
                     common: dict[str, Any], bandwidth: float, backend: ArrayBackend,
                     args: argparse.Namespace, batch: int | None
                     ) -> tuple[dict[str, Any], np.ndarray]:
    """A timed run's JSON record (the floor, the stand-in's launch model) and its object."""
    n, m = common["positions"], common["frame"]
    nbytes = bytes_per_iteration(algorithm, field == "near", n, m, 1, r.pop("frame_bytes"))
    floor = nbytes / bandwidth
    if not args.no_launches:
        launches, counted, ffts = count_launches(case, algorithm, args, batch)
        launch_s = launches * args.launch_us * 1e-6
        model_bw = bandwidth if backend.is_gpu else args.model_gbs * 1e9
        r.update(launches_per_iteration=launches, ffts_per_iteration=ffts,
                 launch_us=args.launch_us,
                 launch_seconds=launch_s, launch_ratio=launch_s / floor,
                 counted_bytes_per_iteration=counted,
                 counted_passes=counted / (8 * n * m * m),
                 model_gbs=model_bw / 1e9,
                 model_seconds=model_seconds(launches, counted, model_bw,
                                             args.launch_us * 1e-6))
    obj = r.pop("object")
    # In the log at once: the timing survives a step killed while scoring.
    log(f"beamflow {algorithm} {field} {n} x {m}²: "
        f"{r['seconds_per_iteration']:.4g} s/iteration, batch {r['batch_size']}, "
        f"{r['graph_replays']} graph replays")
    return ({"engine": "beamflow", "algorithm": algorithm, **common, **r,
             "bytes_per_iteration": nbytes, "floor_seconds": floor,
             "floor_ratio": r["seconds_per_iteration"] / floor}, obj)


def _describe(backend: ArrayBackend) -> str:
    if backend.is_gpu:
        cp = backend.xp
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"]
        return (name.decode() if isinstance(name, bytes) else str(name)) + f" ({backend.name})"
    return f"{platform.processor() or platform.machine()} CPU, {backend.threads} threads"


def _emit(args: argparse.Namespace, record: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(record), flush=True)
    else:
        log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in record.items()))


if __name__ == "__main__":
    main()
