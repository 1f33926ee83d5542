"""Status page latency with a big run store; one JSON line per result.

    .venv/bin/python benchmarks/bench_status.py [--runs 10000] [--requests 100] [--dir /tmp]

A store of ``--runs`` runs (a realistic mix of statuses, steps, previews and errors) is served
by uvicorn on a free loopback port in its own process, as ``beamflow serve`` would serve it;
the client sends ``--requests`` sequential requests per case over one keep-alive connection
(after a short warm-up) and reports the median and 95th percentile wall time per request.
Target (issue 8): runs page and ``/api/runs`` at most 100 ms median with 10,000 runs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from beamflow.runs.records import RunStatus
from beamflow.runs.store import Store

TARGET_MS = 100.0
STATUSES = [RunStatus.SUCCEEDED] * 8 + [RunStatus.FAILED, RunStatus.CANCELLED]


def fill_store(path: Path, n: int) -> tuple[str, str]:
    """``n`` runs: mostly finished, a few failed, the newest few still going. Returns the id
    of a finished run with previews and of a failed one (for the detail-page cases)."""
    store = Store(path)
    done_id = failed_id = ""
    t = time.time() - n * 60
    for i in range(n):
        status = STATUSES[i % len(STATUSES)] if i < n - 3 else RunStatus.ACTIVE
        run = store.create_run(scan_name=f"sample{i // 50:03d}_scan_{i:05d}",
                               scan_path=f"/data/sample{i // 50:03d}_scan_{i:05d}",
                               flow="ptycho_reconstruct", backend="local",
            parameters={"algorithm": "rpie", "iterations": 100},
            iterations_total=100,
        )
        fields: dict = {"status": status, "started_at": t + 60 * i, "current_step": "Reconstruct"}
        if status.finished:
            fields["finished_at"] = t + 60 * i + 42
        if status == RunStatus.SUCCEEDED:
            fields.update(iteration=100, product=f"/data/previews/{run.scan_name}/product.h5",
                          previews=[f"/data/previews/{run.scan_name}/{k}.png" for k in (
                              "object_phase", "object_amplitude", "probe", "convergence")])
            done_id = run.id
        elif status == RunStatus.FAILED:
            fields.update(error="reconstruction diverged: NaN in object at iteration 37",
                          error_step="Reconstruct", iteration=37)
            failed_id = run.id
        else:
            fields["iteration"] = 50
        store.update_run(run.id, **fields)
        if i % 100 == 0:  # steps and events for some runs, as the agent would record them
            store.record_step(run.id, "TransferIn", "SUCCEEDED", started_at=t, finished_at=t + 3)
            store.record_step(run.id, "Reconstruct", "SUCCEEDED", started_at=t + 3,
                              finished_at=t + 40)
            store.add_event(run.id, "started", "run started on local")
    store.close()
    return done_id, failed_id


def serve(store_path: str, port: int) -> None:
    from beamflow.status import StatusOptions, create_app
    from beamflow.status.server import make_server

    app = create_app(Store(store_path), StatusOptions())
    make_server(app, "127.0.0.1", port, log_level="warning").run()


def wait_up(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"status server on port {port} did not come up in {timeout} s")


def measure(port: int, path: str, requests: int, warmup: int = 5) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times: list[float] = []
    size = 0
    for i in range(warmup + requests):
        t0 = time.perf_counter()
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        elapsed = time.perf_counter() - t0
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {resp.status}: {body[:200]!r}")
        if i >= warmup:
            times.append(elapsed * 1000)
            size = len(body)
    conn.close()
    times.sort()
    return {
        "median_ms": round(statistics.median(times), 2),
        "p95_ms": round(times[min(len(times) - 1, int(0.95 * len(times)))], 2),
        "min_ms": round(times[0], 2),
        "bytes": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=100, help="per case (bounded)")
    parser.add_argument("--dir", type=Path, default=None, help="where the store goes")
    args = parser.parse_args()
    requests = max(5, min(args.requests, 1000))

    from beamflow.status.server import free_port

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        store_path = Path(tmp) / "runs.sqlite"
        t0 = time.perf_counter()
        done_id, failed_id = fill_store(store_path, args.runs)
        fill_s = time.perf_counter() - t0
        port = free_port()
        server = mp.get_context("spawn").Process(
            target=serve, args=(str(store_path), port), daemon=True
        )
        server.start()
        try:
            wait_up(port)
            cases = [
                ("runs_page", "/", True),
                ("api_runs", "/api/runs", True),
                ("runs_page_failed_filter", "/?status=FAILED", False),
                ("api_runs_scan_filter", "/api/runs?scan=sample150", False),
                ("api_runs_last_page", f"/api/runs?offset={max(0, args.runs - 50)}", False),
                ("runs_page_failed_last_hour", "/?status=FAILED&since=1h", False),
                ("api_runs_longest_first", "/api/runs?sort=longest", False),
                ("run_logs", f"/runs/{failed_id}/logs", False),
                ("run_page", f"/runs/{done_id}", False),
                ("api_run", f"/api/runs/{failed_id}", False),
                ("healthz", "/healthz", False),
            ]
            for case, path, targeted in cases:
                result = {
                    "bench": "status",
                    "case": case,
                    "path": path if "/runs/" not in path else path.rsplit("/", 1)[0] + "/{id}",
                    "runs_in_store": args.runs,
                    "requests": requests,
                    **measure(port, path, requests),
                    "server": "uvicorn, own process, loopback, keep-alive",
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "store_fill_s": round(fill_s, 1),
                }
                if targeted:
                    result["target_ms"] = TARGET_MS
                    result["meets_target"] = result["median_ms"] <= TARGET_MS
                print(json.dumps(result), flush=True)
        finally:
            server.terminate()
            server.join(10)


if __name__ == "__main__":
    main()
