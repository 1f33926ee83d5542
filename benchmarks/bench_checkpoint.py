"""Checkpoint overhead and the progressive-scan experiment (CPU). One JSON line per result.

Run from the repository root::

    .venv/bin/python benchmarks/bench_checkpoint.py [--positions 400] [--size 64]
        [--rounds 12] [--block 20] [--only overhead|placement|progressive|memory]

1. ``checkpoint_overhead`` — rPIE (one probe mode) on a simulated scan, checkpointing the
   complete state to a node-local L1 directory every iteration and every 10 iterations,
   against no checkpointing, side by side in one process: rounds of ``--block`` iterations
   per setting in a shuffled order (the writer drained between blocks, untimed), the wall
   time of every iteration measured callback to callback exactly as
   ``beamflow.job.iterate`` drives the engine (snapshot on the reconstruction thread,
   write in the background). Two measures:

   * CPU: (CPU time of the snapshots on the reconstruction thread + CPU time of the writer
     process) / CPU time of the iterations without checkpoints. What checkpointing takes
     from the reconstruction when every core is busy.
   * wall: mean iteration time with / without − 1, per round (median over rounds and pooled
     mean, with a 90 % bootstrap interval over rounds), beside an A/A control (no
     checkpoints vs no checkpoints) that shows the noise floor of the machine at the time.

   Targets: 5 % (every iteration), 1 % (every 10). Also reported: checkpoints actually
   committed (a due level whose writer is still busy is deferred, never queued).
   ``placement`` (``--only placement``): the same commits from a thread of this process and
   from a child process, one per iteration, against none: why the writer is a process.
2. ``progressive`` — the live-scan case: reconstruct the first half of a scan, then continue
   from that checkpoint with all frames (``run_reconstruction`` resuming a continuation),
   against a fresh reconstruction of all frames. Both start from the same probe guess (the
   true probe defocused to ``--guess-nrmse`` from the truth); NRMSE of every checkpoint
   (every iteration) against the truth. Reports, per NRMSE level (0.1, 0.05, and 5 % above
   what the fresh run converges to), the iterations on all frames a fresh run needs and
   those the continued one needs after its ``--half-iterations`` on the first half (also as
   totals and as full-iteration-equivalent cost). ``--batch 0``: the job's default batch
   size, chosen by frame count (so the first half runs with smaller batches than all
   frames), as ``beamflow reconstruct`` and flow runs do; default 32 for both phases.
3. ``reconstruct_peak_rss`` — peak RSS (the child's own VmHWM) of ``beamflow reconstruct``
   (a subprocess) on scans of ``--mem-positions`` frames (default 2000 and 8000 of 128²)
   against 2 × frames (float32) + object + probe, with the interpreter's own baseline (same
   imports, no data) reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from beamflow.checkpoint import Checkpointer, CheckpointPolicy, LevelConfig
from beamflow.checkpoint.store import list_checkpoints, read_checkpoint
from beamflow.formats import Product, load_scan
from beamflow.ground_truth import read_ground_truth, score_product
from beamflow.job.load import read_frames
from beamflow.job.models import ReconstructJob
from beamflow.job.run import run_reconstruction
from beamflow.ptycho.arrays import array_backend, cpu_count
from beamflow.ptycho.engine import Reconstructor, initial_state
from beamflow.ptycho.quality.metrics import compare
from beamflow.ptycho.scan_geometry import ScanFrame
from beamflow.ptycho.state import PtychoData, ReconParams, ReconState
from beamflow.simulate import simulate_scan


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def make_scan(root: Path, name: str, positions: int, size: int, photons: float) -> Path:
    return simulate_scan(root, name, positions=positions, probe_size=size, photons=photons,
                         seed=11, frames_per_file=100)


# --------------------------------------------------------------------------- overhead


def _pooled_interval(means: list[float], base: list[float]) -> list[float]:
    """90 % bootstrap interval (over rounds, paired) of the pooled overhead in percent."""
    rng = random.Random(7)
    n = len(base)
    stats = []
    for _ in range(2000):
        idx = [rng.randrange(n) for _ in range(n)]
        stats.append(100 * (sum(means[i] for i in idx) / sum(base[i] for i in idx) - 1))
    stats.sort()
    return [round(stats[100], 2), round(stats[1900], 2)]


def _rpie_job(args, root: Path, name: str) -> tuple[PtychoData, ReconState]:
    """A simulated scan's data and an rPIE state from the true probe (one mode)."""
    master = make_scan(root, name, args.positions, args.size, 3e5)
    scan = load_scan(master)
    frame = ScanFrame.for_positions(scan.positions_m, scan.planned_positions_m,
                                    scan.frame_shape[0], 8, scan.object_pixel_size_m)
    data = PtychoData(intensities=read_frames(scan), positions_px=frame.corners(scan.positions_m),
                      object_shape=frame.object_shape, mask=scan.mask)
    params = ReconParams(algorithm="rpie", iterations=10**6, probe_modes=1)
    gt = read_ground_truth(master.parent / "ground_truth.h5")
    return data, initial_state(data, params, probe=gt.probe)


