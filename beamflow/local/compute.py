"""The local Compute action provider (``https://compute.actions.globus.org/v3``).

A request names an endpoint and tasks: ``{endpoint_id, tasks: [{function_id, args,
kwargs}]}``. The endpoint id maps to a pool of worker processes on this machine and each
function id, through the registry, to a function shipped in ``functions/`` (the registry
records what ``beamflow register functions`` registered for the local backend).

The pool has one worker process per slot (``settings.compute.workers``), started with the
``spawn`` method (no state inherited from the parent: a fresh interpreter, like an
endpoint's worker). When the machine has several GPUs each slot is pinned to one through
``CUDA_VISIBLE_DEVICES`` (slot i gets GPU i modulo their number), as a Globus Compute
endpoint's ``available_accelerators`` does, so two reconstructions never share a GPU unless
there are more slots than GPUs. A worker is started on first use and kept warm; one that
dies (killed, out of memory) fails its task and is started again for the next one; a task
that is cancelled has its worker terminated.

Results come back as the service reports them: ``details.result`` (the return values) and
``details.results: [{task_id, output}]``. A function that raises makes the action FAILED
with the error's type and message (and the worker's traceback) in ``details``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import multiprocessing as mp
import os
import queue
import shutil
import subprocess
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from beamflow.local.actions import ActionStatus, ActionUnableToRunError, RunContext

log = logging.getLogger(__name__)

COMPUTE_URL = "https://compute.actions.globus.org/v3"

# function id -> function name (``functions/NAME.py`` defining ``NAME``), or None if unknown.
FunctionResolver = Callable[[str], str | None]


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


# -- the request -----------------------------------------------------------------------------
class ComputeTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    function_id: str = Field(min_length=1)
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class ComputeRequest(BaseModel):
    """The v3 Compute action body."""

    model_config = ConfigDict(extra="forbid")

    endpoint_id: str = Field(min_length=1)
    tasks: list[ComputeTask] = Field(min_length=1)
    resource_specification: dict[str, Any] | None = None
    user_endpoint_config: dict[str, Any] | None = None


# -- GPUs ------------------------------------------------------------------------------------
def detect_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES if set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        return [] if ids in ([], ["-1"]) else ids
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def slot_environments(workers: int, gpus: Sequence[str]) -> list[dict[str, str]]:
    """Extra environment per worker slot: a GPU each when there are several."""
    if len(gpus) <= 1:
        return [{} for _ in range(workers)]
    return [{"CUDA_VISIBLE_DEVICES": str(gpus[i % len(gpus)])} for i in range(workers)]


# -- the worker process ----------------------------------------------------------------------
def _exit_with_parent(parent: int, every: float = 0.5) -> None:
    while os.getppid() == parent:
        time.sleep(every)
    os._exit(1)


def _worker_main(conn: Connection, env: dict[str, str]) -> None:
    """A worker: run (module, name, args, kwargs) messages until told to stop."""
    os.environ.update(env)
    # A worker never outlives the process that started it: killed with -9, that process
    # (the agent) is restarted and runs the task again; an orphan would compute the same
    # scan twice, into the same checkpoints.
    threading.Thread(
        target=_exit_with_parent, args=(os.getppid(),), name="parent-watch", daemon=True
    ).start()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, module_name, func_name, args, kwargs = message
        try:
            func = getattr(importlib.import_module(module_name), func_name)
            result = func(*args, **kwargs)
            try:
                result = json.loads(json.dumps(result))
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"{func_name} returned a value that is not JSON ({exc}); a flow can only "
                    "carry JSON"
                ) from None
            reply: tuple[Any, ...] = (task_id, True, result)
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the action
            reply = (
                task_id,
                False,
                {
                    "type": type(exc).__name__,
                    "message": str(exc),
                    "traceback": traceback.format_exc(limit=20),
                },
            )
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return


# -- the pool --------------------------------------------------------------------------------
@dataclass
class _Job:
    task_id: str
    function_id: str
    function_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    status: str = "PENDING"  # PENDING, RUNNING, SUCCEEDED, FAILED, CANCELED
    output: Any = None
    error: dict[str, Any] | None = None
    started: float | None = None
    finished: float | None = None
    slot: int | None = None
    cancel_requested: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    def finish(self, status: str, *, output: Any = None, error: dict[str, Any] | None = None):
        self.status = status
        self.output = output
        self.error = error
        self.finished = time.time()
        self.done.set()


class WorkerPool:
    """Worker processes, one per slot, each with its own environment."""

    def __init__(
        self,
        workers: int = 1,
        *,
        gpus: Sequence[str] | None = None,
        module_for: Callable[[str], str] = lambda name: f"functions.{name}",
        poll_seconds: float = 0.1,
    ) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.workers = workers
        self.gpus = list(detect_gpus() if gpus is None else gpus)
        self.envs = slot_environments(workers, self.gpus)
        self.module_for = module_for  # function name -> module defining it
        self.poll_seconds = poll_seconds
        self._ctx = mp.get_context("spawn")
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._procs: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _ensure_threads(self) -> None:
        with self._lock:
            if self._threads or self._closed:
                return
            for slot in range(self.workers):
                t = threading.Thread(
                    target=self._slot_loop, args=(slot,), name=f"compute-slot-{slot}", daemon=True
                )
                t.start()
                self._threads.append(t)

    def submit(self, job: _Job) -> None:
        if self._closed:
            raise RuntimeError("the compute pool is closed")
        self._ensure_threads()
        self._queue.put(job)

    def cancel(self, job: _Job) -> None:
        job.cancel_requested = True
        if job.status == "PENDING":
            job.finish("CANCELED", error={"type": "Canceled", "message": "canceled"})

    def close(self) -> None:
        """Stop the workers (running tasks are terminated)."""
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        with self._lock:
            procs = list(self._procs.values())
        for _proc, conn in procs:
            with contextlib.suppress(Exception):
                conn.send(None)
        for t in self._threads:
            t.join(timeout=5)
        for proc, _conn in procs:
            proc.join(timeout=2)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2)

    # -- one slot ----------------------------------------------------------------------------
    def _start_worker(self, slot: int) -> tuple[Any, Connection]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child, self.envs[slot]),
            name=f"beamflow-compute-{slot}",
            daemon=True,
        )
        proc.start()
        child.close()
        with self._lock:
            self._procs[slot] = (proc, parent)
        return proc, parent

    def _stop_worker(self, slot: int, proc: Any, conn: Connection) -> None:
        proc.terminate()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        conn.close()
        with self._lock:
            self._procs.pop(slot, None)

    def _slot_loop(self, slot: int) -> None:
        worker: tuple[Any, Connection] | None = None
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.done.is_set() or job.cancel_requested:
                continue
            if worker is None or not worker[0].is_alive():
                worker = self._start_worker(slot)
            proc, conn = worker
            job.status, job.started, job.slot = "RUNNING", time.time(), slot
            try:
                conn.send(
                    (
                        job.task_id,
                        self.module_for(job.function_name),
                        job.function_name,
                        job.args,
                        job.kwargs,
                    )
                )
            except (BrokenPipeError, OSError) as exc:
                job.finish("FAILED", error={"type": "WorkerLost", "message": str(exc)})
                self._stop_worker(slot, proc, conn)
                worker = None
                continue
            worker = self._await(slot, job, proc, conn)

    def _await(self, slot: int, job: _Job, proc: Any, conn: Connection):  # noqa: ANN202
        """Wait for the job's reply; the worker to use next (None: start a new one)."""
        while True:
            if job.cancel_requested:
                self._stop_worker(slot, proc, conn)
                job.finish("CANCELED", error={"type": "Canceled", "message": "canceled"})
                return None
            try:
                ready = conn.poll(self.poll_seconds)
            except (EOFError, OSError):
                ready = False
            if ready:
                try:
                    _task_id, ok, value = conn.recv()
                except (EOFError, OSError):
                    pass  # the worker died mid-reply: handled below
                else:
                    if ok:
                        job.finish("SUCCEEDED", output=value)
                    else:
                        job.finish("FAILED", error=value)
                    return proc, conn
            if not proc.is_alive():
                code = proc.exitcode
                self._stop_worker(slot, proc, conn)
                job.finish(
                    "FAILED",
                    error={
                        "type": "WorkerLost",
                        "message": f"the worker process running {job.function_name} ended "
                        f"(exit code {code}{', killed by a signal' if code and code < 0 else ''})",
                    },
                )
                return None


