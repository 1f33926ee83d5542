"""A real scheduler, end to end: beamflow's compute function through the endpoint's engine
on a one-node Slurm cluster.

Debian's slurm-wlm and munge (installed when missing; root only, as in CI) run a one-node
cluster on this machine (tests/kits/slurm_kit.py). The project's Slurm endpoint template,
rendered with CPU-only variables exactly as the multi-user endpoint renders it and loaded
with the endpoint's own loader, gives a GlobusComputeEngine with Parsl's SlurmProvider. The
function goes in as the SDK ships it (source text through ComputeSerializer, a messagepack
Task) and its result comes back as the endpoint gets it (a messagepack Result). Asserted:
the task ran inside a Slurm job started by the engine, the reconstruction wrote its product
and its checkpoint, and after shutdown no job, daemon or Parsl process is left.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from endpoint_kit import DEPLOY, user_config
from globus_compute_common import messagepack
from globus_compute_common.messagepack.message_types import Result, Task
from globus_compute_endpoint.engines import GlobusComputeEngine
from globus_compute_endpoint.engines.base import GCFuture
from globus_compute_sdk.serialize import ComputeSerializer, PureSourceTextInspect
from slurm_kit import OneNodeSlurm, installed

from functions.reconstruct import reconstruct

pytestmark = pytest.mark.slurm

# The first task waits for the engine's scaling strategy (every 5 s) to submit a job, for
# Slurm to start it, and for the worker pool to connect: seconds, but a slow CI machine
# gets room.
TASK_TIMEOUT_S = 240
VENV = Path(sys.prefix)  # the environment running the tests: beamflow and the endpoint


def where_am_i() -> dict[str, Any]:
    """Sent as source like `reconstruct`: where the worker runs."""
    import os
    import shutil

    return {
        "job": os.environ.get("SLURM_JOB_ID"),
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "endpoint_cli": shutil.which("globus-compute-endpoint"),
        "virtual_env": os.environ.get("VIRTUAL_ENV"),
        "pid": os.getpid(),
    }


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[OneNodeSlurm]:
    reason = installed()
    if reason:
        pytest.skip(reason)
    # Short path: the MUNGE socket lives here (Unix socket names are at most 108 bytes).
    base = Path(tempfile.mkdtemp(prefix="bf-slurm-"))
    slurm = OneNodeSlurm(base)
    failed_before = request.session.testsfailed
    try:
        slurm.start()
        yield slurm
    finally:
        slurm.stop()  # raises if a daemon or job step daemon outlives it
        if request.session.testsfailed == failed_before:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"Slurm's configuration and logs are kept in {base}")


def submit(engine: GlobusComputeEngine, function: Any, **kwargs: Any) -> Any:
    """Ship `function(**kwargs)` as the SDK does and return its value, or raise with the
    remote traceback."""
    serde = ComputeSerializer(strategy_code=PureSourceTextInspect())
    buffer = serde.pack_buffers(
        [serde.serialize(function), serde.serialize(()), serde.serialize(kwargs)]
    )
    task_id = uuid.uuid4()
    future = GCFuture(task_id)
    engine.submit(future, messagepack.pack(Task(task_id=task_id, task_buffer=buffer)), {})
    result = messagepack.unpack(future.result(timeout=TASK_TIMEOUT_S))
    assert isinstance(result, Result) and result.task_id == task_id
    if result.is_error:
        raise AssertionError(f"{function.__name__} failed on the worker:\n{result.data}")
    return serde.deserialize(result.data)


def job_logs(run_dir: Path) -> str:
    """The batch jobs' own output, for a failure message."""
    parts = [
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted(run_dir.rglob("*.std*"))
    ]
    return "\n".join(parts) or "(no job output)"


