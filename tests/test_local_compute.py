"""The local Compute action provider: results as the service reports them, exceptions as
FAILED actions with the error, lost workers, cancel, GPU pinning per worker slot.

The functions the workers run are defined in this module (the spawned workers import it by
name, as they import ``functions.NAME`` in production).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from beamflow.local.actions import ActionUnableToRunError
from beamflow.local.compute import (
    LocalComputeProvider,
    WorkerPool,
    detect_gpus,
    slot_environments,
)

ENDPOINT = "33333333-3333-4333-8333-333333333333"
FUNCTIONS = {
    "f-add": "add",
    "f-boom": "boom",
    "f-die": "die",
    "f-sleep": "sleep_then",
    "f-env": "environment",
    "f-object": "not_json",
}


# -- functions run in the workers --------------------------------------------------------------
def add(a: int, b: int = 0, *, scale: int = 1) -> dict[str, Any]:
    return {"sum": (a + b) * scale, "pid": os.getpid()}


def boom(scan: str) -> None:
    raise ValueError(f"scan {scan}: frames and positions disagree (40 vs 39)")


def die() -> None:
    os._exit(3)


def sleep_then(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def environment() -> dict[str, str | None]:
    time.sleep(0.3)  # long enough that the second task goes to the other slot
    return {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}


def not_json() -> object:
    return object()


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def provider() -> Iterator[LocalComputeProvider]:
    # One pool for the module: spawning workers is the slow part.
    pool = WorkerPool(2, gpus=[], module_for=lambda name: __name__)
    p = LocalComputeProvider({ENDPOINT: pool}, FUNCTIONS.get)
    yield p
    p.close()


def body(*tasks: dict[str, Any]) -> dict[str, Any]:
    return {"endpoint_id": ENDPOINT, "tasks": list(tasks)}


def task(function_id: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"function_id": function_id, "args": list(args), "kwargs": kwargs}


def finish(p: LocalComputeProvider, b: dict[str, Any]) -> Any:
    status = p.wait(p.start(b, None).action_id, timeout=60)
    assert status.status in ("SUCCEEDED", "FAILED"), status
    return status


# -- tests ---------------------------------------------------------------------------------------
def test_results_in_the_service_layout(provider: LocalComputeProvider) -> None:
    status = finish(provider, body(task("f-add", 2, 3, scale=10), task("f-add", 1)))
    assert status.status == "SUCCEEDED"
    assert [r["sum"] for r in status.details["result"]] == [50, 1]
    outputs = [r["output"] for r in status.details["results"]]
    assert outputs == status.details["result"]
    assert all(r["task_id"] for r in status.details["results"])
    assert status.completion_time is not None
    assert all(r["pid"] != os.getpid() for r in outputs), "ran in this process, not a worker"


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


def test_a_dead_worker_fails_its_task_and_is_replaced(provider: LocalComputeProvider) -> None:
    status = finish(provider, body(task("f-die")))
    assert status.status == "FAILED"
    assert status.details["error"]["type"] == "WorkerLost"
    assert "exit code 3" in status.details["error"]["message"]
    assert finish(provider, body(task("f-add", 4))).details["result"][0]["sum"] == 4


def test_a_result_that_is_not_json_fails(provider: LocalComputeProvider) -> None:
    status = finish(provider, body(task("f-object")))
    assert status.status == "FAILED"
    assert "not JSON" in status.details["error"]["message"]


def test_cancel_terminates_a_running_task(provider: LocalComputeProvider) -> None:
    started = provider.start(body(task("f-sleep", 60)), None)
    deadline = time.monotonic() + 30
    while provider.status(started.action_id).details["results"][0]["status"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status = provider.cancel(started.action_id)
    assert status.status == "FAILED"
    assert status.details["results"][0]["status"] == "CANCELED"
    assert finish(provider, body(task("f-add", 5))).status == "SUCCEEDED"


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


def test_slots_are_pinned_to_one_gpu_each_when_there_are_several() -> None:
    assert slot_environments(2, []) == [{}, {}]
    assert slot_environments(2, ["0"]) == [{}, {}]
    assert slot_environments(3, ["0", "1"]) == [
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "1"},
        {"CUDA_VISIBLE_DEVICES": "0"},
    ]
    pool = WorkerPool(2, gpus=["4", "7"], module_for=lambda name: __name__)
    p = LocalComputeProvider({ENDPOINT: pool}, FUNCTIONS.get)
    try:
        status = finish(p, body(task("f-env"), task("f-env")))
        seen = sorted(r["CUDA_VISIBLE_DEVICES"] for r in status.details["result"])
        assert seen == ["4", "7"]
    finally:
        p.close()


def test_detect_gpus_honours_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert detect_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert detect_gpus() == []