# -- the provider ----------------------------------------------------------------------------
@dataclass
class _Action:
    action_id: str
    endpoint_id: str
    jobs: list[_Job]
    created: float
    label: str | None = None


class LocalComputeProvider:
    """The Compute action provider of the local backend."""

    url = COMPUTE_URL

    def __init__(
        self,
        endpoints: Mapping[str, WorkerPool | int],
        resolve_function: FunctionResolver,
        *,
        keep_finished: int = 500,
    ) -> None:
        self.pools: dict[str, WorkerPool] = {
            eid.lower(): pool if isinstance(pool, WorkerPool) else WorkerPool(pool)
            for eid, pool in endpoints.items()
            if eid
        }
        self.resolve_function = resolve_function
        self.keep_finished = keep_finished
        self._actions: dict[str, _Action] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any, **kwargs: Any) -> LocalComputeProvider:
        from beamflow.registry import Registry

        registry = Registry(settings.registry_path, "local")
        return cls(
            {settings.compute.endpoint_id: WorkerPool(settings.compute.workers)},
            lambda function_id: registry.name_of("function", function_id),
            **kwargs,
        )

    def start(self, body: dict[str, Any], context: RunContext | None = None) -> ActionStatus:
        try:
            request = ComputeRequest.model_validate(body)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
            )
            raise ActionUnableToRunError(
                f"invalid compute request: {problems}",
                {"code": "BadRequest", "description": f"invalid compute request: {problems}"},
            ) from None
        pool = self.pools.get(request.endpoint_id.lower())
        if pool is None:
            known = ", ".join(self.pools) or "none configured"
            message = (
                f"unknown compute endpoint {request.endpoint_id!r}: this machine runs only "
                f"{known} (compute.endpoint_id in beamflow.toml)"
            )
            raise ActionUnableToRunError(
                message, {"code": "UnknownEndpoint", "description": message}
            )
        jobs = []
        for task in request.tasks:
            name = self.resolve_function(task.function_id)
            if name is None:
                message = (
                    f"function {task.function_id!r} is not registered on the local backend: "
                    "run `beamflow register functions`"
                )
                raise ActionUnableToRunError(
                    message, {"code": "UnknownFunction", "description": message}
                )
            jobs.append(
                _Job(
                    task_id=str(uuid.uuid4()),
                    function_id=task.function_id,
                    function_name=name,
                    args=task.args,
                    kwargs=task.kwargs,
                )
            )
        action = _Action(
            action_id=str(uuid.uuid4()),
            endpoint_id=request.endpoint_id,
            jobs=jobs,
            created=time.time(),
            label=context.label if context else None,
        )
        with self._lock:
            self._prune()
            self._actions[action.action_id] = action
        for job in jobs:
            pool.submit(job)
        return self._status(action)

    def status(self, action_id: str) -> ActionStatus:
        return self._status(self._action(action_id))

    def cancel(self, action_id: str) -> ActionStatus:
        action = self._action(action_id)
        pool = self.pools[action.endpoint_id.lower()]
        for job in action.jobs:
            pool.cancel(job)
        for job in action.jobs:
            job.done.wait(timeout=15)
        return self._status(action)

    def wait(self, action_id: str, timeout: float | None = None) -> ActionStatus:
        """Block until every task of the action has ended (tests)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for job in self._action(action_id).jobs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            job.done.wait(left)
        return self.status(action_id)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()

    # -- helpers -----------------------------------------------------------------------------
    def _action(self, action_id: str) -> _Action:
        with self._lock:
            action = self._actions.get(action_id)
        if action is None:
            raise KeyError(f"no compute action {action_id!r} on this provider")
        return action

    def _prune(self) -> None:
        done = [
            (a.created, aid)
            for aid, a in self._actions.items()
            if all(j.done.is_set() for j in a.jobs)
        ]
        for _, aid in sorted(done)[: max(0, len(done) - self.keep_finished)]:
            del self._actions[aid]

    @staticmethod
    def _status(action: _Action) -> ActionStatus:
        jobs = action.jobs
        finished = all(j.done.is_set() for j in jobs)
        failed = [j for j in jobs if j.status in ("FAILED", "CANCELED")]
        status = "ACTIVE" if not finished else "FAILED" if failed else "SUCCEEDED"
        details: dict[str, Any] = {
            "result": [j.output for j in jobs if j.status == "SUCCEEDED"],
            "results": [
                {
                    "task_id": j.task_id,
                    "function_id": j.function_id,
                    "status": j.status,
                    **({"output": j.output} if j.status == "SUCCEEDED" else {}),
                    **({"exception": j.error} if j.error else {}),
                    "started": _iso(j.started),
                    "completed": _iso(j.finished),
                }
                for j in jobs
            ],
        }
        if failed:
            first = failed[0]
            err = first.error or {}
            details["error"] = {
                "type": err.get("type", "Error"),
                "message": err.get("message", ""),
                "task_id": first.task_id,
                "function": first.function_name,
                "traceback": err.get("traceback"),
            }
            details["exception"] = f"{err.get('type', 'Error')}: {err.get('message', '')}"
        done_count = sum(j.done.is_set() for j in jobs)
        running = sum(j.status == "RUNNING" for j in jobs)
        display = status if finished else f"{done_count}/{len(jobs)} tasks done, {running} running"
        completion = max((j.finished or 0.0) for j in jobs) if finished else None
        return ActionStatus(
            action_id=action.action_id,
            status=status,
            start_time=_iso(action.created),
            completion_time=_iso(completion),
            details=details,
            display_status=display,
            label=action.label,
        )
