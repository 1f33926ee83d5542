"""The engine against the memory floor of the device: seconds per iteration of every algorithm
on simulated far- and near-field scans, beside what moving the bytes alone would take.

Run from the repository root with the project's interpreter::

    .venv/bin/python benchmarks/bench_gpu.py --device cuda --json          # all cases
    .venv/bin/python benchmarks/bench_gpu.py --device cpu --quick --json   # 400 x 64² only

Cases: far- and near-field scans of 400 positions × 64², 4000 × 128² and 10000 × 256²
(``--quick``: 400 × 64²; ``--cases 4000x128`` picks; 16384 × 128² only when named), each
with every algorithm (ePIE, rPIE, DM, LSQ-ML; ``--algorithms`` picks). Scans come from
``beamflow.simulate`` (Poisson counts, dead and hot pixels masked, sub-pixel positions);
every reconstruction, beamflow's and
Pty-Chi's, starts from the true probe defocused to NRMSE 0.6 (``bench_ptychi.py``'s guess, as
in the issue's NRMSE figures). From the engine's own guess (``probe_from_data``) these far-field
scans stagnate: object NRMSE 0.40, phase NRMSE 1.06 after 100 rPIE iterations at 400 × 64²
(0.012 from the true probe), so its NRMSE said nothing of the GPU path.

Probe modes and thick samples: ``--modes K`` reconstructs K incoherent probe modes (the
scan's probe is one mode; ``initial_state`` makes the others). ``--slices S`` reconstructs
S object layers ``--slice-spacing M`` metres apart (one value, or S−1 comma-separated) from
a thick scan of S layers (``beamflow.simulate.make_ground_truth(slices=S, …)``: an exact
multislice on windows twice the frame, not the engine's model). Several values
(``--slices 1 2 3 6``), each from its own scan, run side by side: one reconstruction of
each, their iterations alternated (one of each in turn, the order reversed every other
iteration), so that a shared machine's load, which drifts over minutes, falls on each
alike. With 1 among them, one line per algorithm and layer count S > 1
(``"metric": "layers_over_one_layer"``) gives the median and quartiles of the ratios of S
layers' iteration to the one-layer iteration taken next to it (``ratio_median``,
``ratio_quartiles``, ``ratio_per_layer``: the issue's target is ≤ 1.3·S, 1.3 a layer), and
the same of the host's CPU time (``cpu_ratio_…``: on a shared, loaded CPU the steadier
figure; a run that waits for a core costs wall time, not CPU time). DM does not model
layers: its thick cases are skipped with a line saying so. The issue's two thick cases::

    --cases 4000x128 --slices 3 --slice-spacing 1e-4
    --cases 16384x128 --modes 6 --slices 6 --slice-spacing 1e-4 --batch 1024 --thin-frames

(1e-4 m at 128² — 29.4 nm pixels at 8.8 keV — is 16 depths of field, Δx²/λ, as 4e-4 m is
at 64²: the issue's two-layer sample; the second is the published cross-package case, at
PtyRAD's, PtychoShelves' and py4DSTEM's batch of 1024.) The exact simulation costs the host
~19 ms a position and layer at 128² (measured on a loaded 2-core machine: 4000 × 3 layers
~4 min, 16384 × 6 layers ~30 min — it propagates every position through the layers twice,
once for the probe's scale and once for the frames), so ``--thin-frames`` gives a thick
case, for speed only, the thin scan of the same size instead: S layers reconstructed from a
thin sample's frames (its truth is the projection, layers 2…S empty). An iteration's work
does not depend on what the frames hold, so it times the same; it is scored by the
projection alone. Each line carries ``slices``, ``modes``, ``slice_spacing_m`` (the S−1
spacings) and ``thin_frames``; a thick line's ``nrmse`` is that of the projection (the
product of the layers), beside ``projection_nrmse``, ``layer_nrmse`` and
``cutoff_cycles_per_px`` (``beamflow.ground_truth.score_layers``: each layer above the
frequency its spacing separates; null with ``--thin-frames``).

Simulating a scan costs the host more than timing it on a card (10000 × 256²: about 70 s
on one core, mostly Poisson draws that hold the GIL). ``--scan-cache DIR`` keeps each
simulated scan there (``{field}_{N}x{M}_seed{S}_frames.npy``, ``_region.npy`` and
``_ground_truth.h5``; a thick scan ``{field}_{N}x{M}_{L}layers_{spacings}m_seed{S}_…``;
written under temporary names and renamed, the ground truth last) and
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
of the (N, K, M, M) complex64 stack of a scan (8·N·K·M² bytes; K probe modes), or of the
(N, M, M) complex64 windows of one object layer (8·N·M²: patches and object terms are per
position, not per mode; for K = 1 the two are the same size) — plus one read of the frames
in the dtype the engine keeps them (float32 amplitudes, or uint16 counts on a GPU):

=============================  =====  ======  ================================================
step                           stack  window  what is read or written
=============================  =====  ======  ================================================
object patches O_j                        1   write the gathered windows (object reads hit
                                              the cache)
sub-pixel shifted probe P_j        3          write ramp × spectrum, inverse FFT (r + w)
exit wave ψ = P_j·O_j              2      1   read P_j and O_j, write ψ
FFT to the detector                2          read + write
modulus constraint                 2          read Ψ, write the correction (+ the frames)
FFT to the sample                  2          read + write
object terms conj(P_j)·χ           2      1   read P_j and χ, scatter-add
probe terms conj(O_j)·χ            2      1   read O_j and χ, write
probe adjoint FFT (sub-pixel)      2          read + write
=============================  =====  ======  ================================================

PIE (ePIE, rPIE): the 17 + 4 = 21 passes above. LSQ-ML: + 12 + 3 = 15 (keep P_j, O_j, χ:
2 + 1; shift ΔP: 3; P_j·ΔO_j and O_j·ΔP_j: 4 + 2; the five dot products of the step-length
systems, fused: 3) = 29 + 7 = 36. DM: 25 + 5 = 30 (the forward model's 7 + 2; read and write
the stored exit waves: 2; modulus of 2Φ−Ψ: 3 + 2; to the sample: 2; object terms: 2 + 1;
the probe pass: read Ψ, FFT, gather, terms, adjoint FFT: 7 + 2). Near field: + 12 stack
passes (to the detector and back, each an extra FFT pair and a propagator product:
2 × (4 + 2)).

Each object layer after the first (``beamflow/ptycho/forward/multislice.py``; the detector's
propagation stays one, behind the last layer):

=================================================  =====  ======  ============================
step, per extra layer s                            stack  window  what is read or written
=================================================  =====  ======  ============================
forward: propagate e_{s−1} to ψ_s (FFT, ×H, FFT⁻¹)     6          read + write each
forward: patches O_s and e_s = ψ_s·O_s                 2      2   write O_s; read ψ_s and
                                                                  O_s, write e_s
backward: Δψ_s = conj(O_s)·χ_s                         2      3   conj(O_s) (r + w); read it
                                                                  and χ_s, write Δψ_s
backward: propagate Δψ_s back (FFT, ×conj(H), FFT⁻¹)   6          read + write each
object terms conj(ψ_s)·χ_s (own illumination)         2      1   read ψ_s and χ_s,
                                                                  scatter-add
LSQ-ML: the layer's step-length system                 2      1   read ψ_s, ΔO_s and χ_s
=================================================  =====  ======  ============================

PIE: + 18 + 6 = 24 passes a layer; LSQ-ML: + 20 + 7 = 27 (the kept ψ_s, O_s and χ_s are
the forward's own arrays: no extra pass). Object- and probe-sized traffic is left out
(small beside the stacks). So for rPIE at 4000 × 128² far field: 21 × 0.52 GB + 0.13 GB of
uint16 frames = 11.1 GB, 3.7 ms at an H100's ~3 TB/s; with 3 layers 69 passes, 36.3 GB; and
LSQ-ML at 16384 × 128² with 6 modes and 6 layers: 6·(29 + 5·20) + 7 + 5·7 = 816 passes of
2.15 GB + 0.54 GB = 1.75 TB, 0.58 s.

Pty-Chi side by side: when an interpreter with Pty-Chi is there (``--ptychi-python``,
default ``benchmarks/.peers/venv/bin/python`` as built by ``bench_ptychi.py``), the far-field
ePIE, rPIE and LSQ-ML cases also run in Pty-Chi on the same device, frames, probe guess and
batch size (``benchmarks/ptychi_runner.py --device``), one line each with
``"engine": "ptychi"``. Without it (or with ``--no-ptychi``), one line says it was skipped.
``--skip-beamflow`` runs Pty-Chi alone (beamflow's lines taken earlier, with the same
arguments). Thick cases run Pty-Chi's multislice model with the same spacings, and its
probe modes from the same K-mode guess.

Launches: a kernel launch costs the host ~5-10 µs (CuPy's Python side and the CUDA launch)
whatever the kernel's size, so an iteration that launches more kernels than its bytes take
to move is launch-bound, whatever the card. ``launches_per_iteration`` counts them on the
counting stand-in for CuPy (``tests/kits/counting_cupy.py``: the engine's GPU code path on numpy
memory; an iteration after one warm-up, the same batches as the timed run), on any
machine; ``launch_seconds`` is that count times an assumed :data:`LAUNCH_SECONDS` (7.5 µs,
the middle of CuPy's 5-10 µs on a current CPU — measure it on the GPU host and pass
``--launch-us``; on a GPU ``measured_launch_us`` gives the host cost of a tiny in-place
kernel there), ``launch_ratio`` that over ``floor_seconds``: above 1 the case is
launch-bound before it is memory-bound. The stand-in runs the iteration's arithmetic in
numpy on one thread (seconds at 4000 × 128², minutes at 10000 × 256²); ``--no-launches``
skips it. The fused kernels (``beamflow/ptycho/gpu/kernels.py``) run there as their numpy
references (``tests/kits/reference_kernels.py``), each counted as the one launch it is on CuPy
(the modulus kernel two: it and its sum). What it counts differs from CuPy in small ways:
CuPy's allocations (``zeros``) are not counted and its ``broadcast_to`` (a view) is.
An FFT costs the host more than a plain launch (CuPy's argument checks and plan lookup in
Python): ``ffts_per_iteration`` counts the FFTs among the launches, and on a GPU
``measured_fft_us`` is the host cost of one engine FFT on a small stack, so the host's time
per iteration is about launches × ``measured_launch_us`` + FFTs × (``measured_fft_us`` −
``measured_launch_us``), to set beside ``seconds_per_iteration``.

Counted traffic and the model: the stand-in also counts the bytes each kernel reads and
writes in device memory (``tests/kits/counting_cupy.py`` says how), so the engine's own traffic
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
``frame``, ``device``, ``iterations``, ``seconds_per_iteration``,
``cpu_seconds_per_iteration`` (the host's CPU time, all threads, median), ``floor_seconds``,
``floor_ratio`` (seconds / floor), ``bytes_per_iteration``, ``copy_gbs``, ``nrmse``
(complex NRMSE of the object against the truth over the well-lit region; of the projection
for layers), ``final_loss``, ``launches_per_iteration``, ``ffts_per_iteration``,
``launch_us`` (the assumed cost), ``launch_seconds``, on a GPU ``measured_launch_us`` and
``measured_fft_us``, ``launch_ratio``, ``counted_bytes_per_iteration``, ``counted_passes``
(in passes of the (N, K, M, M) stack), ``model_gbs``, ``model_seconds``, ``batch_size``,
``slices``, ``modes``, ``slice_spacing_m``, ``thin_frames`` and ``load_avg_1min``; thick
cases add ``projection_nrmse``, ``layer_nrmse`` and
``cutoff_cycles_per_px``. A case's objects are scored (``nrmse``) after all its
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
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, nullcontext
from itertools import repeat
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "kits"))  # the counting stand-in for CuPy

from beamflow.atomic import atomic_path  # noqa: E402
from beamflow.ground_truth import (  # noqa: E402
    read_ground_truth,
    score_layers,
    write_ground_truth,
)
from beamflow.ptycho import (  # noqa: E402
    ArrayBackend,
    PtychoData,
    ReconParams,
    Reconstructor,
    array_backend,
    initial_state,
)
from beamflow.ptycho.forward.propagation import Propagation  # noqa: E402
from beamflow.ptycho.forward.slices import slice_spacings  # noqa: E402
from beamflow.ptycho.quality.metrics import compare, illumination_mask  # noqa: E402

CASES = {"400x64": (400, 64), "4000x128": (4000, 128), "10000x256": (10000, 256),
         "16384x128": (16384, 128)}
DEFAULT_CASES = ("400x64", "4000x128", "10000x256")  # 16384 × 128²: only when named
QUICK = ("400x64",)
ALGORITHMS = ("epie", "rpie", "dm", "lsqml")
PTYCHI_ALGORITHMS = ("epie", "rpie", "lsqml")
PEER_PYTHON = ROOT / "benchmarks" / ".peers" / "venv" / "bin" / "python"
RESULTS = ROOT / "benchmarks" / "results" / "gpu"

# Passes per iteration (see the module docstring's tables): (over the (N, K, M, M) stack,
# over the (N, M, M) windows of a layer). PIE: patches 0+1, shifted probe 3+0, exit wave
# 2+1, to the detector 2, modulus 2, to the sample 2, object terms 2+1, probe terms 2+1,
# probe adjoint FFT 2.
PIE_PASSES = (3 + 2 + 2 + 2 + 2 + 2 + 2 + 2, 1 + 1 + 1 + 1)
PASSES = {"epie": PIE_PASSES, "rpie": PIE_PASSES, "lsqml": (PIE_PASSES[0] + 12, PIE_PASSES[1] + 3),
          "dm": (25, 5)}
NEAR_FIELD_PASSES = (12, 0)
# Each layer after the first: propagation 6+0, patches and exit wave 2+2, back: conj(O)·χ
# 2+3, propagation 6+0, object terms 2+1; LSQ-ML its step-length system 2+1.
LAYER_PASSES = {"epie": (18, 6), "rpie": (18, 6), "lsqml": (20, 7)}
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
                        frame_bytes: int, slices: int = 1) -> int:
    """The floor model: bytes an iteration must move at least (the module docstring)."""
    stack, window = PASSES[algorithm]
    if near:
        stack, window = stack + NEAR_FIELD_PASSES[0], window + NEAR_FIELD_PASSES[1]
    if slices > 1:
        extra = LAYER_PASSES[algorithm]  # DM has no layers: a KeyError, never a floor
        stack, window = stack + (slices - 1) * extra[0], window + (slices - 1) * extra[1]
    return (stack * modes + window) * n * m * m * 8 + n * m * m * frame_bytes


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


def cached_scan(cache: Path | None, field: str, n: int, m: int, seed: int, slices: int = 1,
                spacings: tuple[float, ...] = ()) -> dict[str, Any]:
    """The case's simulated scan (a thick sample of ``slices`` layers ``spacings`` apart),
    from ``cache`` when it holds it (all three files), else simulated now and, with a
    ``cache``, stored there for the next invocation."""
    if cache is None:
        return simulate(field, n, m, seed, slices, spacings)
    layers = ""
    if slices > 1:
        layers = f"_{slices}layers_{'-'.join(f'{v:g}' for v in spacings)}m"
    stem = cache / f"{field}_{n}x{m}{layers}_seed{seed}"
    frames_path = stem.with_name(stem.name + "_frames.npy")
    region_path = stem.with_name(stem.name + "_region.npy")
    gt_path = stem.with_name(stem.name + "_ground_truth.h5")
    if frames_path.exists() and region_path.exists() and gt_path.exists():
        log(f"loading {field} field {n} x {m}² from {stem}_*")
        return {"gt": read_ground_truth(gt_path), "frames": np.load(frames_path),
                "region": np.load(region_path)}
    case = simulate(field, n, m, seed, slices, spacings)
    cache.mkdir(parents=True, exist_ok=True)
    # The ground truth last: a reader needs all three, so a step killed before it leaves a
    # scan that is simulated again, never half of one. No pickle: arrays and the simulator's
    # own ground-truth file.
    for path, array in ((frames_path, case["frames"]), (region_path, case["region"])):
        with atomic_path(path, durable=False) as tmp, open(tmp, "wb") as f:
            np.save(f, array)
    write_ground_truth(gt_path, case["gt"])
    return case


def simulate(field: str, n: int, m: int, seed: int, slices: int = 1,
             spacings: tuple[float, ...] = ()) -> dict[str, Any]:
    apart = ", ".join(f"{v:g}" for v in spacings)
    log(f"simulating {field} field {n} x {m}²"
        + (f", {slices} layers {apart} m apart" if slices > 1 else ""))
    from beamflow.simulate import (  # noqa: PLC0415
        detector_frames,
        make_ground_truth,
        make_near_field_ground_truth,
    )

    layers = {"slices": slices, "slice_spacing_m": list(spacings)} if slices > 1 else {}
    if field == "near":
        gt = make_near_field_ground_truth(positions=n, probe_size=m, photons=1e7, seed=seed,
                                          **layers)
    else:
        gt = make_ground_truth(positions=n, probe_size=m, photons=1e6, seed=seed, **layers)
    frames = np.empty((gt.n_positions, m, m), np.float32)
    for s in range(0, gt.n_positions, 256):  # bounded temporaries at 10000 × 256²
        e = min(s + 256, gt.n_positions)
        frames[s:e] = detector_frames(gt, s, e, np.random.default_rng(seed + 1 + s))
    return {"gt": gt, "frames": frames,
            "region": illumination_mask(gt.layers.shape[1:], gt.probe, gt.positions_px,
                                        fraction=0.3)}


def load_case(cache: Path | None, field: str, n: int, m: int, seed: int, slices: int = 1,
              spacings: tuple[float, ...] = (), thin_frames: bool = False) -> dict[str, Any]:
    """A case to reconstruct with ``slices`` object layers ``spacings`` apart: the scan of a
    sample of as many layers (:func:`cached_scan`) or, with ``thin_frames``, the thin scan
    of that size (speed only: the module docstring). The case holds the scan's ``gt``,
    ``frames`` and ``region``, and the reconstruction's ``slices`` and ``spacings``."""
    thin = thin_frames or slices == 1
    scan = cached_scan(cache, field, n, m, seed, 1 if thin else slices, () if thin else spacings)
    return {**scan, "slices": slices, "spacings": tuple(spacings) if slices > 1 else (),
            "thin_frames": thin_frames and slices > 1}


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
    """The engine's inputs for the case (its layers; ``args.modes`` probe modes); ``batch``
    (rPIE/LSQ-ML; default: the engine's by scan size) overrides ``args.batch`` where that
    is one number (profile_gpu.py's)."""
    gt = case["gt"]
    if batch is None and isinstance(args.batch, int):
        batch = args.batch
    slices = case.get("slices", 1)
    propagation, layers = gt.propagation, {}
    if slices > 1:  # the layers are propagated on the object grid: its pixel and wavelength
        if not propagation.near_field:
            propagation = Propagation(wavelength_m=gt.geometry.wavelength_m,
                                      pixel_size_m=gt.object_pixel_size_m)
        layers = {"slices": slices, "slice_spacing_m": list(case["spacings"])}
    data = PtychoData(intensities=case["frames"], positions_px=gt.positions_px,
                      object_shape=gt.layers.shape[1:], mask=gt.mask)
    params = ReconParams(algorithm=algorithm, iterations=iterations,
                         propagation=propagation, seed=args.seed,
                         probe_modes=getattr(args, "modes", 1),
                         batch_size=batch if algorithm in ("rpie", "lsqml") else None,
                         **layers)
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


