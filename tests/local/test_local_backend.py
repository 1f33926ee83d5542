"""The local backend end to end: a simulated scan through ptycho_reconstruct.json, results
on the beamline side, the run in the store with step timings; failures named by step;
runs that outlive (or not) the process that started them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from runs_kit import at_once
from typer.testing import CliRunner

from beamflow import run_backends
from beamflow.cli import app
from beamflow.config import Settings, load_config
from beamflow.runs.backend import RunBackendError
from beamflow.runs.flow_input import flow_input_for
from beamflow.runs.lifecycle import (
    RetryRefused,
    cancel_run,
    follow_run,
    retry_run,
    start_scan_run,
    sync_run,
)
from beamflow.runs.naming import scan_key
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.request import SHARED_FS_FLOW, RunInputError, RunRequest, scan_location
from beamflow.runs.store import Store


def _missing() -> str | None:
    try:
        import beamflow.job.run  # noqa: F401
        import beamflow.simulate  # noqa: F401
    except ImportError as exc:
        return f"needs beamflow.job.run and beamflow.simulate (not importable yet: {exc})"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))

FAST = {"iterations": 4, "preview_every": 0, "checkpoint_every": 2, "device": "cpu"}
FOREVER = {"iterations": 1_000_000, "preview_every": 0, "checkpoint_every": 0, "device": "cpu"}
COMPUTE_URL = "https://compute.actions.globus.org/v3"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from beamflow.simulate import simulate_scan

    ws = tmp_path_factory.mktemp("ws")
    result = CliRunner().invoke(app, ["init", str(ws)])
    assert result.exit_code == 0, result.output
    simulate_scan(ws / "beamline/detector", "s1", positions=40, probe_size=32)
    return ws


@pytest.fixture(scope="module")
def settings(workspace: Path) -> Settings:
    return load_config(workspace / "beamflow.toml")


def engine_leftovers(settings: Settings, pid: int | None = None) -> list[int]:
    """Live processes of the compute engines run from ``settings`` (of process ``pid``)."""
    from beamflow.local.engine import engine_processes

    base = settings.state_dir / "compute-engine"
    dirs = [d for d in base.iterdir() if pid is None or d.name.endswith(f"-{pid}")]
    return [p for d in dirs for p in engine_processes(d)]


@pytest.fixture(scope="module")
def backend(settings: Settings) -> Iterator:
    from beamflow.local import LocalRunBackend

    b = LocalRunBackend(settings, poll_interval=0.05, max_poll_interval=0.5)
    b.register_functions()
    b.register_flows()
    b.warm()
    yield b
    b.close()
    assert engine_leftovers(settings) == [], "compute engine processes left behind"


def engine_of(backend):  # noqa: ANN001, ANN201 - the backend's ComputeEngine
    provider = backend._action_providers()[COMPUTE_URL]
    (endpoint,) = provider.endpoints.values()
    return endpoint.engine


def reconstruction_worker(backend) -> int:  # noqa: ANN001
    """The pid of the engine's worker process running a task now."""
    from beamflow.local.engine import worker_pids

    engine = engine_of(backend)

    def find() -> list[int]:
        tasks = engine.working_dir.iterdir() if engine.working_dir.is_dir() else []
        return [pid for d in tasks for pid in worker_pids(d.resolve())]

    deadline = time.monotonic() + 30
    while not (pids := find()):
        assert time.monotonic() < deadline, "no worker is running a task"
        time.sleep(0.05)
    assert all(pid in engine.processes() for pid in pids)
    return pids[0]


@pytest.fixture
def store(settings: Settings) -> Store:
    return Store(settings.store_path)


def start(settings: Settings, store: Store, backend, scan: Path, **request) -> Run:  # noqa: ANN001
    return start_scan_run(settings, store, backend, RunRequest(scan_path=scan, **request))


def wait_for_step(backend, run_id: str, step: str, status: str = "ACTIVE") -> None:  # noqa: ANN001
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(s.name == step and s.status == status for s in backend.get_run(run_id).steps):
            return
        time.sleep(0.05)
    raise AssertionError(f"{step} never became {status}")


