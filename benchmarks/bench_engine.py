"""Benchmark of the reconstruction engine (beamflow.ptycho) against the FFT floor.

Prints one JSON line per result:

* ``{"bench": "fft_floor", ...}`` — forward + inverse FFT of all of an iteration's exit waves
  (N·K, M, M complex64) with scipy.fft at full threads: the cost no iteration can avoid.
* ``{"bench": "fftw_floor", ...}`` — the same with the engine's FFTW (one call per thread, the
  stack split across the CPUs), when FFTW is installed: the floor of the library in use.
* ``{"bench": "engine", "algorithm": ..., "fft": ..., "seconds_per_iteration": ...,
  "ratio_to_fft_floor": ..., "speedup_vs_ptychi": ...}`` — per algorithm and CPU FFT library
  (``--fft``, default all: FFTW and pocketfft, their iterations alternated); the floors are
  re-measured between the iterations in the same process, and the ratio uses the medians.
  Also reported: the ratio of the best iteration to the best floor (``_min``), and of CPU
  time (all threads; ``cpu_ratio_to_fft_floor``), which stay meaningful when other jobs
  share the machine (``load_average_1min``); Pty-Chi's speed is issue 3's figure for a
  quiet 2-core machine (benchmarks/bench_ptychi.py runs both on the same data).
* ``{"bench": "quality", ...}`` (``--quality``) — 100 rPIE and LSQ-ML iterations on a
  simulated scan (400 positions of 64 px, Fermat spiral, sub-pixel positions, Poisson
  noise at ~3e5 photons/frame) from a probe guess ~0.6 NRMSE from the truth; complex object
  NRMSE after the optimal global complex factor (and, separately, with a linear phase ramp
  removed too) over the well-illuminated region.
* ``--integer-positions`` rounds the positions: the engine then skips the exact sub-pixel
  probe shifts (2 of its 4 FFTs per position), which shows what exactness costs.
* ``{"bench": "scatter", ...}`` (``--scatter``/``--scatter-only``) — patch scatter-add
  variants, best of 10.

The data are simulated here with plain numpy (exact sub-pixel shifts by Fourier-shifting
the object around each window), independent of the engine and of beamflow.simulate.

    .venv/bin/python benchmarks/bench_engine.py                # speed, all algorithms
    .venv/bin/python benchmarks/bench_engine.py --quality      # + the quality target
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kits"))  # the engine kit's illuminated region

from engine_kit import region as illuminated  # noqa: E402

from beamflow.ptycho import (  # noqa: E402
    PtychoData,
    ReconParams,
    Reconstructor,
    array_backend,
    initial_state,
)
from beamflow.ptycho.arrays import cpu_ffts  # noqa: E402

PTYCHI_SECONDS_PER_ITERATION = 0.23  # issue 3: Pty-Chi rPIE, 400 x 64 px, CPU torch, 2 cores


# ------------------------------------------------------------------------------------------
# Simulation (numpy only)
# ------------------------------------------------------------------------------------------
def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], sigma: float) -> np.ndarray:
    f = np.fft.fft2(rng.standard_normal(shape))
    ky = np.fft.fftfreq(shape[0])[:, None]
    kx = np.fft.fftfreq(shape[1])[None]
    r = np.real(np.fft.ifft2(f * np.exp(-2 * (np.pi * sigma) ** 2 * (ky**2 + kx**2))))
    return (r - r.mean()) / (r.std() + 1e-12)


def make_object(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Amplitude 0.65–0.95 and phase ±0.8 rad with features down to a few pixels."""
    amp = 0.8 + 0.15 * np.tanh(_smooth_noise(rng, shape, 2.0))
    phase = 0.8 * np.tanh(_smooth_noise(rng, shape, 1.5))
    return (amp * np.exp(1j * phase)).astype(np.complex64)