@pytest.mark.timeout(900)  # may install slurm-wlm and munge first
def test_reconstruction_runs_in_a_slurm_job_through_the_endpoint_engine(
    cluster: OneNodeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from beamflow.simulate import simulate_scan

    for name, value in cluster.env.items():
        monkeypatch.setenv(name, value)  # sbatch, squeue, scancel, and the job's srun
    # The engine starts its interchange through the `globus-compute-endpoint` executable.
    monkeypatch.setenv("PATH", f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}")
    # Set on the node only by `activate`, run by the template's worker_init (the job
    # inherits this process's environment, PATH included).
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)

    variables = {
        "partition": cluster.partition,
        "gpus_per_node": 0,
        "cpu_workers_per_node": 1,
        "walltime": "00:10:00",
        "max_blocks": 1,
        "beamflow_env": str(VENV),
        "omp_threads": 1,
    }
    config = user_config(DEPLOY / "slurm-gpu", variables)
    engine = config.engine
    assert isinstance(engine, GlobusComputeEngine)
    provider = engine.executor.provider
    assert type(provider).__name__ == "SlurmProvider"
    assert f'source "{VENV}"/bin/activate' in provider.worker_init

    hpc = tmp_path / "hpc"
    master = simulate_scan(hpc / "raw", "s1", positions=40, probe_size=32)
    out = hpc / "runs" / "r1"
    ckpt = hpc / "ckpt"
    run_dir = tmp_path / "endpoint"
    # Children this process already has (earlier tests' helpers, multiprocessing's
    # resource tracker...): not the engine's.
    children_before = set(_children(os.getpid())) | cluster.pids
    engine.start(endpoint_id=uuid.uuid4(), run_dir=str(run_dir))
    try:
        try:
            where = submit(engine, where_am_i)
            summary = submit(
                engine,
                reconstruct,
                scan_path=str(master.parent),
                output_dir=str(out),
                checkpoint_dir=str(ckpt),
                allowed_roots=[str(hpc)],
                run_name="r1",
                parameters={
                    "iterations": 3,
                    "checkpoint_every": 1,
                    "preview_every": 0,
                    "device": "cpu",
                },
            )
        except Exception as exc:
            raise AssertionError(f"{exc}\n{job_logs(run_dir)}") from exc
        jobs = set(engine.executor.blocks_to_job_id.values())
    finally:
        engine.shutdown()

    # The worker ran inside the Slurm job the engine submitted, with no GPU pinned, in
    # the environment the template's worker_init activated.
    assert where["job"] in jobs, (where, jobs)
    assert where["cuda"] in (None, "")
    assert where["endpoint_cli"] == str(VENV / "bin" / "globus-compute-endpoint")
    assert where["virtual_env"] == str(VENV)

    assert summary["iterations"] == 3 and summary["n_frames"] == 40
    assert summary["device"] == "cpu"
    assert Path(summary["product"]) == out / "product.h5"
    assert (out / "product.h5").stat().st_size > 0
    assert Path(summary["checkpoint_dir"]) == ckpt
    latest = json.loads((ckpt / "LATEST.json").read_text())
    assert latest["iteration"] == 3, latest
    assert (ckpt / Path(latest["file"]).name).stat().st_size > 0

    # The engine's shutdown cancels its own job (no scancel from here), which ends the
    # worker; its interchange, a child of this process, is gone.
    deadline = time.monotonic() + 60
    while (cluster.jobs() or Path(f"/proc/{where['pid']}").exists()) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert cluster.jobs() == [], "the engine's shutdown left its Slurm job"
    assert not Path(f"/proc/{where['pid']}").exists(), "the worker outlived its job"
    left = {p: name for p, name in _children(os.getpid()).items() if p not in children_before}
    assert not left, f"engine processes left: {left}"


def _children(pid: int) -> dict[int, str]:
    """Live child processes of `pid` (the interchange is one while the engine runs)."""
    found: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
        head, _, rest = text.rpartition(")")
        fields = rest.split()
        if fields and fields[0] != "Z" and int(fields[1]) == pid:
            found[int(stat.parent.name)] = head.partition("(")[2]
    return found