def run_beamflow(cases: dict[int, dict[str, Any]], algorithm: str, backend: ArrayBackend,
                 args: argparse.Namespace, batch: int | None = None
                 ) -> dict[int, dict[str, Any]]:
    """Timed runs of ``algorithm`` on each case (layer count → case). Several run side by
    side, their iterations alternated — one of each in turn, the order reversed every other
    iteration — so that the load of a shared machine falls on each alike. Per case: the
    median wall and CPU seconds of the timed iterations, and each one's in ``walls`` and
    ``cpus`` (the pairs of the ratios)."""
    with ExitStack() as stack:
        runs = {}
        for slices, case in cases.items():
            data, params = _setup(case, algorithm, args.warmup + args.iterations, args, batch)
            state = start(case, data, params)
            runs[slices] = (stack.enter_context(Reconstructor(data, state, backend)), params,
                            state)
        walls: dict[int, list[float]] = {s: [] for s in cases}
        cpus: dict[int, list[float]] = {s: [] for s in cases}  # all threads: the work done
        order = list(cases)
        for it in range(args.warmup + args.iterations):
            for slices in order if it % 2 == 0 else order[::-1]:
                rec = runs[slices][0]
                t, c = time.perf_counter(), time.process_time()
                rec.iterate()
                backend.synchronize()
                walls[slices].append(time.perf_counter() - t)
                cpus[slices].append(time.process_time() - c)
        out = {}
        for slices, (rec, params, state) in runs.items():
            final = rec.snapshot()
            graphs = rec.algorithm.graphs
            wall = walls[slices][args.warmup:] or walls[slices]
            cpu = cpus[slices][args.warmup:] or cpus[slices]
            out[slices] = {
                "seconds_per_iteration": float(np.median(wall)),
                "cpu_seconds_per_iteration": float(np.median(cpu)),
                "first_iteration_seconds": walls[slices][0],
                "frame_bytes": rec.core.frames.data.dtype.itemsize,
                "final_loss": final.loss_history[-1],
                "graph_replays": 0 if graphs is None else graphs.replays,
                "iterations": len(wall),
                "batch_size": params.batch_size_for(len(cases[slices]["frames"])),
                "probe": state.probe, "object": final.object, "walls": wall, "cpus": cpu}
    return out