def make_probe(m: int, defocus: float = 25.0) -> np.ndarray:
    """A defocused focused-beam probe (circular pupil + quadratic phase), kept in the window."""
    k = np.fft.fftshift(np.fft.fftfreq(m))
    k2 = k[:, None] ** 2 + k[None] ** 2
    pupil = (np.sqrt(k2) < 0.175).astype(np.complex128) * np.exp(1j * defocus * m * k2)
    p = np.fft.fftshift(np.fft.ifft2(np.fft.ifftshift(pupil)))
    r2 = (np.arange(m) - m / 2 + 0.5) ** 2
    p *= np.exp(-(r2[:, None] + r2[None]) / (2 * (m / 6.0) ** 2))
    return (p / np.abs(p).max()).astype(np.complex64)


def fermat_spiral(n: int, step: float) -> np.ndarray:
    i = np.arange(n)
    r = 0.6 * step * np.sqrt(i)
    th = i * np.pi * (3 - np.sqrt(5))
    return np.stack([r * np.sin(th), r * np.cos(th)], axis=1)


def simulate(n: int = 400, m: int = 64, photons: float = 3e5, seed: int = 0,
             probe: np.ndarray | None = None) -> dict:
    """Scan with exact sub-pixel positions: each window of the object is Fourier-shifted by
    the position's fraction (with an 8 px margin), multiplied by the probe modes, and
    propagated to the far field; Poisson noise; frames in detector view."""
    rng = np.random.default_rng(seed)
    probes = make_probe(m)[None] if probe is None else np.asarray(probe).reshape(-1, m, m)
    pos = fermat_spiral(n, m / 8)
    q = 8
    pos = pos - pos.min(axis=0) + q + 2.5 + rng.uniform(-0.5, 0.5, (n, 2))
    h = int(np.ceil(pos[:, 0].max())) + m + q + 2
    w = int(np.ceil(pos[:, 1].max())) + m + q + 2
    obj = make_object(rng, (h, w))
    kf = np.fft.fftfreq(m + 2 * q)
    inten = np.zeros((n, m, m))
    for j, (py, px) in enumerate(pos):
        ny, nx = int(np.rint(py)), int(np.rint(px))
        dy, dx = py - ny, px - nx
        win = obj[ny - q : ny + m + q, nx - q : nx + m + q].astype(np.complex128)
        ramp = np.exp(2j * np.pi * (kf[:, None] * dy + kf[None] * dx))
        sub = np.fft.ifft2(np.fft.fft2(win) * ramp)[q : q + m, q : q + m]
        for p in probes:
            inten[j] += np.abs(np.fft.fft2(p * sub)) ** 2
    scale = photons / inten.sum(axis=(1, 2)).mean()
    inten = rng.poisson(inten * scale).astype(np.float32)
    return {
        "intensities": np.fft.fftshift(inten, axes=(-2, -1)),
        "positions": pos,
        "object": obj,
        "probe": (probes * np.sqrt(scale)).astype(np.complex64),
        "shape": (h, w),
    }


# ------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------
class FFTFloor:
    """fft2 + ifft2 over (n_waves, m, m) complex64 with scipy.fft at full threads."""

    def __init__(self, n_waves: int, m: int):
        import scipy.fft as sfft  # noqa: PLC0415 - benchmarks may use scipy.fft directly

        self.sfft = sfft
        self.workers = array_backend("cpu").threads
        rng = np.random.default_rng(1)
        self.x = np.exp(2j * np.pi * rng.random((n_waves, m, m))).astype(np.complex64)
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.measure(1)
        self.wall.clear()
        self.cpu.clear()

    def measure(self, repeats: int = 3) -> None:
        for _ in range(repeats):
            c0, t0 = time.process_time(), time.perf_counter()
            y = self.sfft.fft2(self.x, axes=(-2, -1), workers=self.workers)
            self.sfft.ifft2(y, axes=(-2, -1), workers=self.workers, overwrite_x=True)
            self.wall.append(time.perf_counter() - t0)
            self.cpu.append(time.process_time() - c0)