def bench_overhead(args, root: Path) -> None:
    data, state = _rpie_job(args, root, "ovh")
    backend = array_backend("cpu")
    l1_base = Path(tempfile.mkdtemp(prefix="bench-l1-", dir=args.l1_dir))
    # "control" is a second no-checkpoint setting: its "overhead" is the noise floor.
    # (every N iterations, CPU budget): the default 4 % budget, and every iteration unthrottled
    settings: dict[str, tuple[int, float | None] | None] = {
        "none": None, "control": None, "every_1": (1, 0.04), "every_1_no_budget": (1, None),
        "every_10": (10, 0.04)}
    settings = {k: v for k, v in settings.items() if k == "none" or k in args.settings}
    times: dict[str, list[list[float]]] = {k: [] for k in settings}
    cpu: dict[str, float] = dict.fromkeys(settings, 0.0)
    ckpts = {k: Checkpointer(CheckpointPolicy(
                 l1=LevelConfig(dir=l1_base / k, every_iterations=v[0], keep=2),
                 max_overhead=v[1])) if v else None
             for k, v in settings.items()}
    rng = random.Random(1)
    with Reconstructor(data, state, backend) as rec:
        rec.run(3)  # warm up (plans, caches, thread pool)
        for _ in range(args.rounds):
            order = list(settings)
            rng.shuffle(order)
            for name in order:
                ck = ckpts[name]
                block: list[float] = []
                if ck is not None:  # the policy counts from here, as after a (re)start
                    ck._last_iter = dict.fromkeys(ck._last_iter, rec.iteration)
                t = [time.perf_counter()]

                def callback(view, info, ck=ck, block=block, t=t) -> None:
                    if ck is not None:
                        it = int(info["iteration"])
                        ck.maybe_save(it, lambda: rec.snapshot().to_host_arrays(),
                                      lambda: {"state": rec.snapshot().meta()})
                    now = time.perf_counter()
                    block.append(now - t[0])
                    t[0] = now

                c0 = time.process_time()
                rec.run(args.block, callback=callback)
                cpu[name] += time.process_time() - c0
                times[name].append(block)
                if ck is not None:
                    ck.flush()  # untimed: the next block starts with an idle writer
    base = [statistics.fmean(b) for b in times["none"]]
    nbytes = sum(a.nbytes for a in rec.snapshot().to_host_arrays().values())
    if "control" in settings:
        control = [statistics.fmean(b) for b in times["control"]]
        per_round = [m / b - 1 for m, b in zip(control, base, strict=True)]
        emit(bench="checkpoint_overhead_control", what="no checkpoints vs no checkpoints",
             overhead_pct_median=round(100 * statistics.median(per_round), 2),
             overhead_pct_pooled=round(100 * (statistics.fmean(control)
                                              / statistics.fmean(base) - 1), 2),
             pooled_pct_90=_pooled_interval(control, base),
             round_spread_pct=round(100 * statistics.pstdev(per_round), 2))
    for name, setting in settings.items():
        if setting is None:
            continue
        every, budget = setting
        ck = ckpts[name]
        ck.close()
        means = [statistics.fmean(b) for b in times[name]]
        per_round = [m / b - 1 for m, b in zip(means, base, strict=True)]
        n_iter = args.rounds * args.block
        # process CPU of the blocks includes the writer threads' work done during them; the
        # untimed flush after each block is added from the writer's own CPU clock instead
        ck_cpu = ck.stats.snapshot_seconds + ck.stats.write_cpu_seconds
        emit(bench="checkpoint_overhead", level="L1", every_iterations=every,
             cpu_budget_pct=None if budget is None else 100 * budget,
             cpu_overhead_pct=round(100 * ck_cpu / cpu["none"], 2),
             process_cpu_overhead_pct=round(100 * (cpu[name] / cpu["none"] - 1), 2),
             overhead_pct_median=round(100 * statistics.median(per_round), 2),
             overhead_pct_pooled=round(100 * (statistics.fmean(means) / statistics.fmean(base)
                                              - 1), 2),
             pooled_pct_90=_pooled_interval(means, base),
             target_pct=5.0 if every == 1 else 1.0,
             iteration_s=round(statistics.fmean(means), 5),
             baseline_iteration_s=round(statistics.fmean(base), 5),
             commits=ck.stats.commits, iterations=n_iter,
             iterations_per_commit=round(n_iter / max(1, ck.stats.commits), 2),
             deferred=ck.stats.deferred,
             snapshot_ms_mean=round(1e3 * ck.stats.snapshot_seconds / max(1, ck.stats.snapshots),
                                    3),
             write_ms_mean=round(1e3 * ck.stats.write_seconds / max(1, ck.stats.commits), 2),
             write_cpu_ms_mean=round(1e3 * ck.stats.write_cpu_seconds
                                     / max(1, ck.stats.commits), 2),
             iteration_cpu_s=round(cpu["none"] / n_iter, 5),
             checkpoint_mb=round(nbytes / 2**20, 3), l1_dir=str(l1_base),
             positions=args.positions, frame=args.size, object=list(data.object_shape),
             threads=backend.threads, cpus=os.cpu_count(), rounds=args.rounds, block=args.block)
    shutil.rmtree(l1_base, ignore_errors=True)