def scores(obj: np.ndarray, truth: np.ndarray, region: np.ndarray,
           spacings: tuple[float, ...], wavelength_m: float, pixel_size_m: float
           ) -> dict[str, Any]:
    """The scores of one object (H, W) or layers (S, H, W) against the truth over
    ``region``: ``nrmse`` (complex NRMSE; of the projection for layers) and, for layers of a
    truth of as many layers, ``projection_nrmse``, ``layer_nrmse`` and
    ``cutoff_cycles_per_px`` (:func:`beamflow.ground_truth.score_layers`). Layers against a
    thin truth (``--thin-frames``): their projection against it, the rest null."""
    if obj.ndim == 2 or truth.ndim == 2:
        projection = obj if obj.ndim == 2 else np.prod(obj, axis=0, dtype=np.complex64)
        value = float(compare(projection, truth, region).nrmse)
        if obj.ndim == 2:
            return {"nrmse": value}
        return {"nrmse": value, "projection_nrmse": value, "layer_nrmse": None,
                "cutoff_cycles_per_px": None}
    layers = score_layers(obj, truth, spacings, wavelength_m, pixel_size_m, region)
    return {"nrmse": layers.projection_nrmse, **layers.as_dict()}


def score(objects: list[np.ndarray], case: dict[str, Any], workers: int
          ) -> list[dict[str, Any]]:
    """The scores (:func:`scores`) of each finished object against the case's truth, after
    its timed runs.

    ``compare`` (sub-pixel registration, ramp fit) costs the host ~9 s at 4000 × 128² and
    ~70 s at 10000 × 256² on one core, more than the timed iterations on a card: with
    ``workers`` > 1 the objects are scored side by side in processes of their own (spawned:
    the parent may hold a CUDA context), never beside a timed iteration."""
    gt = case["gt"]
    truth = (case["region"], tuple(gt.object_layer_spacing_m), gt.geometry.wavelength_m,
             gt.object_pixel_size_m)
    if workers <= 1 or len(objects) <= 1:
        return [scores(obj, gt.object, *truth) for obj in objects]
    with ProcessPoolExecutor(min(workers, len(objects)), mp_context=get_context("spawn")) as pool:
        return list(pool.map(scores, objects, repeat(gt.object),
                             *(repeat(v) for v in truth)))