class FFTWFloor(FFTFloor):
    """The same transforms with the engine's FFTW, the stack split across the CPUs' threads
    (FFTW runs one thread per call in the engine): the floor of the library the engine uses,
    reported beside the issue's scipy.fft floor."""

    def __init__(self, n_waves: int, m: int):
        self.backend = array_backend("cpu", fft="fftw")
        self.parts = np.array_split(np.arange(n_waves), self.backend.threads)
        # One pool for every measurement: starting threads is not the transforms' cost.
        self.pool = ThreadPoolExecutor(len(self.parts))
        super().__init__(n_waves, m)

    def measure(self, repeats: int = 3) -> None:
        be = self.backend

        def both(idx: np.ndarray) -> None:
            y = be.fft2(self.x[idx], workers=1)  # fancy indexing: a copy, as the engine's
            be.ifft2(y, workers=1)

        for _ in range(repeats):
            c0, t0 = time.process_time(), time.perf_counter()
            list(self.pool.map(both, self.parts))
            self.wall.append(time.perf_counter() - t0)
            self.cpu.append(time.process_time() - c0)


def time_algorithm(sim: dict, params: ReconParams, iterations: int, floors: list[FFTFloor],
                   ffts: list[str], warmup: int = 2) -> dict[str, tuple[list[float], list[float]]]:
    """Per-iteration wall and CPU seconds with each CPU FFT library, their iterations
    alternated and the floors measured between them, so a load that comes and goes on a
    shared machine hits all alike."""
    data = PtychoData(sim["intensities"], sim["positions"], sim["shape"])
    recs = {f: Reconstructor(data, initial_state(data, params), array_backend("cpu", fft=f))
            for f in ffts}
    times: dict[str, tuple[list[float], list[float]]] = {f: ([], []) for f in ffts}
    try:
        for rec in recs.values():
            rec.run(warmup)
        for _ in range(iterations):
            for f, rec in recs.items():
                for floor in floors:
                    floor.measure(1)
                c0, t0 = time.process_time(), time.perf_counter()
                rec.iterate()
                times[f][0].append(time.perf_counter() - t0)
                times[f][1].append(time.process_time() - c0)
    finally:
        for rec in recs.values():
            rec.close()
    return times


def nrmse(rec: np.ndarray, true: np.ndarray, region: np.ndarray, ramp: bool = False) -> float:
    """‖c·rec − true‖/‖true‖ over region with the optimal complex scalar c; with ``ramp``
    also a least-squares phase plane of rec/true removed first."""
    a = rec[region].astype(np.complex128)
    b = true[region].astype(np.complex128)
    if ramp:
        yy, xx = np.nonzero(region)
        ph = np.angle(b * np.conj(a) / np.maximum(np.abs(a), 1e-12))
        # fit the unwrapped-by-construction small phase difference
        g = np.stack([np.ones_like(yy), yy, xx], axis=1).astype(np.float64)
        coef, *_ = np.linalg.lstsq(g, ph, rcond=None)
        a = a * np.exp(1j * (g @ coef))
    c = np.vdot(a, b) / np.vdot(a, a)
    return float(np.linalg.norm(c * a - b) / np.linalg.norm(b))


def probe_guess(true_probe: np.ndarray, target: float = 0.6) -> tuple[np.ndarray, float]:
    """The true probe propagated (defocused) until its NRMSE to the truth is ~target."""
    m = true_probe.shape[-1]
    k = np.fft.fftfreq(m)
    k2 = k[:, None] ** 2 + k[None] ** 2
    full = np.ones((m, m), bool)
    best = (true_probe, 0.0)
    for dz in np.linspace(0, 60, 1201):
        g = np.fft.ifft2(np.fft.fft2(true_probe) * np.exp(1j * dz * m * k2))
        e = nrmse(g, true_probe, full)
        if abs(e - target) < abs(best[1] - target):
            best = (g.astype(np.complex64), e)
        if e >= target:
            break
    return best


