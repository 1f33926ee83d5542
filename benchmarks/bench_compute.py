"""The local backend's compute: Globus Compute's engine against the pool it replaced.

    .venv/bin/python benchmarks/bench_compute.py                       # ~1-2 min
    .venv/bin/python benchmarks/bench_compute.py --tasks 100 --reconstructions 5

Two ways to run a function in a worker process of this machine, side by side in one process:

- ``engine``: a ``GlobusComputeEngine`` (Parsl HTEX: interchange + worker pool, LocalProvider)
  as the local backend runs it (:mod:`beamflow.local.engine`, beamflow's default engine
  configuration, one worker): the function shipped as its source text in a messagepack
  ``Task``, the result unpacked from the endpoint's ``Result``.
- ``pool``: the multiprocessing-spawn pool the local backend had before (its minimal logic is
  copied below, as the baseline): one worker process started with ``spawn``, a pipe, the
  function imported by module and name, a JSON check of the result.

Results, one JSON line each:

- ``compute_startup``: from "start" to the first trivial task's result (engine: interchange,
  worker pool, first worker; pool: spawning the worker). Each side started ``--starts`` times.
- ``compute_task_overhead``: a trivial task's round trip (submit to result) once warm; N
  sequential tasks, engine and pool interleaved so that the machine's load touches both alike;
  median, p90 and min in ms.
- ``compute_reconstruction``: a small reconstruction (functions/reconstruct.py on a simulated
  scan) through each, interleaved: wall time (submit to result), the function's own
  ``seconds_total``, and the overhead (wall minus that); medians.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def emit(**record: Any) -> None:
    record["load_avg_1m"] = round(os.getloadavg()[0], 2)
    record["cpus"] = os.cpu_count()
    print(json.dumps(record), flush=True)


def stats_ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(1000 * statistics.median(ordered), 2),
        "p90_ms": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 2),
        "min_ms": round(1000 * ordered[0], 2),
    }


# -- the task functions (self-contained: the engine ships them as source) ------------------------
def noop(x: int) -> dict:
    return {"x": x}


# -- the baseline: the old pool's logic, minimal ---------------------------------------------------
def _pool_worker(conn: Connection) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        module_name, func_name, args, kwargs = message
        try:
            func = getattr(importlib.import_module(module_name), func_name)
            result = json.loads(json.dumps(func(*args, **kwargs)))
            reply: tuple[Any, ...] = (True, result)
        except BaseException as exc:  # noqa: BLE001 - back to the caller
            reply = (False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
        conn.send(reply)


class SpawnPool:
    """One spawned worker process and a pipe, as the old pool's slot was."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_pool_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def run(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        self.conn.send((func.__module__, func.__name__, list(args), kwargs))
        ok, value = self.conn.recv()
        if not ok:
            raise RuntimeError(value)
        return value

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(5)


# -- the engine ------------------------------------------------------------------------------------
class Engine:
    """beamflow's ComputeEngine with its default configuration and one worker."""

    def __init__(self, run_dir: Path) -> None:
        from beamflow.local.engine import ComputeEngine, default_engine_yaml

        self.engine = ComputeEngine.from_yaml(default_engine_yaml(1), "bench", run_dir)
        self.engine.start()
        self._packed: dict[Any, str] = {}

    def run(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        packed = self._packed.get(func) or self._packed.setdefault(
            func, self.engine.pack_function(func)
        )
        task = self.engine.submit(packed, args, kwargs)
        task.future.result()
        outcome = self.engine.outcome(task)
        self.engine.forget(task)
        if not outcome.ok:
            raise RuntimeError(outcome.error)
        return outcome.value

    def close(self) -> None:
        self.engine.close()


def start(kind: str, tmp: Path, n: int) -> tuple[Any, float]:
    begin = time.perf_counter()
    runner = Engine(tmp / f"engine-{n}") if kind == "engine" else SpawnPool()
    runner.run(noop, 0)
    return runner, time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--reconstructions", type=int, default=3)
    parser.add_argument("--positions", type=int, default=100)
    parser.add_argument("--probe-size", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()

    from beamflow.simulate import simulate_scan
    from functions.reconstruct import reconstruct

    with tempfile.TemporaryDirectory(prefix="bench-compute-") as tmp_name:
        tmp = Path(tmp_name)
        startups: dict[str, list[float]] = {"engine": [], "pool": []}
        for n in range(args.starts):
            for kind in ("engine", "pool"):
                runner, seconds = start(kind, tmp, n)
                startups[kind].append(seconds)
                runner.close()
        for kind, values in startups.items():
            emit(result="compute_startup", runner=kind, starts=len(values),
                 median_s=round(statistics.median(values), 2), min_s=round(min(values), 2),
                 max_s=round(max(values), 2))  # fmt: skip

        runners = {"engine": start("engine", tmp, 99)[0], "pool": start("pool", tmp, 99)[0]}
        try:
            trips: dict[str, list[float]] = {"engine": [], "pool": []}
            for i in range(args.tasks):
                for kind, runner in runners.items():
                    begin = time.perf_counter()
                    assert runner.run(noop, i) == {"x": i}
                    trips[kind].append(time.perf_counter() - begin)
            for kind, values in trips.items():
                emit(result="compute_task_overhead", runner=kind, tasks=len(values),
                     **stats_ms(values))  # fmt: skip

            hpc = tmp / "hpc"
            master = simulate_scan(hpc / "raw", "s1", positions=args.positions,
                                   probe_size=args.probe_size)  # fmt: skip
            parameters = {"iterations": args.iterations, "checkpoint_every": 0,
                          "preview_every": 0, "device": "cpu"}  # fmt: skip
            walls: dict[str, list[float]] = {"engine": [], "pool": []}
            inside: dict[str, list[float]] = {"engine": [], "pool": []}
            for i in range(args.reconstructions + 1):  # the first warms both up: not counted
                for kind, runner in runners.items():
                    name = f"{kind}-{i}"
                    begin = time.perf_counter()
                    summary = runner.run(
                        reconstruct, scan_path=str(master.parent),
                        output_dir=str(hpc / "runs" / name), allowed_roots=[str(hpc)],
                        parameters=parameters, run_name=name,
                    )  # fmt: skip
                    wall = time.perf_counter() - begin
                    if i:
                        walls[kind].append(wall)
                        inside[kind].append(summary["seconds_total"])
            for kind in runners:
                wall, own = statistics.median(walls[kind]), statistics.median(inside[kind])
                over = [w - f for w, f in zip(walls[kind], inside[kind], strict=True)]
                emit(result="compute_reconstruction", runner=kind, runs=len(walls[kind]),
                     positions=args.positions, probe_size=args.probe_size,
                     iterations=args.iterations, median_wall_s=round(wall, 3),
                     median_function_s=round(own, 3),
                     median_overhead_s=round(statistics.median(over), 3))  # fmt: skip
        finally:
            for runner in runners.values():
                runner.close()


if __name__ == "__main__":
    main()