# --------------------------------------------------------------------------- placement


def _commit_loop(active, idle, stop, period: float, directory: str, state: dict) -> None:
    """What a writer does for each checkpoint, every `period` seconds while `active`, at idle
    priority; `idle` is set whenever no commit is under way."""
    import hashlib

    from beamflow.checkpoint.store import FileImages, commit, dumps

    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    images, i = FileImages(), 0
    while not stop.is_set():
        idle.set()
        if not active.wait(0.05):
            continue
        idle.clear()
        if not active.is_set():  # switched off between the two: the caller may be timing
            continue
        t = time.monotonic()
        i += 1
        image = images.build(i, state, dumps({"iteration": i}), "{}")
        commit(Path(directory), i, image, fingerprint={}, keep=2,
               sha256=hashlib.sha256(image).hexdigest())
        time.sleep(max(0.0, period - (time.monotonic() - t)))


def bench_placement(args, root: Path) -> None:
    """Why the writer is a process: the same commits from a thread of the reconstruction's
    process (h5py holds the GIL) and from a child process, one per iteration.

    Both writers live for the whole run and are switched on for their blocks only (and
    drained, untimed, after them), so that rounds are short and many: this machine's speed
    drifts more between minutes than the effect being measured.
    """
    import multiprocessing
    import threading

    data, state = _rpie_job(args, root, "place")
    spawn = multiprocessing.get_context("spawn")
    times: dict[str, list[float]] = {"none": [], "thread": [], "process": []}
    rng = random.Random(3)
    with Reconstructor(data, state, array_backend("cpu")) as rec:
        rec.run(3)
        t = time.perf_counter()
        rec.run(5)
        period = (time.perf_counter() - t) / 5  # one commit per iteration
        arrays = rec.snapshot().to_host_arrays()
        stop_t, stop_p = threading.Event(), spawn.Event()
        switches = {"thread": (threading.Event(), threading.Event()),
                    "process": (spawn.Event(), spawn.Event())}
        workers = [
            threading.Thread(target=_commit_loop, args=(*switches["thread"], stop_t, period,
                                                        str(root / "w_thread"), arrays)),
            spawn.Process(target=_commit_loop, args=(*switches["process"], stop_p, period,
                                                     str(root / "w_process"), arrays))]
        for w in workers:
            w.start()
        for _active, idle in switches.values():
            idle.wait(60)  # started (imports done)
        try:
            for _ in range(args.rounds):
                order = list(times)
                rng.shuffle(order)
                for name in order:
                    if name != "none":
                        switches[name][0].set()
                    t = time.perf_counter()
                    rec.run(args.block)
                    times[name].append((time.perf_counter() - t) / args.block)
                    if name != "none":
                        active, idle = switches[name]
                        active.clear()
                        while not idle.wait(0.01):
                            pass
        finally:
            stop_t.set()
            stop_p.set()
            for w in workers:
                w.join()
    base = times["none"]
    for name in ("thread", "process"):
        per_round = [m / b - 1 for m, b in zip(times[name], base, strict=True)]
        emit(bench="checkpoint_writer_placement", writer=name,
             overhead_pct_median=round(100 * statistics.median(per_round), 2),
             overhead_pct_pooled=round(100 * (statistics.fmean(times[name])
                                              / statistics.fmean(base) - 1), 2),
             pooled_pct_90=_pooled_interval(times[name], base),
             commit_period_s=round(period, 4), iteration_s=round(statistics.fmean(base), 5),
             rounds=args.rounds, block=args.block, positions=args.positions, frame=args.size)