def bench_scatter(m: int = 64, n: int = 400) -> list[dict]:
    """Scatter-add variants on one thread (best of 10), and the engine's two CPU paths with
    every thread scattering its own share at once, as the engine's threads do."""
    from numpy.lib.stride_tricks import sliding_window_view  # noqa: PLC0415
    from scipy.sparse import _sparsetools  # noqa: PLC0415 - a private kernel, measured only

    rng = np.random.default_rng(0)
    h = w = 300
    iy, ix = rng.integers(0, h - m, n), rng.integers(0, w - m, n)
    p = np.exp(2j * np.pi * rng.random((n, m, m))).astype(np.complex64)
    acc = np.zeros((h, w), np.complex64)
    off = (np.arange(m)[:, None] * w + np.arange(m)[None, :]).ravel().astype(np.int32)
    idx = ((iy * w + ix).astype(np.int32)[:, None] + off[None]).ravel()

    def loop_into(a: np.ndarray, rows: slice) -> None:
        for j in range(rows.start, rows.stop):
            a[iy[j] : iy[j] + m, ix[j] : ix[j] + m] += p[j]

    def coo_into(a: np.ndarray, rows: slice) -> None:
        # scipy's compiled sparse kernel as a scatter-add: a[idx[k]] += p[k] · 1, one call
        # that releases the GIL; the flat indices built per call, as a caller would
        flat = ((iy[rows] * w + ix[rows]).astype(np.int32)[:, None] + off[None]).ravel()
        _sparsetools.coo_matvec(flat.size, flat, np.zeros(flat.size, np.int32),
                                p[rows].reshape(-1), np.ones(1, np.complex64), a.reshape(-1))

    def add_at() -> None:
        np.add.at(acc.ravel(), idx, p.ravel())

    def bincount() -> None:
        np.bincount(idx, p.real.ravel(), h * w)
        np.bincount(idx, p.imag.ravel(), h * w)

    def add_at_window() -> None:
        np.add.at(sliding_window_view(acc, (m, m), writeable=True), (iy, ix), p)

    everything = slice(0, n)
    methods = [("slice_loop", lambda: loop_into(acc, everything)), ("add_at", add_at),
               ("bincount", bincount), ("add_at_window", add_at_window),
               ("coo_matvec", lambda: coo_into(acc, everything))]
    times: dict[str, list[float]] = {name: [] for name, _ in methods}
    for _ in range(10):  # interleaved, best of 10: robust on a shared machine
        for name, fn in methods:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    rows = [{"bench": "scatter", "method": name, "patches": n, "patch_px": m, "threads": 1,
             "seconds": min(v), "seconds_median": statistics.median(v)}
            for name, v in times.items()]

    # Two threads, each scattering half of the patches into its own accumulator, in
    # chunks of 32 (as the engine's threads do), against one thread doing all of them.
    halves = np.array_split(np.arange(n), 2)
    accs = [np.zeros((h, w), np.complex64) for _ in halves]

    def share(scatter: Any, t: int) -> None:
        for part in np.array_split(halves[t], max(1, len(halves[t]) // 32)):
            scatter(accs[t], slice(int(part[0]), int(part[-1]) + 1))

    for name, scatter in (("slice_loop", loop_into), ("coo_matvec", coo_into)):
        one, two = [], []
        for _ in range(10):
            t0 = time.perf_counter()
            share(scatter, 0)
            share(scatter, 1)
            one.append(time.perf_counter() - t0)
            threads = [threading.Thread(target=share, args=(scatter, t)) for t in (0, 1)]
            t0 = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            two.append(time.perf_counter() - t0)
        rows.append({"bench": "scatter_two_threads", "method": name, "patches": n,
                     "patch_px": m, "seconds_one_thread": statistics.median(one),
                     "seconds_two_threads": statistics.median(two),
                     "speedup": statistics.median(one) / statistics.median(two)})
    return rows


# Stage name → (module, class, method) timed.
STAGES = {
    "chunk": ("beamflow.ptycho.core", "Core", "chunk"),
    "shifted_probe": ("beamflow.ptycho.forward.thin", "ThinModel", "shifted_probe"),
    "exit_wave": ("beamflow.ptycho.arrays", "ArrayBackend", "exit_wave"),
    "to_detector": ("beamflow.ptycho.forward.detector", "FarField", "to_detector"),
    "modulus": ("beamflow.ptycho.arrays", "ArrayBackend", "modulus"),
    "to_sample": ("beamflow.ptycho.forward.detector", "FarField", "to_sample"),
    "object_terms": ("beamflow.ptycho.arrays", "ArrayBackend", "object_terms"),
    "probe_terms": ("beamflow.ptycho.forward.thin", "ThinModel", "probe_terms"),
    "object_step": ("beamflow.ptycho.accumulators", "ObjectSteps", "update"),
}


def bench_stages(sim: dict, iterations: int) -> list[dict]:
    """Wall time per iteration in each stage of the engine (summed over threads), with one
    thread and with all, the two engines' iterations alternated. The FFT stages are
    ``shifted_probe`` (the sub-pixel shift), ``to_detector``, ``to_sample`` and
    ``probe_terms`` (the adjoint shift), each with one or two elementwise passes."""

    spent: dict[str, float] = {}
    lock = threading.Lock()

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                with lock:
                    spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    classes = {name: getattr(importlib.import_module(mod), cls)
               for name, (mod, cls, _) in STAGES.items()}
    originals = {name: getattr(classes[name], STAGES[name][2]) for name in STAGES}
    for name, fn in originals.items():
        setattr(classes[name], STAGES[name][2], timed(name, fn))
    try:
        data = PtychoData(sim["intensities"], sim["positions"], sim["shape"])
        params = ReconParams(algorithm="rpie", iterations=10**6)
        threads = array_backend("cpu").threads
        recs = {t: Reconstructor(data, initial_state(data, params), array_backend("cpu", threads=t))
                for t in sorted({1, threads})}
        totals = {t: {name: 0.0 for name in (*STAGES, "iteration")} for t in recs}
        for rec in recs.values():
            rec.run(2)
        for _ in range(iterations):
            for t, rec in recs.items():
                spent.clear()
                t0 = time.perf_counter()
                rec.iterate()
                totals[t]["iteration"] += time.perf_counter() - t0
                for name, v in spent.items():
                    totals[t][name] += v
        for rec in recs.values():
            rec.close()
    finally:
        for name, fn in originals.items():
            setattr(classes[name], STAGES[name][2], fn)
    return [{"bench": "stages", "threads": t, "stage": name,
             "seconds_per_iteration": v / iterations}
            for t, row in totals.items() for name, v in row.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--positions", type=int, default=400)
    ap.add_argument("--probe-px", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=10, help="timed iterations per algorithm")
    ap.add_argument("--algorithms", default="rpie,epie,dm,lsqml")
    ap.add_argument("--modes", type=int, default=1)
    ap.add_argument("--quality", action="store_true", help="also run the 100-iteration target")
    ap.add_argument("--quality-only", action="store_true")
    ap.add_argument("--scatter", action="store_true", help="also time scatter-add variants")
    ap.add_argument("--scatter-only", action="store_true")
    ap.add_argument("--stages", action="store_true",
                    help="only the wall time per stage of rPIE, one thread and all")
    ap.add_argument("--fft", default=",".join(cpu_ffts()),
                    help="CPU FFT libraries to time side by side (default: all available)")
    ap.add_argument("--integer-positions", action="store_true",
                    help="round the positions: what the exact sub-pixel shifts cost (speed only)")
    args = ap.parse_args(argv)

    m, n = args.probe_px, args.positions
    sim = simulate(n=n, m=m)
    if args.integer_positions:
        # The engine skips the probe's Fourier shifts (2 of its 4 FFTs per position) when
        # no position has a fractional part; the data stay those of the sub-pixel scan.
        sim["positions"] = np.rint(sim["positions"])
    threads = array_backend("cpu").threads
    common = {"positions": n, "probe_px": m, "modes": args.modes, "device": "cpu",
              "subpixel": not args.integer_positions,
              "threads": threads, "cpus": os.cpu_count()}
    if args.stages:
        for row in bench_stages(sim, args.iterations):
            print(json.dumps({**common, **row}), flush=True)
        return 0
    if not (args.quality_only or args.scatter_only):
        # The head-to-head run on the same data is benchmarks/bench_ptychi.py; here the
        # issue's figure for Pty-Chi on this machine class (quiet) is the reference.
        ptychi, ptychi_source = PTYCHI_SECONDS_PER_ITERATION, "issue 3 (quiet 2-core machine)"
        ffts = [f.strip() for f in args.fft.split(",") if f.strip()]
        floor = FFTFloor(n * args.modes, m)
        floors = [floor] + ([FFTWFloor(n * args.modes, m)] if "fftw" in cpu_ffts() else [])
        for fl in floors:
            fl.measure(7)
            print(json.dumps({"bench": "fft_floor" if fl is floor else "fftw_floor",
                              "seconds": statistics.median(fl.wall), "seconds_min": min(fl.wall),
                              "cpu_seconds": statistics.median(fl.cpu), **common}), flush=True)
        for alg in [a.strip() for a in args.algorithms.split(",") if a.strip()]:
            params = ReconParams(algorithm=alg, iterations=10**6, probe_modes=args.modes)
            for fl in floors:
                fl.wall.clear()
                fl.cpu.clear()
            times = time_algorithm(sim, params, args.iterations, floors, ffts)
            fl = statistics.median(floor.wall)
            for impl, (wall, cpu) in times.items():
                sec = statistics.median(wall)
                row = {
                    "bench": "engine", "algorithm": alg, "fft": impl,
                    "seconds_per_iteration": sec,
                    "fft_floor_seconds": fl, "ratio_to_fft_floor": sec / fl,
                    # best case of each: robust when other jobs share the machine
                    "seconds_per_iteration_min": min(wall),
                    "fft_floor_seconds_min": min(floor.wall),
                    "ratio_to_fft_floor_min": min(wall) / min(floor.wall),
                    # CPU time (all threads): the work itself, whatever the load
                    "cpu_seconds_per_iteration": statistics.median(cpu),
                    "fft_floor_cpu_seconds": statistics.median(floor.cpu),
                    "cpu_ratio_to_fft_floor": statistics.median(cpu) / statistics.median(
                        floor.cpu),
                    "batch_size": (params.batch_size_for(n) if params.selection != "sparse"
                                   else params.batch_size),
                    "batch_selection": params.selection,
                    "ptychi_seconds_per_iteration": ptychi, "ptychi_source": ptychi_source,
                    "speedup_vs_ptychi": ptychi / sec,
                    "load_average_1min": os.getloadavg()[0], **common,
                }
                if len(floors) > 1:  # the floor of the FFT library the engine uses
                    row["fftw_floor_seconds"] = statistics.median(floors[1].wall)
                    row["ratio_to_fftw_floor"] = sec / row["fftw_floor_seconds"]
                print(json.dumps(row), flush=True)
    if args.scatter or args.scatter_only:
        for row in bench_scatter(m, n):
            print(json.dumps(row), flush=True)
    if args.quality or args.quality_only:
        data = PtychoData(sim["intensities"], sim["positions"], sim["shape"])
        guess, guess_err = probe_guess(sim["probe"][0] / np.abs(sim["probe"][0]).max())
        for alg in ("rpie", "lsqml"):
            params = ReconParams(algorithm=alg, iterations=100)
            state = initial_state(data, params, probe=guess)
            t0 = time.perf_counter()
            with Reconstructor(data, state, array_backend("cpu")) as rec:
                final = rec.run()
            region = illuminated(sim, frac=0.3)
            print(json.dumps({
                "bench": "quality", "algorithm": alg, "iterations": 100,
                "probe_guess_nrmse": guess_err,
                "object_nrmse": nrmse(final.object, sim["object"], region),
                "object_nrmse_ramp_removed": nrmse(final.object, sim["object"], region, True),
                "final_loss": final.loss_history[-1], "seconds": time.perf_counter() - t0,
                "photons_per_frame": 3e5, **common,
            }), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