def test_cli_end_to_end_previews_arrive_on_the_beamline(
    workspace: Path,
    backend,
    settings: Settings,
    store: Store,  # noqa: ANN001
) -> None:
    cli = CliRunner()
    config = ["--config", str(workspace / "beamflow.toml")]
    again = [cli.invoke(app, ["register", kind, *config]) for kind in ("functions", "flows")]
    assert all(r.exit_code == 0 for r in again)
    assert all(line.startswith("unchanged ") for r in again for line in r.stdout.splitlines())

    scan = workspace / "beamline/detector/s1"
    params = [f"--param={k}={json.dumps(v) if not isinstance(v, str) else v}"
              for k, v in FAST.items()]  # fmt: skip
    result = cli.invoke(app, ["runs", "start", str(scan), "--wait", "--json", *params, *config])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    run = store.require_run(shown["id"])
    assert run.status == RunStatus.SUCCEEDED
    assert (run.scan_name, run.backend) == ("s1", "local")

    # Product and previews on the beamline side, inside preview_dir.
    preview_dir = Path(settings.beamline.preview_dir)
    assert run.product and Path(run.product).is_file()
    assert Path(run.product).is_relative_to(preview_dir)
    assert run.previews and all(
        Path(p).is_file() and Path(p).is_relative_to(preview_dir) for p in run.previews
    )
    assert run.iteration == FAST["iterations"]
    assert run.result["summary"]["n_frames"] == 40

    # Steps with timings, in order.
    steps = store.steps(run.id)
    assert [s.name for s in steps] == [
        "TransferScanToHPC",
        "Reconstruct",
        "TransferResultsToBeamline",
    ]
    for s in steps:
        assert s.status == "SUCCEEDED"
        assert s.started_at and s.finished_at and s.finished_at >= s.started_at
    assert steps[0].details["action"]["details"]["files_transferred"] >= 2

    # The run's record survives this process: a fresh backend reads how it ended.
    from beamflow.local import LocalRunBackend

    info = LocalRunBackend(settings).get_run(run.backend_run_id)
    assert info.status == RunStatus.SUCCEEDED
    assert [s.name for s in info.steps] == [s.name for s in steps]


class Shared:
    """The module's backend, for a command that closes the one it opens: it stays open."""

    def __init__(self, backend) -> None:  # noqa: ANN001
        self._backend = backend

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._backend, name)

    def close(self) -> None:
        pass