# --------------------------------------------------------------------------- progressive


def _defocus(probe: np.ndarray, dz: float, wavelength: float, dx: float) -> np.ndarray:
    m = probe.shape[-1]
    k = np.fft.fftfreq(m, dx)
    h = np.exp(-1j * np.pi * wavelength * dz * (k[:, None] ** 2 + k[None, :] ** 2))
    return np.fft.ifft2(np.fft.fft2(probe) * h)


def probe_guess(probe: np.ndarray, target: float, wavelength: float, dx: float) -> np.ndarray:
    """The true probe defocused until its NRMSE from the truth is ``target`` (bisection)."""
    def err(dz: float) -> float:
        return compare(_defocus(probe, dz, wavelength, dx), probe, register=False,
                       remove_ramp=False).nrmse

    lo, hi = 0.0, 1e-6
    while err(hi) < target:
        hi *= 2
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if err(mid) < target else (lo, mid)
    return _defocus(probe, 0.5 * (lo + hi), wavelength, dx).astype(np.complex64)


def _nrmse_of_checkpoints(ckdir: Path, gt, scan_geometry) -> dict[int, float]:
    """NRMSE against the truth of every checkpoint in ``ckdir`` (by iteration)."""
    out = {}
    for it, path in sorted(list_checkpoints(ckdir)):
        ck = read_checkpoint(path)
        frame = ScanFrame.model_validate(ck.meta["job"]["frame"])
        obj = ck.arrays["object"]
        pos = frame.to_metres(ck.arrays["positions_px"])
        h, w = obj.shape
        product = Product(
            name="x", detector_object_distance_m=scan_geometry.distance_m,
            photon_energy_eV=scan_geometry.energy_eV, probe=ck.arrays["probe"],
            probe_pixel_width_m=frame.pixel_size_m, probe_pixel_height_m=frame.pixel_size_m,
            object=obj, object_center_x_m=frame.origin_m[1] + w / 2 * frame.pixel_size_m,
            object_center_y_m=frame.origin_m[0] + h / 2 * frame.pixel_size_m,
            object_pixel_width_m=frame.pixel_size_m, object_pixel_height_m=frame.pixel_size_m,
            probe_position_indexes=np.arange(len(pos)), probe_position_x_m=pos[:, 1],
            probe_position_y_m=pos[:, 0])
        out[it] = score_product(product, gt).nrmse
    return out


def _first_at_or_below(curve: dict[int, float], level: float) -> int | None:
    for it in sorted(curve):
        if curve[it] <= level:
            return it
    return None


