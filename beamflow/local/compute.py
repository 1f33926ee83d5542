"""The local Compute action provider (``https://compute.actions.globus.org/v3``).

A request names an endpoint and tasks: ``{endpoint_id, tasks: [{function_id, args,
kwargs}]}``. The endpoint id maps to a compute engine on this machine, Globus Compute's own
``GlobusComputeEngine`` (:mod:`beamflow.local.engine`), and each function id, through the
registry, to a function shipped in ``functions/`` (the registry records what ``beamflow
register functions`` registered for the local backend). The function travels to the engine's
worker as it travels to an endpoint: as its source text, so a function that is not
self-contained fails here as it would at the facility.

The engine is configured like an endpoint (``compute.engine_config``: YAML with an ``engine``;
by default ``compute.workers`` workers on a ``LocalProvider``, one GPU each when there are
several, as ``available_accelerators`` pins them). It is started once per process, at
:meth:`LocalComputeProvider.warm` (the agent and the demo call it when they start) or at the
first task, and shut down by :meth:`LocalComputeProvider.close`.

Tasks wait here until a worker is free, so the engine holds only tasks that are running:
a task cancelled while waiting never starts, and a running one has its worker process (that
one only) stopped with SIGTERM (a reconstruction saves a checkpoint), then SIGKILL. A worker
that dies (killed, out of memory) fails its task with ``WorkerLost``; the pool starts a new
worker. A worker that dies while idle leaves the pool unable to hand out tasks (see
:mod:`beamflow.local.engine`): a watch restarts the engine then, or whenever a task waits
longer than ``compute.pickup_timeout`` for a worker, and fails a task that no worker took for
``compute.stall_timeout`` as lost, so that nothing hangs unnoticed.

Results come back as the service reports them: ``details.result`` (the return values) and
``details.results: [{task_id, output}]``. A function that raises makes the action FAILED
with the error's type and message (and the worker's traceback) in ``details``.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from beamflow.local.actions import (
    ActionStatus,
    ActionUnableToRunError,
    RunContext,
    iso_time,
    parse_request,
)
from beamflow.local.engine import ComputeEngine, EngineError, EngineTask, default_engine_yaml

log = logging.getLogger(__name__)

COMPUTE_URL = "https://compute.actions.globus.org/v3"

# function id -> the function (``NAME`` from ``functions/NAME.py``), or None if unknown.
FunctionResolver = Callable[[str], Callable[..., Any] | None]


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


def warm_worker() -> int:
    """Run once in each worker when the engine starts: the imports of the reconstruct
    function, so the first scan does not wait for them. Shipped as source, like any task."""
    import os

    import beamflow.job.run  # noqa: F401

    return os.getpid()


def engine_from_settings(settings: Any) -> ComputeEngine:
    """The engine of ``compute.engine_config`` (YAML with an endpoint ``engine`` section), else of
    ``compute.workers`` and the GPUs found; its run directory under the state directory."""
    from beamflow.config import ConfigError
    from beamflow.local.engine import new_run_dir

    path = settings.compute.engine_config
    if path is None:
        text = default_engine_yaml(settings.compute.workers, detect_gpus())
        source = "beamflow's default compute engine configuration"
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(
                f"{path}: cannot read the compute engine configuration (compute.engine_config):"
                f" {exc.strerror or exc}"
            ) from None
        source = str(path)
    return ComputeEngine.from_yaml(
        text,
        source,
        new_run_dir(Path(settings.state_dir) / "compute-engine"),
        endpoint_id=settings.compute.endpoint_id,
        warm_up=warm_worker,
    )


# -- the provider ----------------------------------------------------------------------------
@dataclass
class _Job:
    task_id: str
    function_id: str
    function_name: str
    function: str  # packed, as the SDK registers it
    args: list[Any]
    kwargs: dict[str, Any]
    resource_specification: dict[str, Any] | None = None
    status: str = "PENDING"  # PENDING, RUNNING, SUCCEEDED, FAILED, CANCELED
    output: Any = None
    error: dict[str, Any] | None = None
    started: float | None = None
    finished: float | None = None
    task: EngineTask | None = None
    handed: float | None = None  # monotonic: when the engine was given it (last time)
    first_handed: float | None = None
    cpu: float | None = None  # CPU seconds its worker had used at the last look
    cpu_moved: float | None = None  # monotonic: when that last went up
    cancel_requested: bool = False
    stop_sent: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)

    def finish(self, status: str, *, output: Any = None, error: dict[str, Any] | None = None
               ) -> bool:  # fmt: skip
        """End the job (once: False if it had ended already)."""
        with self.lock:
            if self.done.is_set():
                return False
            self.status, self.output, self.error = status, output, error
            self.finished = time.time()
            self.done.set()
            return True


_CANCELED = {"type": "Canceled", "message": "canceled"}


class _Endpoint:
    """One engine, the tasks waiting for its workers, and a watch on its health.

    Every task handed to the engine holds a worker slot, so a worker should take it at once.
    The watch restarts the engine (:meth:`ComputeEngine.restart`) when it has a fault (an
    idle worker died, the pool failed) or when a task waited ``pickup_timeout`` seconds for a
    worker, whatever the cause, and hands the waiting tasks to the fresh engine; a task that
    no worker took for ``stall_timeout`` seconds fails as lost (the agent retries it).
    Tasks a worker is running finish first: their results do not travel by the locked
    queue."""

    def __init__(
        self,
        engine: ComputeEngine,
        cancel_grace: float,
        *,
        pickup_timeout: float = 60.0,
        stall_timeout: float = 600.0,
        watch_period: float = 1.0,
    ) -> None:
        self.engine = engine
        self.cancel_grace = cancel_grace
        self.pickup_timeout = pickup_timeout
        self.stall_timeout = stall_timeout
        self.watch_period = watch_period
        self.queue: queue.Queue[_Job | None] = queue.Queue()
        self.slots = threading.Semaphore(engine.capacity)
        self.closed = False
        self.thread: threading.Thread | None = None
        self.watcher: threading.Thread | None = None
        self.lock = threading.Lock()
        self.handed: dict[str, _Job] = {}  # task id -> job the engine holds (under lock)
        self.restart_due: str | None = None
        self._pool_seen = (-1, 0.0)  # (engine generation, when its workers were first seen)
        self._closing = threading.Event()

    def submit(self, job: _Job) -> None:
        with self.lock:
            if self.closed:
                raise ActionUnableToRunError(
                    "the local compute engine is closed",
                    {"code": "Closed", "description": "the local compute engine is closed"},
                )
            if self.thread is None:
                self.engine.start()
                self.thread = threading.Thread(
                    target=self._dispatch, name="compute-dispatch", daemon=True
                )
                self.thread.start()
                self.watcher = threading.Thread(
                    target=self._watch, name="compute-watch", daemon=True
                )
                self.watcher.start()
        self.queue.put(job)

    def _dispatch(self) -> None:
        """Hand waiting jobs to the engine, one per free worker."""
        while True:
            job = self.queue.get()
            if job is None:
                return
            if job.done.is_set():
                continue  # cancelled while waiting
            try:
                self.engine.wait_ready()  # the job stays PENDING (cancellable) until then
            except EngineError as exc:
                job.finish("FAILED", error={"type": "EngineError", "message": str(exc)})
                continue
            self.slots.acquire()
            with job.lock:
                runnable = not self.closed and not job.done.is_set()
                if runnable:
                    job.status, job.started = "RUNNING", time.time()
            if not runnable:
                self.slots.release()
                if self.closed:
                    job.finish("CANCELED", error=_CANCELED)
                continue
            while self.engine.failed and not self.closed:
                time.sleep(0.1)  # it would fail the task at once: the watch restarts it
            self._hand(job)

    def _hand(self, job: _Job) -> None:
        """Give a job that holds a worker slot to the engine."""
        try:
            task = self.engine.submit(
                job.function, job.args, job.kwargs, job.resource_specification,
                task_id=uuid.UUID(job.task_id),
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the engine refused: the task failed
            self.slots.release()
            job.finish("FAILED", error={"type": type(exc).__name__, "message": str(exc)})
            return
        with self.lock:
            job.task, job.handed = task, time.monotonic()
            job.first_handed = job.first_handed or job.handed
            self.handed[job.task_id] = job
        if job.cancel_requested:
            self._stop(job)
        task.future.add_done_callback(lambda _f, job=job, task=task: self._ended(job, task))

    def _ended(self, job: _Job, task: EngineTask) -> None:
        with self.lock:
            if job.task is not task:
                return  # an engine since restarted: the job was handed to the new one
            self.handed.pop(job.task_id, None)
        self.slots.release()
        outcome = self.engine.outcome(task)
        self.engine.forget(task)
        if outcome.ok:
            try:
                value = json.loads(json.dumps(outcome.value))
            except (TypeError, ValueError) as exc:
                job.finish("FAILED", error={
                    "type": "TypeError",
                    "message": f"{job.function_name} returned a value that is not JSON ({exc}); "
                    "a flow can only carry JSON",
                })  # fmt: skip
            else:
                job.finish("SUCCEEDED", output=value)
            return
        error = dict(outcome.error or {})
        if job.cancel_requested:
            job.finish("CANCELED", error=_CANCELED)
            return
        if error.get("type") == "WorkerLost":
            error["message"] = (
                f"the worker process running {job.function_name} ended ({error['message']}: "
                "killed, or out of memory)"
            )
        job.finish("FAILED", error=error)

    # -- the watch ---------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._closing.wait(self.watch_period):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watch must outlive one bad look
                log.exception("compute engine watch failed")

    def check(self) -> None:
        """One look at the engine's health (see the class docstring)."""
        now = time.monotonic()
        with self.lock:
            jobs = [j for j in self.handed.values() if j.task is not None]
        running, waiting = [], []
        for job in jobs:
            (running if self.engine.picked_up(job.task) else waiting).append(job)  # type: ignore[arg-type]
        for job in [j for j in waiting if now - (j.first_handed or now) > self.stall_timeout]:
            waiting.remove(job)
            self._lose(job, (
                f"no progress for {self.stall_timeout:g} s: no compute worker took "
                f"{job.function_name} (compute.stall_timeout; the engine was restarted "
                f"{self.engine.restarts} times); the task is lost"
            ))  # fmt: skip
        for job in [j for j in running if self._hung(j, now)]:
            running.remove(job)
            self._lose(job, (
                f"no progress for {self.stall_timeout:g} s: the worker running "
                f"{job.function_name} used no CPU time (hung; compute.stall_timeout); it was "
                "stopped and the task is lost"
            ), restart=False)  # fmt: skip
        fault = self.engine.fault()
        late = [j for j in waiting if now - self._pickup_clock(j, now) > self.pickup_timeout]
        if fault is None and late:
            fault = (
                f"{late[0].function_name} waited {now - (late[0].handed or now):.0f} s for a "
                f"worker (compute.pickup_timeout = {self.pickup_timeout:g} s)"
            )
        self.restart_due = self.restart_due or fault
        if self.restart_due is None:
            return
        if running and not self.engine.failed:
            return  # their results still come back: restart once they have
        reason, self.restart_due = self.restart_due, None
        self._restart(reason, waiting, running)

    def _hung(self, job: _Job, now: float) -> bool:
        """Whether the worker running ``job`` has used no CPU time for ``stall_timeout``
        seconds (a reconstruction computes, or at least drives its GPU, all the time)."""
        cpu = self.engine.cpu_seconds(job.task)  # type: ignore[arg-type]
        if cpu is None:
            return False  # no worker: it ended, and the engine reports it
        if job.cpu is None or cpu > job.cpu:
            job.cpu, job.cpu_moved = cpu, now
        return now - (job.cpu_moved or now) > self.stall_timeout

    def _pickup_clock(self, job: _Job, now: float) -> float:
        """Since when ``job`` could have been taken by a worker: since it was handed over, or
        since the engine's worker pool came up if that was later (a fresh engine takes
        seconds to start its pool)."""
        generation = self.engine.restarts
        if self._pool_seen[0] != generation:
            if not self.engine.workers():
                return now
            self._pool_seen = (generation, now)
        return max(job.handed or now, self._pool_seen[1])

    def _restart(self, reason: str, waiting: list[_Job], running: list[_Job]) -> None:
        """A fresh engine; the jobs no worker took are handed to it, those it ran are lost."""
        with self.lock:
            for job in [*waiting, *running]:
                job.task = None  # what the old engine says of it no longer counts
                self.handed.pop(job.task_id, None)
        for job in running:
            self.slots.release()
            job.finish("FAILED", error={"type": "WorkerLost", "message": (
                f"the compute engine was restarted ({reason}) while running "
                f"{job.function_name}; the task is lost"
            )})  # fmt: skip
        try:
            self.engine.restart(reason)
        except EngineError as exc:
            for job in waiting:
                self.slots.release()
                job.finish("FAILED", error={"type": "EngineError", "message": str(exc)})
            return
        for job in waiting:
            if job.cancel_requested:
                self.slots.release()
                job.finish("CANCELED", error=_CANCELED)
            else:
                self._hand(job)

    def _lose(self, job: _Job, message: str, *, restart: bool = True) -> None:
        """Fail a job that made no progress; its worker, if one runs it (or takes it late),
        is stopped (SIGTERM: a reconstruction saves a checkpoint; then SIGKILL): the retry
        must not find it running. ``restart``: the engine never ran it, so that engine is
        replaced too."""
        with self.lock:
            if self.handed.pop(job.task_id, None) is None:
                return
            task, job.task = job.task, None
        self.slots.release()
        log.error("compute task %s: %s", job.task_id, message)
        job.finish("FAILED", error={"type": "TaskLost", "message": message})
        if restart:
            self.restart_due = self.restart_due or f"it lost a task ({job.function_name})"
        threading.Thread(
            target=self.engine.cancel, args=(task,), kwargs={"grace": self.cancel_grace},
            name=f"compute-cancel-{job.task_id[:8]}", daemon=True,
        ).start()  # fmt: skip

    # -- cancel and close ----------------------------------------------------------------------
    def cancel(self, job: _Job) -> None:
        with job.lock:
            job.cancel_requested = True
            pending = job.status == "PENDING"
        if pending:
            job.finish("CANCELED", error=_CANCELED)
        elif job.task is not None:
            self._stop(job)

    def _stop(self, job: _Job) -> None:
        with job.lock:
            if job.task is None or job.stop_sent:
                return
            job.stop_sent = True
        threading.Thread(
            target=self.engine.cancel, args=(job.task,), kwargs={"grace": self.cancel_grace},
            name=f"compute-cancel-{job.task_id[:8]}", daemon=True,
        ).start()  # fmt: skip

    def close(self) -> None:
        with self.lock:
            self.closed = True
            thread, watcher = self.thread, self.watcher
        self._closing.set()
        self.queue.put(None)
        self.slots.release()  # a dispatcher waiting for a worker sees the close
        self.engine.close()  # a restart under way then fails: the engine is closed
        for helper in (watcher, thread):
            if helper is not None:
                helper.join(timeout=5)


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
        endpoints: Mapping[str, ComputeEngine],
        resolve_function: FunctionResolver,
        *,
        keep_finished: int = 500,
        cancel_grace: float = 30.0,
        pickup_timeout: float = 60.0,
        stall_timeout: float = 600.0,
    ) -> None:
        self.endpoints: dict[str, _Endpoint] = {
            eid.lower(): _Endpoint(
                engine, cancel_grace, pickup_timeout=pickup_timeout, stall_timeout=stall_timeout
            )
            for eid, engine in endpoints.items()
            if eid
        }
        self.resolve_function = resolve_function
        self.keep_finished = keep_finished
        self._actions: dict[str, _Action] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any, **kwargs: Any) -> LocalComputeProvider:
        from beamflow.registry import Registry, RegistryError, load_function

        registry = Registry(settings.registry_path, "local")

        def resolve(function_id: str) -> Callable[..., Any] | None:
            name = registry.name_of("function", function_id)
            if name is None:
                return None
            try:
                return load_function(name)
            except RegistryError as exc:  # registered, but functions/NAME.py does not load
                raise ActionUnableToRunError(
                    str(exc), {"code": "FunctionNotLoadable", "description": str(exc)}
                ) from None

        kwargs.setdefault("pickup_timeout", settings.compute.pickup_timeout)
        kwargs.setdefault("stall_timeout", settings.compute.stall_timeout)
        engines = {settings.compute.endpoint_id: engine_from_settings(settings)}
        return cls(engines, resolve, **kwargs)

    def warm(self) -> None:
        """Start the engines now (in the background), not at the first task."""
        for endpoint in self.endpoints.values():
            endpoint.engine.start()

    def start(self, body: dict[str, Any], context: RunContext | None = None) -> ActionStatus:
        request = parse_request(ComputeRequest, body, "compute")
        endpoint = self.endpoints.get(request.endpoint_id.lower())
        if endpoint is None:
            known = ", ".join(self.endpoints) or "none configured"
            message = (
                f"unknown compute endpoint {request.endpoint_id!r}: this machine runs only "
                f"{known} (compute.endpoint_id in beamflow.toml)"
            )
            raise ActionUnableToRunError(
                message, {"code": "UnknownEndpoint", "description": message}
            )
        jobs = []
        for task in request.tasks:
            function = self.resolve_function(task.function_id)
            if function is None:
                message = (
                    f"function {task.function_id!r} is not registered on the local backend: "
                    "run `beamflow register functions`"
                )
                raise ActionUnableToRunError(
                    message, {"code": "UnknownFunction", "description": message}
                )
            try:
                packed = endpoint.engine.pack_function(function)
            except EngineError as exc:
                raise ActionUnableToRunError(
                    str(exc), {"code": "FunctionNotShippable", "description": str(exc)}
                ) from None
            jobs.append(
                _Job(
                    task_id=str(uuid.uuid4()),
                    function_id=task.function_id,
                    function_name=getattr(function, "__name__", task.function_id),
                    function=packed,
                    args=task.args,
                    kwargs=task.kwargs,
                    resource_specification=request.resource_specification,
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
            endpoint.submit(job)
        return self._status(action)

    def status(self, action_id: str) -> ActionStatus:
        return self._status(self._action(action_id))

    def cancel(self, action_id: str) -> ActionStatus:
        action = self._action(action_id)
        endpoint = self.endpoints[action.endpoint_id.lower()]
        for job in action.jobs:
            endpoint.cancel(job)
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
        """Shut the engines down; tasks still running are stopped, waiting ones cancelled."""
        for endpoint in self.endpoints.values():
            endpoint.close()
        with self._lock:
            jobs = [j for a in self._actions.values() for j in a.jobs]
        for job in jobs:
            job.finish("CANCELED", error=_CANCELED)

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
                    "started": iso_time(j.started),
                    "completed": iso_time(j.finished),
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
            start_time=iso_time(action.created),
            completion_time=iso_time(completion),
            details=details,
            display_status=display,
            label=action.label,
        )
