"""The local Compute action provider on Globus Compute's own engine (GlobusComputeEngine:
Parsl's interchange and worker pool, LocalProvider): results as the service reports them,
exceptions as FAILED actions with the error, functions shipped as their source text (as to
an endpoint), lost workers, cancel reaching one worker only, waiting tasks, bounded
concurrency, GPU pinning, and no process left behind (closed, or owner killed with -9).

The functions below run in the engine's workers. They travel as their source text, as
beamflow registers functions with Globus Compute, so each is self-contained (imports inside).
One engine serves the module: starting one takes seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from process_kit import pid_running

from beamflow.config import ConfigError
from beamflow.local.actions import ActionUnableToRunError
from beamflow.local.compute import LocalComputeProvider, detect_gpus
from beamflow.local.engine import (
    ComputeEngine,
    default_engine_yaml,
    engine_processes,
    load_engine,
    parse_error,
    worker_pids,
)

ENDPOINT = "33333333-3333-4333-8333-333333333333"
GPUS = ["4", "7"]


# -- functions run in the workers --------------------------------------------------------------
def add(a: int, b: int = 0, *, scale: int = 1) -> dict[str, Any]:
    import os

    return {"sum": (a + b) * scale, "pid": os.getpid(), "cwd": os.getcwd()}


def boom(scan: str) -> None:
    raise ValueError(f"scan {scan}: frames and positions disagree (40 vs 39)")


def die() -> None:
    import os

    os._exit(3)


def sleep_then(seconds: float, marker: str | None = None) -> dict:
    """Sleep, noting start and end; on SIGTERM, write ``marker`` (a checkpoint) and exit 143,
    as a reconstruction does."""
    import os
    import signal
    import sys
    import time

    def checkpoint(*_: object) -> None:
        if marker:
            with open(marker, "w") as fh:
                fh.write(str(os.getpid()))
        sys.exit(143)

    signal.signal(signal.SIGTERM, checkpoint)
    start = time.time()
    if marker:
        with open(marker + ".pid", "w") as fh:
            fh.write(str(os.getpid()))
    time.sleep(seconds)
    return {"start": start, "end": time.time(), "pid": os.getpid()}


def environment() -> dict[str, str | None]:
    import os
    import time

    time.sleep(0.5)  # long enough that the second task goes to the other worker
    return {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}


def not_json() -> object:
    return object()


def not_self_contained() -> str:
    return os.getcwd()  # `os` is this module's import: there is none on an endpoint


_NO_SOURCE: dict[str, Any] = {}
exec("def made_in_memory():\n    return 1\n", _NO_SOURCE)  # no file holds its source

FUNCTIONS = {
    "f-add": add,
    "f-boom": boom,
    "f-die": die,
    "f-sleep": sleep_then,
    "f-env": environment,
    "f-object": not_json,
    "f-module": not_self_contained,
    "f-nosource": _NO_SOURCE["made_in_memory"],
}


# -- fixtures ------------------------------------------------------------------------------------
def engine_yaml(tmp: Path) -> str:
    """Two workers pinned to GPUs 4 and 7. Parsl's worker remaps the ids when nvidia-smi
    answers; a failing nvidia-smi first on the workers' PATH keeps this test off the host's
    GPUs."""
    fake = tmp / "fakebin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (fake / "nvidia-smi").chmod(0o755)
    text = default_engine_yaml(2, GPUS)
    return text + f"    worker_init: export PATH={fake}:$PATH\n"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComputeEngine]:
    tmp = tmp_path_factory.mktemp("engine")
    e = ComputeEngine.from_yaml(engine_yaml(tmp), "test", tmp / "run", endpoint_id=ENDPOINT)
    yield e
    e.close()
    assert e.processes() == [], "engine processes left after close"


@pytest.fixture(scope="module")
def provider(engine: ComputeEngine) -> Iterator[LocalComputeProvider]:
    p = LocalComputeProvider({ENDPOINT: engine}, FUNCTIONS.get, cancel_grace=10)
    p.warm()
    yield p
    p.close()


def body(*tasks: dict[str, Any]) -> dict[str, Any]:
    return {"endpoint_id": ENDPOINT, "tasks": list(tasks)}


def task(function_id: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"function_id": function_id, "args": list(args), "kwargs": kwargs}


def finish(p: LocalComputeProvider, b: dict[str, Any]) -> Any:
    status = p.wait(p.start(b, None).action_id, timeout=120)
    assert status.status in ("SUCCEEDED", "FAILED"), status
    return status


def wait_for(check: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def read_pid(path: Path) -> int:
    return int(wait_for(lambda: path.is_file() and path.read_text(), f"{path}"))


# -- tests ---------------------------------------------------------------------------------------
def test_results_in_the_service_layout_from_the_engines_workers(
    provider: LocalComputeProvider, engine: ComputeEngine
) -> None:
    status = finish(provider, body(task("f-add", 2, 3, scale=10), task("f-add", 1)))
    assert status.status == "SUCCEEDED"
    assert [r["sum"] for r in status.details["result"]] == [50, 1]
    outputs = [r["output"] for r in status.details["results"]]
    assert outputs == status.details["result"]
    assert all(r["task_id"] for r in status.details["results"])
    assert status.completion_time is not None
    # Ran in a worker of the engine's pool (a process carrying the engine's mark), each in
    # its own sandbox, which is removed afterwards.
    pids = set(engine.processes())
    assert all(r["pid"] != os.getpid() and r["pid"] in pids for r in outputs)
    assert all(Path(r["cwd"]).parent == engine.working_dir.resolve() for r in outputs)
    # The task id the action reports is the one the engine ran it under (its sandbox).
    assert [Path(r["cwd"]).name for r in outputs] == [
        r["task_id"] for r in status.details["results"]]  # fmt: skip
    assert not any(Path(r["cwd"]).exists() for r in outputs)
    commands = {_cmdline(p) for p in pids}  # a pool process may end between the two looks
    assert any(b"process_worker_pool" in c for c in commands)
    assert any(b"parsl: HTEX interchange" in c for c in commands)  # its process title
    assert engine.engine.executor.interchange_proc.pid in pids


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except FileNotFoundError:
        return b""


def test_an_exception_fails_the_action_with_type_and_message(
    provider: LocalComputeProvider,
) -> None:
    status = finish(provider, body(task("f-boom", "scan7")))
    assert status.status == "FAILED"
    error = status.details["error"]
    assert error["type"] == "ValueError"
    assert "scan scan7: frames and positions disagree" in error["message"]
    assert "Traceback" in error["traceback"]
    assert status.details["exception"].startswith("ValueError: scan scan7")
    # The worker survives a Python exception and runs the next task.
    assert finish(provider, body(task("f-add", 1, 1))).status == "SUCCEEDED"


def test_functions_travel_as_source_as_to_an_endpoint(provider: LocalComputeProvider) -> None:
    # A function that leans on its module's imports fails here as it would at the facility.
    status = finish(provider, body(task("f-module")))
    assert status.status == "FAILED"
    assert status.details["error"]["type"] == "NameError"
    assert "'os' is not defined" in status.details["error"]["message"]
    # One without source text cannot be shipped at all: refused before it runs.
    with pytest.raises(ActionUnableToRunError, match="cannot ship function made_in_memory"):
        provider.start(body(task("f-nosource")), None)


def test_a_dead_worker_fails_its_task_and_is_replaced(provider: LocalComputeProvider) -> None:
    status = finish(provider, body(task("f-die")))
    assert status.status == "FAILED"
    assert status.details["error"]["type"] == "WorkerLost"
    assert "the worker process running die ended" in status.details["error"]["message"]
    assert finish(provider, body(task("f-add", 4))).details["result"][0]["sum"] == 4


def test_kill_9_of_a_worker_fails_its_task_cleanly(
    provider: LocalComputeProvider, tmp_path: Path
) -> None:
    marker = tmp_path / "ck"
    started = provider.start(body(task("f-sleep", 120, str(marker))), None)
    os.kill(read_pid(Path(f"{marker}.pid")), signal.SIGKILL)
    status = provider.wait(started.action_id, timeout=60)
    assert status.status == "FAILED"
    assert status.details["error"]["type"] == "WorkerLost"
    assert not marker.exists()  # SIGKILL: no chance to save
    assert finish(provider, body(task("f-add", 6))).details["result"][0]["sum"] == 6


def idle_workers(engine: ComputeEngine) -> list[int]:
    """The pool's workers, once all of them are up and have had time to sit idle."""
    workers = wait_for(lambda: len(w := engine.workers()) == engine.capacity and w, "workers",
                       timeout=180)  # a fresh pool on a busy machine
    time.sleep(0.5)
    return workers


