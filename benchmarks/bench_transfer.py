"""Local transfer throughput against ``cp`` on the same files; one JSON line per result.

    .venv/bin/python benchmarks/bench_transfer.py [--size-mb 512] [--repeat 3] [--dir /tmp]

Cases: one large file, and many files in a directory tree (a scan's data files), each with
the page cache warm (what a detector computer copying a scan it just wrote sees) and cold
(source pages dropped with posix_fadvise before every run, so both tools read the disk).
Tools: ``cp -r`` (GNU coreutils, the target), beamflow without checksums, and beamflow with
``verify_checksum`` (source hashed during the copy, destination re-read and hashed) using
XXH3-128 (the default), SHA-256 and CRC-32.
Tools run in interleaved rounds; each result gives the median of ``--repeat`` runs
(``ratio_vs_cp``: throughput / cp's) and the best (``ratio_vs_cp_best``), with the load
average, since hashing competes with whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from beamflow.local.collection_paths import Collections
from beamflow.local.transfer_task import TransferRequest, TransferTask

SRC_ID = "11111111-1111-4111-8111-111111111111"
DST_ID = "22222222-2222-4222-8222-222222222222"


def make_files(root: Path, case: str, total: int) -> None:
    root.mkdir(parents=True)
    block = os.urandom(4 << 20)

    def fill(path: Path, size: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            left = size
            while left > 0:
                fh.write(block[: min(left, len(block))])
                left -= len(block)

    if case == "one_large_file":
        fill(root / "scan_data_000001.h5", total)
    else:
        n = 64
        for i in range(n):
            fill(root / f"sub{i % 4}" / f"scan_data_{i:06d}.h5", total // n)


def drop_cache(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


CPU: dict[str, list[float]] = {}


def timed(run: Callable[[], None], prepare: Callable[[], None], tool: str = "") -> float:
    """Wall seconds of ``run``; its CPU seconds (this process and cp) go to CPU[tool]:
    unlike wall time, CPU per byte does not depend on what else the machine is doing."""
    prepare()
    cpu = _cpu()
    start = time.perf_counter()
    run()
    wall = time.perf_counter() - start
    CPU.setdefault(tool, []).append(_cpu() - cpu)
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=512, help="bytes per case (MiB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--cases", default="one_large_file,many_files")
    parser.add_argument("--caches", default="warm,cold")
    args = parser.parse_args()
    total = args.size_mb << 20

    work = Path(tempfile.mkdtemp(prefix="bench-transfer-", dir=args.dir))
    try:
        for case in args.cases.split(","):
            src_root, dst_root = work / "src", work / "dst"
            shutil.rmtree(src_root, ignore_errors=True)
            make_files(src_root / "scan", case, total)
            dst_root.mkdir(exist_ok=True)
            nbytes = sum(p.stat().st_size for p in src_root.rglob("*") if p.is_file())
            collections = Collections({SRC_ID: src_root, DST_ID: dst_root})

            def cp(src_root: Path = src_root, dst_root: Path = dst_root) -> None:
                subprocess.run(
                    ["cp", "-r", str(src_root / "scan"), str(dst_root / "scan")], check=True
                )

            def beamflow(
                verify: bool, algorithm: str = "xxh3_128", collections: Collections = collections
            ) -> Callable[[], None]:
                def go() -> None:
                    request = TransferRequest(
                        source_endpoint=SRC_ID,
                        destination_endpoint=DST_ID,
                        DATA=[
                            {"source_path": "/scan", "destination_path": "/scan", "recursive": True}
                        ],
                        verify_checksum=verify,
                    )
                    task = TransferTask(request, collections, checksum_algorithm=algorithm)
                    task.run()
                    if task.status != "SUCCEEDED":
                        raise RuntimeError(f"transfer failed: {task.fatal_error}")

                return go

            tools = {
                "cp": cp,
                "beamflow": beamflow(False),
                "beamflow_verify_xxh3_128": beamflow(True, "xxh3_128"),
                "beamflow_verify_sha256": beamflow(True, "sha256"),
                "beamflow_verify_crc32": beamflow(True, "crc32"),
            }
            for cache in args.caches.split(","):

                def prepare(
                    cache: str = cache, src_root: Path = src_root, dst_root: Path = dst_root
                ) -> None:
                    shutil.rmtree(dst_root / "scan", ignore_errors=True)
                    os.sync()
                    if cache == "cold":
                        drop_cache(src_root)

                results: dict[str, float] = {}
                best: dict[str, float] = {}
                samples: dict[str, list[float]] = {tool: [] for tool in tools}
                for fn in tools.values():
                    if cache == "warm":
                        timed(fn, prepare)  # warm the source pages and the code paths
                # Interleaved rounds, so a burst of other load hits every tool alike.
                for _ in range(args.repeat):
                    for tool, fn in tools.items():
                        samples[tool].append(timed(fn, prepare, f"{case}/{cache}/{tool}"))
                for tool, times in samples.items():
                    results[tool] = statistics.median(times)
                    best[tool] = min(times)
                for tool, seconds in results.items():
                    print(
                        json.dumps(
                            {
                                "benchmark": "transfer",
                                "case": case,
                                "cache": cache,
                                "tool": tool,
                                "bytes": nbytes,
                                "seconds": round(seconds, 4),
                                "mib_per_s": round(nbytes / seconds / (1 << 20), 1),
                                "ratio_vs_cp": round(results["cp"] / seconds, 3),
                                "best_seconds": round(best[tool], 4),
                                "ratio_vs_cp_best": round(best["cp"] / best[tool], 3),
                                "cpu_s_per_gib": round(
                                    statistics.median(CPU[f"{case}/{cache}/{tool}"])
                                    * (1 << 30)
                                    / nbytes,
                                    3,
                                ),
                                "repeat": args.repeat,
                                "cpus": os.cpu_count(),
                                "machine": platform.machine(),
                                # Other work on the machine competes for the CPU that hashing needs.
                                "loadavg_1m": round(os.getloadavg()[0], 2),
                            }
                        ),
                        flush=True,
                    )
            shutil.rmtree(dst_root / "scan", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