def bench_progressive(args, root: Path) -> None:
    master = make_scan(root, "prog", args.positions, args.size, 3e5)
    gt = read_ground_truth(master.parent / "ground_truth.h5")
    scan = load_scan(master)
    dx = scan.object_pixel_size_m
    guess = probe_guess(gt.probe, args.guess_nrmse, scan.geometry.wavelength_m, dx)
    np.save(root / "guess.npy", guess)
    # a checkpoint after every iteration (no CPU budget): the NRMSE curve from the files
    common = dict(scan=master, device="cpu", probe=root / "guess.npy", checkpoint_every=1,
                  checkpoint_keep=100_000, checkpoint_max_overhead=None, preview_every=0,
                  batch=args.batch or None, seed=0)
    n_full = args.iterations

    t0 = time.perf_counter()
    fresh = run_reconstruction(ReconstructJob(out=root / "fresh", iterations=n_full, **common))
    fresh_s = time.perf_counter() - t0
    curve_fresh = _nrmse_of_checkpoints(root / "fresh" / "checkpoints", gt, scan.geometry)
    tail = [curve_fresh[k] for k in sorted(curve_fresh)[-5:]]
    final = statistics.fmean(tail)  # the fresh run's converged level (mean of its last 5)
    levels = {"0.10": 0.10, "0.05": 0.05, "fresh_final+5%": 1.05 * final}

    for half in args.half_iterations:
        out = root / f"prog{half}"
        t0 = time.perf_counter()
        run_reconstruction(ReconstructJob(out=out, iterations=half,
                                          max_frames=scan.n_frames // 2, **common))
        half_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        cont = run_reconstruction(ReconstructJob(out=out, iterations=n_full, **common))
        cont_s = time.perf_counter() - t0
        assert cont.continuation and cont.resumed_from_iteration == half
        # NRMSE over the whole scan is only meaningful once all frames are in
        curve = {it - half: v for it, v in _nrmse_of_checkpoints(
            out / "checkpoints", gt, scan.geometry).items() if it > half}
        for name, level in levels.items():
            f = _first_at_or_below(curve_fresh, level)
            p = _first_at_or_below(curve, level)
            emit(bench="progressive", nrmse_target=name, nrmse_level=round(level, 4),
                 half_iterations=half, fresh_full_iterations=f,
                 progressive_full_iterations=p,
                 progressive_total_iterations=None if p is None else p + half,
                 # a half-data iteration costs about half a full one
                 progressive_cost_full_equivalent=None if p is None else p + half / 2,
                 fresh_final_nrmse=round(final, 4),
                 progressive_final_nrmse=round(statistics.fmean(
                     [curve[k] for k in sorted(curve)[-5:]]), 4),
                 positions=args.positions, frame=args.size, half_frames=scan.n_frames // 2,
                 guess_nrmse=args.guess_nrmse, fresh_seconds=round(fresh_s, 1),
                 half_seconds=round(half_s, 1), continue_seconds=round(cont_s, 1),
                 fresh_seconds_per_iteration=fresh.seconds_per_iteration)


# --------------------------------------------------------------------------- memory


# The child reports its own high-water mark (VmHWM) at exit. Not wait4's ru_maxrss: Linux
# carries that across exec, so a child forked (or vforked) from this process, which holds the
# simulated scan, would report this process's RSS whenever it exceeds the child's own. Its
# own children (the checkpoint writer process) are polled every 20 ms for theirs, once they
# have exec'd.
_REPORT_HWM = """
import atexit, glob, json, os, runpy, sys, threading, time
def _hwm_kb(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
kids = {}
me = open("/proc/self/cmdline", "rb").read()
def _poll():
    while True:
        for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
            for pid in open(path).read().split():
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read()
                except OSError:
                    continue
                if cmd == me:  # between fork and exec a child still shows our memory
                    continue
                kind = ("previews" if b"live_previews" in cmd
                        else "writer" if b"checkpoint" in cmd else "other")
                kids[kind] = max(kids.get(kind, 0), _hwm_kb(pid))
        time.sleep(0.02)
threading.Thread(target=_poll, daemon=True).start()
def _report():
    sys.stderr.write("\\nVMHWM_KB " + str(_hwm_kb("self")) + "\\n")
    sys.stderr.write("\\nCHILDREN_VMHWM_KB " + json.dumps(kids) + "\\n")
atexit.register(_report)
module, sys.argv = sys.argv[1], sys.argv[1:]
if module == "-":
    exec(sys.argv[1])
else:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _peak_rss_mb(module: str, args: list[str]
                 ) -> tuple[float, dict[str, float], subprocess.CompletedProcess]:
    """Peak RSS (VmHWM) of ``python -m module args`` (module "-": args[0] is code) and of its
    child processes by kind ("writer": checkpoint writer, "previews": live previews), MiB."""
    cmd = [sys.executable, "-c", _REPORT_HWM, module, *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    lines = res.stderr.splitlines()
    marks = [line.split()[1] for line in lines if line.startswith("VMHWM_KB ")]
    kids = [line.split(" ", 1)[1] for line in lines if line.startswith("CHILDREN_VMHWM_KB ")]
    if not marks or not kids:
        raise SystemExit(f"no peak RSS reported by {module} {args}: {res.stderr[-2000:]}")
    return int(marks[-1]) / 1024, {k: v / 1024 for k, v in json.loads(kids[-1]).items()}, res


def bench_memory(args, root: Path) -> None:
    for n in args.mem_positions:
        _bench_memory_one(args, root, n)


def _bench_memory_one(args, root: Path, n_positions: int) -> None:
    master = make_scan(root, f"mem{n_positions}", n_positions, args.mem_size, 1e6)
    scan = load_scan(master)
    frame = ScanFrame.for_positions(scan.positions_m, scan.planned_positions_m,
                                    scan.frame_shape[0], 8, scan.object_pixel_size_m)
    frames_mb = scan.n_frames * scan.frame_shape[0] * scan.frame_shape[1] * 4 / 2**20
    obj_mb = frame.object_shape[0] * frame.object_shape[1] * 8 / 2**20
    probe_mb = scan.frame_shape[0] ** 2 * 8 / 2**20
    base_mb, _, _ = _peak_rss_mb("-", ["import beamflow.cli, beamflow.job.run, "
                                    "beamflow.ptycho.engine, beamflow.ptycho.quality.previews, "
                                    "matplotlib.figure"])
    peak_mb, children_mb, res = _peak_rss_mb("beamflow.cli", [
        "reconstruct", str(master), "--out", str(root / f"mem_out{n_positions}"), "--device", "cpu",
        "--iterations", str(args.mem_iterations), "--json", "--checkpoint-every", "1"])
    if res.returncode != 0:
        raise SystemExit(f"reconstruct failed: {res.stderr}")
    target = 2 * frames_mb + obj_mb + probe_mb
    emit(bench="reconstruct_peak_rss", frames=scan.n_frames, frame=scan.frame_shape[0],
         iterations=args.mem_iterations,
         frames_float32_mb=round(frames_mb, 1), target_mb=round(target, 1),
         peak_rss_mb=round(peak_mb, 1), interpreter_baseline_mb=round(base_mb, 1),
         peak_minus_baseline_mb=round(peak_mb - base_mb, 1),
         checkpoint_writer_peak_rss_mb=round(children_mb.get("writer", 0.0), 1),
         live_previews_peak_rss_mb=round(children_mb.get("previews", 0.0), 1),
         within_target=peak_mb <= target,
         within_target_above_baseline=peak_mb - base_mb <= target)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--positions", type=int, default=400)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--settings", nargs="+",
                    default=["control", "every_1", "every_1_no_budget", "every_10"],
                    choices=["control", "every_1", "every_1_no_budget", "every_10"],
                    help="overhead: the settings run beside 'none' (fewer: more rounds per "
                    "minute on a noisy machine)")
    ap.add_argument("--l1-dir", default=None, help="node-local base dir (default: $TMPDIR)")
    ap.add_argument("--iterations", type=int, default=100, help="progressive: full-data run")
    ap.add_argument("--half-iterations", type=int, nargs="+", default=[20, 50])
    ap.add_argument("--batch", type=int, default=32,
                    help="progressive: batch size (0: the job's default, by frame count)")
    ap.add_argument("--guess-nrmse", type=float, default=0.6)
    # A small scan, where the interpreter's ~120 MB weighs, and a realistic one.
    ap.add_argument("--mem-positions", type=int, nargs="+", default=[2000, 8000])
    ap.add_argument("--mem-size", type=int, default=128)
    ap.add_argument("--mem-iterations", type=int, default=12,
                    help="memory: iterations (past 10 the job draws a live preview)")
    ap.add_argument("--only", choices=["overhead", "placement", "progressive", "memory"],
                    default=None)
    args = ap.parse_args()
    log(f"CPUs available: {cpu_count()}; resource limits: "
        f"{resource.getrlimit(resource.RLIMIT_AS)}")
    root = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    try:
        if args.only in (None, "overhead"):
            bench_overhead(args, root)
        if args.only in (None, "placement"):
            bench_placement(args, root)
        if args.only in (None, "progressive"):
            bench_progressive(args, root)
        if args.only in (None, "memory"):
            bench_memory(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