def retried_by_the_agent(error: dict[str, Any]) -> bool:
    """Whether the agent's rules retry a run whose Reconstruct step failed with this compute
    error: the kind is read from the flow's failure record as the run path reads it."""
    import json

    from beamflow.runs.backend import FlowRunInfo
    from beamflow.runs.failures import failure_of
    from beamflow.runs.records import Run, RunStatus
    from edge_agent.policy import is_transient

    cause = json.dumps({"status": "FAILED", "details": {"error": error}})
    info = FlowRunInfo(backend_run_id="b", status=RunStatus.FAILED, error="ReconstructFailed",
                       output={"failure": {"step": "Reconstruct", "error": {
                           "Error": "ActionFailedException", "Cause": cause}}})
    run = Run(id="r", scan_name="s", scan_path="/beamline/s", flow="f", backend="local",
              status=RunStatus.FAILED, created_at=0, updated_at=0)
    kind = failure_of(run, info).kind
    return is_transient(run.model_copy(update={"error_kind": kind}))


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def test_kill_9_of_idle_workers_does_not_hang_the_next_task(
    provider: LocalComputeProvider, engine: ComputeEngine
) -> None:
    # An idle worker waits for its next task holding the pool's task queue's lock: killed
    # (kill -9, out of memory) it took the lock with it, and the next task waited for ever.
    assert finish(provider, body(task("f-add", 1))).status == "SUCCEEDED"
    restarts = engine.restarts
    workers = idle_workers(engine)
    signal_all(workers, signal.SIGKILL)
    status = finish(provider, body(task("f-add", 2), task("f-add", 3)))
    assert status.status == "SUCCEEDED", status.details
    assert sorted(r["sum"] for r in status.details["result"]) == [2, 3]
    assert not {r["pid"] for r in status.details["result"]} & set(workers)
    assert engine.restarts == restarts + 1  # a fresh engine: the old queue stays locked