def run_ptychi(case: dict[str, Any], probe: np.ndarray, algorithms: list[str], batch: int,
               args: argparse.Namespace, name: str) -> list[dict[str, Any]]:
    """Pty-Chi on the same frames, probe guess and batch size as beamflow's rPIE/LSQ-ML
    (bench_ptychi.py's data format)."""
    gt = case["gt"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    data_path = RESULTS / f"{name}.npz"
    # Pty-Chi takes the probe's modes from its shape, and layers from the spacings.
    np.savez(data_path, intensities=case["frames"], mask=gt.mask,
             corners_px=gt.positions_px.astype(np.float64),
             object_shape=np.array(gt.layers.shape[1:]), probe=probe.astype(np.complex64),
             wavelength_m=gt.geometry.wavelength_m, pixel_size_m=gt.object_pixel_size_m,
             slice_spacings_m=np.array(case.get("spacings", ()), np.float64))
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="400 x 64² only")
    ap.add_argument("--cases", nargs="+", choices=list(CASES),
                    help=f"default: {' '.join(DEFAULT_CASES)}")
    ap.add_argument("--fields", nargs="+", choices=("far", "near"), default=["far", "near"])
    ap.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, nargs="+", default=None,
                    help="rPIE/LSQ-ML batch sizes, each run in turn (default: the engine's, "
                         "by scan size); a case's objects are scored side by side")
    ap.add_argument("--modes", type=int, default=1, metavar="K", help="probe modes")
    ap.add_argument("--slices", type=int, nargs="+", default=[1], metavar="S",
                    help="object layers, each in turn from a scan of as many (docstring)")
    ap.add_argument("--slice-spacing", default=None, metavar="M",
                    help="metres between the layers: one value, or S−1 comma-separated")
    ap.add_argument("--thin-frames", action="store_true",
                    help="speed only: layers reconstructed from the thin scan's frames")
    ap.add_argument("--ptychi-python", type=Path, default=PEER_PYTHON)
    ap.add_argument("--no-ptychi", action="store_true",
                    help="beamflow alone, even where an interpreter with Pty-Chi is there")
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
    args = ap.parse_args(argv)
    if args.modes < 1:
        ap.error(f"--modes must be ≥ 1, got {args.modes}")
    if len(set(args.slices)) != len(args.slices):
        ap.error(f"--slices: each layer count once, got {args.slices}")
    try:
        args.spacings = {s: slice_spacings(s, args.slice_spacing if s > 1 else None)
                         for s in args.slices}
    except ValueError as exc:
        ap.error(f"--slices/--slice-spacing: {exc}")
    if args.simulate_only and args.scan_cache is None:
        ap.error("--simulate-only needs --scan-cache DIR")
    if args.thin_frames and max(args.slices) == 1:
        ap.error("--thin-frames: for layers (--slices S > 1) only")
    return args