def test_runs_start_wait_tells_the_verdict_and_strict_exits_2_on_suspect(
    workspace: Path, backend, store: Store, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """A near-field scan reconstructed as far field: the flow succeeds, the result is
    suspect, and the terminal says so (the page says "do not trust"; so must the CLI)."""
    from beamflow.simulate import simulate_scan

    simulate_scan(workspace / "beamline/detector", "nf", positions=40, probe_size=32,
                  propagation="near-field")
    monkeypatch.setattr(run_backends, "get_run_backend", lambda settings: Shared(backend))
    params = [f"--param={k}={v}" for k, v in {**FAST, "propagation": "far-field"}.items()]
    result = CliRunner().invoke(app, [
        "runs", "start", str(workspace / "beamline/detector/nf"), "--wait", "--strict", *params,
        "--config", str(workspace / "beamflow.toml")])  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("run ") and "  SUCCEEDED  nf" in lines[0]
    run = store.require_run(lines[0].split()[1])
    assert run.verdict == "suspect" and len(run.verdict_reasons) > 1
    assert lines[1] == f"  verdict   SUSPECT: {run.verdict_reasons[0]}"
    assert "try --propagation near-field" in lines[1]
    more = len(run.verdict_reasons) - 1
    assert lines[2] == (f"            ({more} more reason{'s' if more > 1 else ''}: "
                        f"`beamflow runs show {run.id[:8]}`)")
    listed = CliRunner().invoke(app, ["runs", "list", "--scan", "/nf/", "--config",
                                      str(workspace / "beamflow.toml")])  # fmt: skip
    assert "SUSPECT" in listed.stdout


def _broken_scan(workspace: Path, name: str) -> Path:
    scan = workspace / "beamline/detector" / name
    scan.mkdir()
    (scan / f"{name}_master.h5").write_bytes(b"this is not HDF5")
    return scan


def test_a_corrupt_scan_fails_with_its_cause_first_in_the_users_path(
    workspace: Path,
    settings: Settings,
    backend,
    store: Store,  # noqa: ANN001
) -> None:
    scan = _broken_scan(workspace, "bad1")
    run = start(settings, store, backend, scan, params=FAST)
    assert run.status == RunStatus.ACTIVE and run.backend_run_id
    run = follow_run(store, backend, run, poll_seconds=0.05)
    assert run.status == RunStatus.FAILED
    # The cause first, the beamline's file (not the cluster's copy), no class names.
    assert run.error == (
        "beamline/detector/bad1/bad1_master.h5 is not an HDF5 file (no HDF5 signature)")
    assert (run.error_step, run.error_kind) == ("Reconstruct", "bad_input")
    statuses = {s.name: s.status for s in store.steps(run.id)}
    assert statuses["TransferScanToHPC"] == "SUCCEEDED"
    assert statuses["Reconstruct"] == "FAILED"
    assert "TransferResultsToBeamline" not in statuses
    # The step and the whole chain stay in the run's details and its events.
    chain = run.result["failure"]["chain"]
    key = scan_key(scan_location(settings, scan))
    hpc_copy = str(Path(settings.hpc.scratch_dir) / key / "raw")
    assert "ScanFormatError" in chain and "ValueError" in chain and hpc_copy in chain
    (ended,) = [e for e in store.events(run.id) if e.code == "RunFailed"]
    assert "Reconstruct" in ended.message and "ScanFormatError" in ended.message

    # A retry would not help: it is refused, and no run is made.
    with pytest.raises(RetryRefused, match="a retry would not help"):
        retry_run(settings, run.id, store=store, backend=backend)
    assert [r.id for r in store.list_runs(scan=str(scan))] == [run.id]
    shown = CliRunner().invoke(app, ["runs", "show", run.id, "--config",
                                     str(workspace / "beamflow.toml")])  # fmt: skip
    assert "beamline/detector/bad1/bad1_master.h5 is not an HDF5 file" in shown.output
    assert "failed in Reconstruct (bad_input)" in shown.output
    assert "ScanFormatError" in shown.output.split("chain", 1)[1]


def test_a_failing_transfer_names_the_step(
    workspace: Path,
    settings: Settings,
    backend,
    store: Store,  # noqa: ANN001
) -> None:
    scan = workspace / "beamline/detector/s2"
    scan.mkdir()
    (scan / "s2_master.h5").write_bytes(b"x")
    # Something in the way on the HPC side: the raw directory is a file.
    work = Path(settings.hpc.scratch_dir) / scan_key(scan_location(settings, scan))
    work.mkdir(parents=True)
    (work / "raw").write_bytes(b"in the way")
    run = follow_run(
        store, backend, start(settings, store, backend, scan), poll_seconds=0.05
    )
    assert run.status == RunStatus.FAILED
    assert (run.error_step, run.error_kind) == ("TransferScanToHPC", "transient")
    assert "NOT_A_DIRECTORY" in run.result["failure"]["chain"]
    assert "NOT_A_DIRECTORY" not in run.error, run.error


def test_bad_input_and_unregistered_flows_fail_to_start(
    settings: Settings,
    backend,
    store: Store,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    with pytest.raises(RunBackendError, match="does not match its schema"):
        backend.start_run("ptycho_reconstruct", {"run_name": "x"}, label="x", tags=[])
    from beamflow.local import LocalRunBackend

    empty = LocalRunBackend(settings.model_copy(update={"state_dir": tmp_path}))
    with pytest.raises(RunBackendError, match="register flows"):
        empty.start_run("ptycho_reconstruct", {}, label="x", tags=[])
    # Through the run path the run is recorded as FAILED with the reason.
    scan = Path(settings.beamline.detector_dir) / "s1"
    run = start(settings, store, empty, scan)
    assert run.status == RunStatus.FAILED and "register" in run.error
    with pytest.raises(RunInputError, match="unknown parameter 'colour'"):
        start(settings, store, backend, scan, params={"colour": "red"})


def test_a_run_whose_process_died_is_reported_lost(
    workspace: Path,
    settings: Settings,
    backend,
    store: Store,  # noqa: ANN001
) -> None:
    script = f"""
import os, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from pathlib import Path
from beamflow.config import load_config
from beamflow.local import LocalRunBackend
from beamflow.local.engine import worker_pids
from beamflow.runs.flow_input import flow_input_for
s = load_config(Path({str(workspace / "beamflow.toml")!r}))
body = flow_input_for(s, {str(workspace / "beamline/detector/s1")!r}, {FOREVER!r}, "lost-1")
b = LocalRunBackend(s)
run_id = b.start_run("ptycho_reconstruct", body, label="lost", tags=[])
print(run_id, flush=True)
(endpoint,) = b._action_providers()[{COMPUTE_URL!r}].endpoints.values()
tasks = endpoint.engine.working_dir
deadline = time.monotonic() + 60  # until its reconstruction runs in the engine's worker
while time.monotonic() < deadline and not (
        tasks.is_dir() and any(worker_pids(d.resolve()) for d in tasks.iterdir())):
    time.sleep(0.1)
print("computing" if time.monotonic() < deadline else "never computed", flush=True)
os._exit(0)  # the process ends with its run still going
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    run_id, computing = out.stdout.strip().splitlines()[-2:]
    assert computing == "computing"
    record = json.loads((settings.state_dir / "local_runs" / f"{run_id}.json").read_text())
    assert record["status"] == "ACTIVE"  # what the dead process left behind

    info = backend.get_run(run_id)
    assert info.status == RunStatus.FAILED
    assert "lost: the process running it ended" in info.error
    # Its compute engine went with it (the pool watches the process that owns it).
    deadline = time.monotonic() + 15
    while engine_leftovers(settings, record["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine_leftovers(settings, record["pid"]) == []
    record = json.loads((settings.state_dir / "local_runs" / f"{run_id}.json").read_text())
    assert record["status"] == "FAILED"

    # The store learns it through the shared run path (the agent retries such runs).
    run = store.create_run(scan_name="s1", scan_path=str(workspace / "beamline/detector/s1"),
                           flow="ptycho_reconstruct", backend="local")
    run = store.update_run(run.id, status=RunStatus.ACTIVE, backend_run_id=run_id)
    run = sync_run(store, backend, run)
    assert run.status == RunStatus.FAILED and run.error_kind == "lost"
    assert run.error.startswith("lost: the process running it ended")


def test_cancel_from_another_backend_object_stops_the_run(
    settings: Settings,
    backend,
    store: Store,  # noqa: ANN001
) -> None:
    from beamflow.local import LocalRunBackend

    scan = Path(settings.beamline.detector_dir) / "s1"
    run = start(settings, store, backend, scan, params=FOREVER)
    wait_for_step(backend, run.backend_run_id, "Reconstruct")
    # While it runs, the store shows how far the reconstruction got.
    deadline = time.monotonic() + 30
    while not (run := sync_run(store, backend, run)).iteration:
        assert time.monotonic() < deadline, "no iteration progress reported"
        time.sleep(0.1)
    assert run.iterations_total == FOREVER["iterations"]
    assert run.current_step == "Reconstruct" and run.status == RunStatus.ACTIVE
    # As `beamflow runs cancel` does from another process: only the record is shared.
    other = LocalRunBackend(settings)
    run = cancel_run(settings, run.id, store=store, backend=other)
    run = follow_run(store, other, run, poll_seconds=0.1, timeout=60)
    assert run.status == RunStatus.CANCELLED
    assert {s.name: s.status for s in store.steps(run.id)}["Reconstruct"] == "CANCELLED"


def pool_processes(backend) -> set[int]:  # noqa: ANN001
    def command(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    return {p for p in engine_of(backend).processes()
            if b"process_worker_pool" in command(p) or b"HTEX interchange" in command(p)}


def wait_for_iteration(store: Store, backend, run, at_least: int):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + 60
    while (run := sync_run(store, backend, run)).iteration is None or (
        run.iteration < at_least
    ):
        assert run.status == RunStatus.ACTIVE, run.error
        assert time.monotonic() < deadline, "no iteration progress reported"
        time.sleep(0.05)
    return run


def test_cancel_stops_the_reconstruction_which_checkpoints_and_the_next_run_resumes(
    settings: Settings, backend, store: Store  # noqa: ANN001
) -> None:
    """Cancel sends SIGTERM to the reconstruction's worker (that one only): it saves a
    checkpoint at the iteration boundary, although none was due, and exits."""
    import signal

    scan = Path(settings.beamline.detector_dir) / "s1"
    rare = {**FOREVER, "checkpoint_every": 100_000}
    run = start(settings, store, backend, scan, params=rare)
    run = wait_for_iteration(store, backend, run, 3)
    worker = reconstruction_worker(backend)
    pool = pool_processes(backend)
    assert len(pool) == 2  # the interchange and the worker pool's manager
    run = cancel_run(settings, run.id, store=store, backend=backend)
    run = follow_run(store, backend, run, poll_seconds=0.05, timeout=60)
    assert run.status == RunStatus.CANCELLED
    assert pool_processes(backend) == pool  # only the worker was stopped
    with pytest.raises(ProcessLookupError):
        os.kill(worker, signal.SIGCONT)
    stopped_at = run.iteration
    resumed = follow_run(store, backend, start(
        settings, store, backend, scan, params={**FAST, "iterations": stopped_at + 2}),
        poll_seconds=0.05)  # fmt: skip
    assert resumed.status == RunStatus.SUCCEEDED, resumed.error
    assert resumed.result["summary"]["resumed_from_iteration"] >= 3


def test_kill_9_of_the_worker_fails_the_run_cleanly_and_one_retry_resumes(
    settings: Settings, backend, store: Store  # noqa: ANN001
) -> None:
    import signal

    scan = Path(settings.beamline.detector_dir) / "s1"
    params = {**FOREVER, "iterations": 60, "checkpoint_every": 2}
    run = start(settings, store, backend, scan, params=params)
    run = wait_for_iteration(store, backend, run, 5)
    # The kill comes after this run committed a checkpoint (they are written beside the
    # iterations, within a time budget), so what the retry resumes from is this run's.
    work = Path(settings.hpc.scratch_dir) / scan_key(scan_location(settings, scan))
    latest = work / "checkpoints" / "LATEST.json"
    deadline = time.monotonic() + 60
    while not (latest.exists() and json.loads(latest.read_text())["time"] > run.started_at):
        assert time.monotonic() < deadline, "no checkpoint committed"
        time.sleep(0.05)
    saved = json.loads(latest.read_text())["iteration"]
    os.kill(reconstruction_worker(backend), signal.SIGKILL)
    run = follow_run(store, backend, run, poll_seconds=0.05, timeout=60)
    assert run.status == RunStatus.FAILED and run.error_step == "Reconstruct"
    assert run.error.startswith("the worker process running reconstruct ended")
    assert run.error_kind == "lost" and "WorkerLost" in run.result["failure"]["chain"]
    # Two retries at once (the page and a terminal): one run is made and started.
    outcomes = at_once(lambda: retry_run(settings, run.id, store=Store(settings.store_path),
                                         backend=backend), 2, RetryRefused)  # fmt: skip
    (new,) = [o for o in outcomes if not isinstance(o, Exception)]
    (refused,) = [o for o in outcomes if isinstance(o, RetryRefused)]
    assert refused.retry_id == new.id
    retry = follow_run(store, backend, new, poll_seconds=0.05)
    assert retry.status == RunStatus.SUCCEEDED, retry.error
    assert retry.result["summary"]["resumed_from_iteration"] >= saved >= 1
    assert [r.id for r in store.list_runs(limit=None) if r.parent_run_id == run.id] == [new.id]


def test_closing_the_backend_leaves_running_runs_marked_lost(settings: Settings) -> None:
    from beamflow.local import LocalRunBackend

    mine = LocalRunBackend(settings, poll_interval=0.05, max_poll_interval=0.5)
    scan = Path(settings.beamline.detector_dir) / "s1"
    body = flow_input_for(settings, scan, FOREVER, "closing-1")
    run_id = mine.start_run("ptycho_reconstruct", body, label="closing", tags=[])
    engine = None
    try:
        wait_for_step(mine, run_id, "Reconstruct")
        engine = engine_of(mine)
        # The step starts as the task is handed over; the engine's processes may take a few
        # seconds more to appear on a loaded machine.
        deadline = time.monotonic() + 60
        while not engine.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert engine.processes(), "the compute engine started no process"
    finally:
        mine.close()
    assert engine.processes() == []
    info = LocalRunBackend(settings).get_run(run_id)
    assert info.status == RunStatus.FAILED
    assert "lost" in info.error
    assert (
        os.getpid()
        == json.loads((settings.state_dir / "local_runs" / f"{run_id}.json").read_text())["pid"]
    )


def test_shared_filesystem_flow_writes_results_in_place(
    settings: Settings,
    backend,
    store: Store,  # noqa: ANN001
) -> None:
    scan = Path(settings.beamline.detector_dir) / "s1"
    run = start(settings, store, backend, scan, params=FAST, flow=SHARED_FS_FLOW)
    run = follow_run(store, backend, run, poll_seconds=0.05)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert [s.name for s in store.steps(run.id)] == ["Reconstruct"]
    assert run.product and Path(run.product).is_file()
    assert Path(run.product).parent == Path(settings.beamline.preview_dir) / run.result["run_name"]