def test_a_task_no_worker_takes_restarts_the_engine(
    provider: LocalComputeProvider, engine: ComputeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stopped, not dead: the pool sees nothing wrong, only the task's wait tells.
    monkeypatch.setattr(provider.endpoints[ENDPOINT], "pickup_timeout", 3.0)
    # Stopped workers cannot exit when the old engine is shut down: the sweep that kills
    # them need not wait its full grace here.
    monkeypatch.setattr(engine, "SHUTDOWN_GRACE_S", 1.0)
    restarts = engine.restarts
    workers = idle_workers(engine)
    signal_all(workers, signal.SIGSTOP)
    try:
        status = finish(provider, body(task("f-add", 7)))
    finally:
        signal_all(workers, signal.SIGCONT)
    assert status.status == "SUCCEEDED", status.details
    assert status.details["result"][0]["sum"] == 7
    assert engine.restarts == restarts + 1
    assert not any(pid_running(pid) for pid in workers)  # the old pool is gone


def test_a_task_no_worker_takes_for_stall_timeout_fails_as_lost(
    provider: LocalComputeProvider, engine: ComputeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = provider.endpoints[ENDPOINT]
    monkeypatch.setattr(endpoint, "pickup_timeout", 1000.0)
    monkeypatch.setattr(endpoint, "stall_timeout", 2.0)
    workers = idle_workers(engine)
    signal_all(workers, signal.SIGSTOP)
    try:
        began = time.monotonic()
        status = finish(provider, body(task("f-add", 8)))
        waited = time.monotonic() - began
    finally:
        signal_all(workers, signal.SIGCONT)
    assert status.status == "FAILED"
    error = status.details["error"]
    assert error["type"] == "TaskLost"
    # The reason first, in words the agent's retry rules read as transient ("lost").
    assert error["message"].startswith("no progress for 2 s: no compute worker took add")
    assert error["message"].endswith("the task is lost")
    assert 2.0 <= waited < 30
    assert retried_by_the_agent(error)
    monkeypatch.undo()
    assert finish(provider, body(task("f-add", 9))).details["result"][0]["sum"] == 9


def test_a_running_task_whose_worker_uses_no_cpu_is_stopped_as_lost(
    provider: LocalComputeProvider, engine: ComputeEngine, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # A hung worker (blocked for ever: here, asleep) makes no progress: after
    # compute.stall_timeout it gets SIGTERM (a reconstruction saves its checkpoint) and the
    # task fails as lost, which the agent retries.
    # A live worker pool first: after the tests before this one restarted the engine, a
    # fresh pool can take longer than the 3 s below to come up on a loaded machine, and the
    # task would then be lost as never taken (seen once in CI) instead of as hung.
    assert finish(provider, body(task("f-add", 1))).details["result"][0]["sum"] == 1
    monkeypatch.setattr(provider.endpoints[ENDPOINT], "stall_timeout", 3.0)
    marker = tmp_path / "ck"
    began = time.monotonic()
    status = finish(provider, body(task("f-sleep", 120, str(marker))))
    assert status.status == "FAILED"
    error = status.details["error"]
    assert error["type"] == "TaskLost"
    assert error["message"].startswith(
        "no progress for 3 s: the worker running sleep_then used no CPU time (hung;")
    assert time.monotonic() - began < 60
    assert retried_by_the_agent(error)
    worker = read_pid(Path(f"{marker}.pid"))
    assert read_pid(marker) == worker  # it was asked to stop, and saved
    wait_for(lambda: not pid_running(worker), "the hung worker to end")
    monkeypatch.undo()
    assert finish(provider, body(task("f-add", 4))).details["result"][0]["sum"] == 4


def test_a_result_that_is_not_json_fails(provider: LocalComputeProvider) -> None:
    status = finish(provider, body(task("f-object")))
    assert status.status == "FAILED"
    assert "not JSON" in status.details["error"]["message"]


def test_cancel_stops_that_tasks_worker_only_with_sigterm(
    provider: LocalComputeProvider, engine: ComputeEngine, tmp_path: Path
) -> None:
    victim, bystander = tmp_path / "victim", tmp_path / "bystander"
    doomed = provider.start(body(task("f-sleep", 120, str(victim))), None)
    other = provider.start(body(task("f-sleep", 4, str(bystander))), None)
    victim_pid = read_pid(Path(f"{victim}.pid"))
    bystander_pid = read_pid(Path(f"{bystander}.pid"))
    assert victim_pid != bystander_pid
    status = provider.cancel(doomed.action_id)
    assert status.status == "FAILED"
    assert status.details["results"][0]["status"] == "CANCELED"
    # SIGTERM reached the task (it saved its "checkpoint"), and only its worker.
    assert victim.read_text() == str(victim_pid)
    assert not pid_running(victim_pid)
    assert not bystander.exists()
    finished = provider.wait(other.action_id, timeout=60)
    assert finished.status == "SUCCEEDED"
    assert finished.details["result"][0]["pid"] == bystander_pid
    assert finish(provider, body(task("f-add", 5))).status == "SUCCEEDED"


def test_a_waiting_task_is_cancelled_without_running_and_concurrency_is_bounded(
    provider: LocalComputeProvider, tmp_path: Path
) -> None:
    # Two workers: the third and fourth tasks wait; the third is cancelled while waiting.
    busy = [provider.start(body(task("f-sleep", 2)), None) for _ in range(2)]
    waiting = provider.start(body(task("f-sleep", 2, str(tmp_path / "never"))), None)
    last = provider.start(body(task("f-sleep", 0.5)), None)
    assert provider.status(waiting.action_id).details["results"][0]["status"] == "PENDING"
    status = provider.cancel(waiting.action_id)
    assert status.details["results"][0]["status"] == "CANCELED"
    assert status.details["results"][0]["started"] is None
    spans = []
    for action in [*busy, last]:
        done = provider.wait(action.action_id, timeout=60)
        assert done.status == "SUCCEEDED"
        spans.append(done.details["result"][0])
    assert not (tmp_path / "never.pid").exists()  # it never ran
    # At most two at once: the last one started after one of the first two ended.
    assert spans[2]["start"] >= min(s["end"] for s in spans[:2]) - 0.05


def test_unknown_function_endpoint_and_bad_body_are_refused(
    provider: LocalComputeProvider,
) -> None:
    with pytest.raises(ActionUnableToRunError, match="not registered.*register functions"):
        provider.start(body(task("f-unknown")), None)
    with pytest.raises(ActionUnableToRunError, match="unknown compute endpoint"):
        provider.start({"endpoint_id": "nope", "tasks": [task("f-add", 1)]}, None)
    with pytest.raises(ActionUnableToRunError, match="tasks"):
        provider.start({"endpoint_id": ENDPOINT, "tasks": []}, None)
    with pytest.raises(ActionUnableToRunError, match="function_id"):
        provider.start(body({"function": "f-add"}), None)


def test_workers_are_pinned_to_one_gpu_each(provider: LocalComputeProvider) -> None:
    status = finish(provider, body(task("f-env"), task("f-env")))
    seen = sorted(r["CUDA_VISIBLE_DEVICES"] for r in status.details["result"])
    assert seen == GPUS


def test_detect_gpus_honours_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert detect_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert detect_gpus() == []


# -- configuration -------------------------------------------------------------------------------
def test_the_default_configuration_loads_with_the_endpoints_loader() -> None:
    one = load_engine(default_engine_yaml(3), "default")
    assert one.executor.workers_per_node == 3
    assert one.executor.available_accelerators == []
    assert one.executor.address == "127.0.0.1"
    many = load_engine(default_engine_yaml(4, ["0", "1"]), "default")
    assert many.executor.available_accelerators == ["0", "1"]
    assert many.executor.workers_per_node == 2  # one worker per GPU, as on an endpoint
    # The workstation endpoint's configuration (its user template, rendered with its example
    # as the endpoint renders it) runs as the local engine too: one config shape.
    from endpoint_kit import DEPLOY, example, render_user_config

    kind = DEPLOY / "workstation"
    workstation = load_engine(render_user_config(kind, example(kind)), str(kind))
    assert workstation.executor.workers_per_node == 2
    assert workstation.executor.available_accelerators == ["0", "1"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("engine: [", "Invalid config syntax"),
        ("display_name: x\n", "engine.type must be GlobusComputeEngine.*no engine section"),
        ("engine:\n  type: ThreadPoolEngine\n", "must be GlobusComputeEngine.*ThreadPoolEngine"),
        ("engine:\n  type: GlobusComputeEngine\n  provider:\n    type: SlurmProvider\n",
         "provider.type must be LocalProvider.*SlurmProvider"),
        ("engine:\n  type: GlobusComputeEngine\n  colour: red\n", "colour"),
    ],
)  # fmt: skip
def test_a_bad_engine_configuration_names_the_file_and_the_problem(
    text: str, problem: str
) -> None:
    with pytest.raises(ConfigError, match=f"^/etc/engine.yaml: .*{problem}"):
        load_engine(text, "/etc/engine.yaml")


def test_error_text_of_an_endpoint_result_is_parsed() -> None:
    framed = "+" * 68 + "\nTraceback (most recent call last):\n  File \"x\", line 1\n" \
        "parsl.executors.high_throughput.errors.WorkerLost: Task failure due to loss of " \
        "worker 0 on host h\n" + "-" * 68  # fmt: skip
    error = parse_error(framed)
    assert (error["type"], error["message"]) == (
        "WorkerLost", "Task failure due to loss of worker 0 on host h")
    error = parse_error("Traceback (most recent call last):\n  File \"f\", line 2, in g\n"
                        "ValueError: two\nlines\n")  # fmt: skip
    assert (error["type"], error["message"]) == ("ValueError", "two\nlines")
    error = parse_error("MaxResultSizeExceeded(20000000, 10485760)", "MaxResultSizeExceeded")
    assert error["type"] == "MaxResultSizeExceeded"


# -- shutdown ------------------------------------------------------------------------------------
def test_close_stops_a_running_task_and_leaves_no_process(tmp_path: Path) -> None:
    e = ComputeEngine.from_yaml(default_engine_yaml(1), "test", tmp_path / "run")
    p = LocalComputeProvider({ENDPOINT: e}, FUNCTIONS.get)
    started = p.start(body(task("f-sleep", 120, str(tmp_path / "ck"))), None)
    worker = read_pid(tmp_path / "ck.pid")
    processes = e.processes()
    assert worker in processes and len(processes) >= 4  # interchange, pool, manager, worker
    p.close()
    assert p.status(started.action_id).details["results"][0]["status"] == "CANCELED"
    assert e.processes() == []
    assert not any(pid_running(pid) for pid in processes)
    assert worker_pids(e.sandbox(p._action(started.action_id).jobs[0].task.task_id)) == []


def test_kill_9_of_the_owner_leaves_no_engine_process(tmp_path: Path) -> None:
    """The process that owns the engine is killed with -9 mid-task: the interchange dies
    with it and the worker pool kills itself (its job script watches the owner)."""
    script = textwrap.dedent(f"""
        import json, sys, time
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1] / "kits")!r},
                        {str(Path(__file__).parents[2])!r}]
        from pathlib import Path
        from beamflow.local.compute import LocalComputeProvider
        from beamflow.local.engine import ComputeEngine, default_engine_yaml
        from test_local_compute import FUNCTIONS, body, task
        e = ComputeEngine.from_yaml(default_engine_yaml(1), "test", Path({str(tmp_path)!r}) / "run")
        p = LocalComputeProvider({{{ENDPOINT!r}: e}}, FUNCTIONS.get)
        p.start(body(task("f-sleep", 600, {str(tmp_path / "ck")!r})), None)
        print(json.dumps({{"run_dir": str(e.run_dir)}}), flush=True)
        time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        run_dir = json.loads(owner.stdout.readline())["run_dir"]  # type: ignore[union-attr]
        worker = read_pid(tmp_path / "ck.pid")
        processes = engine_processes(run_dir)
        assert worker in processes
    finally:
        owner.kill()
        owner.wait(30)
    deadline = time.monotonic() + 15
    while engine_processes(run_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine_processes(run_dir) == []
    assert not any(pid_running(pid) for pid in processes)
    assert not (tmp_path / "ck").exists()  # killed at once, not asked to save


def test_compute_engine_config_names_an_endpoint_config_yaml(tmp_path: Path) -> None:
    from beamflow.config import load_config as load
    from beamflow.local.compute import engine_from_settings
    from beamflow.workspace_toml import local_workspace_toml

    toml = tmp_path / "beamflow.toml"
    toml.write_text(local_workspace_toml().replace(
        '# engine_config = "engine.yaml"', 'engine_config = "engine.yaml"'))  # fmt: skip
    settings = load(toml)
    assert settings.compute.engine_config == tmp_path / "engine.yaml"  # next to the file
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'engine.yaml'}: cannot read"):
        engine_from_settings(settings)
    (tmp_path / "engine.yaml").write_text(default_engine_yaml(3))
    engine = engine_from_settings(settings)
    assert engine.capacity == 3
    assert engine.run_dir.parent == tmp_path / "state" / "compute-engine"
    (tmp_path / "engine.yaml").write_text("engine:\n  type: ThreadPoolEngine\n")
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'engine.yaml'}: engine.type"):
        engine_from_settings(settings)