def main() -> None:
    args = parse_args()
    names = args.cases or list(QUICK if args.quick else DEFAULT_CASES)
    if args.simulate_only:
        for name in names:
            for field in args.fields:
                for slices in args.slices:
                    load_case(args.scan_cache, field, *CASES[name], args.seed, slices,
                              args.spacings[slices], args.thin_frames)
        return

    backend = array_backend(args.device, graphs=not args.no_graphs)
    bandwidth = copy_bandwidth(backend)
    device = _describe(backend)
    log(f"{device}: copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    per_launch, per_fft = launch_cost(backend), fft_cost(backend)
    with_ptychi = not args.no_ptychi and ptychi_available(args.ptychi_python)
    if not with_ptychi:
        _emit(args, {"engine": "ptychi", "skipped": "--no-ptychi" if args.no_ptychi
                     else f"no Pty-Chi at {args.ptychi_python}"})
    measured = {}
    if per_launch is not None:
        measured["measured_launch_us"] = per_launch * 1e6
    if per_fft is not None:
        measured["measured_fft_us"] = per_fft * 1e6
    for name in names:
        n, m = CASES[name]
        for field in args.fields:
            cases = {s: load_case(args.scan_cache, field, n, m, args.seed, s,
                                  args.spacings[s], args.thin_frames) for s in args.slices}
            commons = {s: {"field": field, "positions": n, "frame": m, "device": device,
                           "copy_gbs": bandwidth / 1e9, **measured, "slices": s,
                           "modes": args.modes, "slice_spacing_m": list(args.spacings[s]),
                           "thin_frames": cases[s]["thin_frames"]} for s in args.slices}
            run_case(cases, commons, backend, bandwidth, with_ptychi, args)


def run_case(cases: dict[int, dict[str, Any]], commons: dict[int, dict[str, Any]],
             backend: ArrayBackend, bandwidth: float, with_ptychi: bool,
             args: argparse.Namespace) -> None:
    """One case and field for each layer count (``cases``: S → the case): beamflow's timed
    runs (the layer counts side by side, :func:`run_beamflow`), Pty-Chi's, the scores, the
    lines, the layers' ratios."""
    done: dict[int, list[tuple[dict[str, Any], np.ndarray]]] = {s: [] for s in cases}
    ratios: list[dict[str, Any]] = []
    probes: dict[int, np.ndarray] = {}
    batches: dict[int, int] = {}
    for algorithm in args.algorithms:
        todo = dict(cases)
        if algorithm == "dm":
            for slices in [s for s in cases if s > 1]:
                _emit(args, {"engine": "beamflow", "algorithm": "dm", **commons[slices],
                             "skipped": "DM does not model layers"})
                del todo[slices]
        if args.skip_beamflow:  # Pty-Chi alone: its probe guess and batch size
            for slices, case in todo.items():
                data, params = _setup(case, algorithm, 1, args, (args.batch or [None])[0])
                probes[slices] = start(case, data, params).probe
                if algorithm in ("rpie", "lsqml"):
                    batches[slices] = params.batch_size_for(len(case["frames"]))
            continue
        sizes = args.batch if algorithm in ("rpie", "lsqml") and args.batch else [None]
        for size in sizes if todo else []:
            common = commons[next(iter(todo))]
            log(f"beamflow {algorithm} {common['field']} {common['positions']} x "
                f"{common['frame']}², {args.modes} mode(s), layers {' '.join(map(str, todo))}"
                + (" side by side" if len(todo) > 1 else ""))
            results = run_beamflow(todo, algorithm, backend, args, size)
            ratios += [_layer_ratio(algorithm, size, slices, r, results[1], commons[slices],
                                    args) for slices, r in results.items()
                       if slices > 1 and 1 in results]
            for slices, r in results.items():
                probes[slices] = r.pop("probe")
                if algorithm in ("rpie", "lsqml"):
                    batches[slices] = r["batch_size"]
                del r["walls"], r["cpus"]
                done[slices].append(_beamflow_record(todo[slices], algorithm, r,
                                                     commons[slices], bandwidth, backend,
                                                     args, size))
    peers = [a for a in args.algorithms if a in PTYCHI_ALGORITHMS]
    for slices, case in cases.items():
        common = commons[slices]
        n, m = common["positions"], common["frame"]
        if with_ptychi and common["field"] == "far" and peers and slices in probes:
            batch = batches.get(slices, (args.batch or [32])[0])
            stem = f"{n}x{m}_far_{slices}layers_{args.modes}modes"
            for rec in run_ptychi(case, probes[slices], peers, batch, args, stem):
                nbytes = bytes_per_iteration(rec["algorithm"], False, n, m, args.modes, 4,
                                             slices)
                log(f"ptychi {rec['algorithm']} far {n} x {m}², {slices} layer(s): "
                    f"{rec['seconds_per_iteration']:.4g} s/iteration, batch {batch}")
                done[slices].append(({"engine": "ptychi", "algorithm": rec["algorithm"],
                                      **common, "seconds_per_iteration":
                                      rec["seconds_per_iteration"], "batch_size": batch,
                                      "floor_seconds": nbytes / bandwidth,
                                      "floor_ratio": rec["seconds_per_iteration"] * bandwidth
                                      / nbytes, "load_avg_1min": _load()}, rec["object"]))
        objects = [obj for _, obj in done[slices]]
        values = (score(objects, case, args.score_workers) if not args.no_score
                  else [{"nrmse": None}] * len(objects))
        for (record, _), value in zip(done[slices], values, strict=True):
            _emit(args, {**record, **value})
    for record in ratios:
        _emit(args, record)


def _layer_ratio(algorithm: str, size: int | None, slices: int, run: dict[str, Any],
                 one: dict[str, Any], common: dict[str, Any], args: argparse.Namespace
                 ) -> dict[str, Any]:
    """The line of S layers' seconds per iteration (``run``) over one layer's (``one``): the
    median and quartiles of the ratios of iterations taken one right after the other (wall
    clock, and the host's CPU time)."""
    wall = np.array(run["walls"]) / np.array(one["walls"])
    cpu = np.array(run["cpus"]) / np.array(one["cpus"])
    return {"metric": "layers_over_one_layer", "engine": "beamflow", "algorithm": algorithm,
            "field": common["field"], "positions": common["positions"],
            "frame": common["frame"], "device": common["device"], "modes": args.modes,
            "slices": slices, "slice_spacing_m": common["slice_spacing_m"],
            "thin_frames": common["thin_frames"], "batch_size": size,
            "pairs": len(wall), "ratio_median": round(float(np.median(wall)), 3),
            "ratio_quartiles": [round(float(v), 3) for v in np.percentile(wall, [25, 75])],
            "ratio_per_layer": round(float(np.median(wall)) / slices, 3),
            "cpu_ratio_median": round(float(np.median(cpu)), 3),
            "cpu_ratio_quartiles": [round(float(v), 3) for v in np.percentile(cpu, [25, 75])],
            "cpu_ratio_per_layer": round(float(np.median(cpu)) / slices, 3),
            "target_per_layer": 1.3, "load_avg_1min": _load()}


def _load() -> float:
    """The host's 1-minute load average: a shared machine's other work slows a CPU run."""
    return round(os.getloadavg()[0], 2)


def _beamflow_record(case: dict[str, Any], algorithm: str, r: dict[str, Any],
                     common: dict[str, Any], bandwidth: float, backend: ArrayBackend,
                     args: argparse.Namespace, batch: int | None, count: bool = True
                     ) -> tuple[dict[str, Any], np.ndarray]:
    """A timed run's JSON record (the floor; with ``count``, the stand-in's launch model)
    and its object."""
    n, m, k, s = common["positions"], common["frame"], common["modes"], common["slices"]
    nbytes = bytes_per_iteration(algorithm, common["field"] == "near", n, m, k,
                                 r.pop("frame_bytes"), s)
    floor = nbytes / bandwidth
    if count and not args.no_launches:
        launches, counted, ffts = count_launches(case, algorithm, args, batch)
        launch_s = launches * args.launch_us * 1e-6
        model_bw = bandwidth if backend.is_gpu else args.model_gbs * 1e9
        r.update(launches_per_iteration=launches, ffts_per_iteration=ffts,
                 launch_us=args.launch_us,
                 launch_seconds=launch_s, launch_ratio=launch_s / floor,
                 counted_bytes_per_iteration=counted,
                 counted_passes=counted / (8 * n * k * m * m),
                 model_gbs=model_bw / 1e9,
                 model_seconds=model_seconds(launches, counted, model_bw,
                                             args.launch_us * 1e-6))
    obj = r.pop("object")
    # In the log at once: the timing survives a step killed while scoring.
    log(f"beamflow {algorithm} {common['field']} {n} x {m}², {s} layer(s): "
        f"{r['seconds_per_iteration']:.4g} s/iteration, batch {r['batch_size']}, "
        f"{r['graph_replays']} graph replays")
    return ({"engine": "beamflow", "algorithm": algorithm, **common, **r,
             "bytes_per_iteration": nbytes, "floor_seconds": floor,
             "floor_ratio": r["seconds_per_iteration"] / floor, "load_avg_1min": _load()},
            obj)


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
