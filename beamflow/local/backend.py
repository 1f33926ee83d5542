"""The local backend: registered flows run by beamflow's interpreter, in this process, with
the local Transfer and Compute action providers.

Registration (shared logic in :mod:`beamflow.registry`): a function's local id just names
``functions/NAME.py``; a flow's local id names a snapshot of its definition and input schema
written at registration (``state_dir/local_flows/<id>.json``), so a run uses what was
registered, as on Globus Flows, and ``register flows`` after editing a flow is what makes
the edit live.

Runs: :meth:`LocalRunBackend.start_run` validates the input against the flow's schema and runs
the flow in a background thread. A run lives in the process that started it, so its record
is what survives: ``state_dir/local_runs/<run id>.json`` is rewritten atomically on every
run-log entry and on a heartbeat, with the status, log, output, error, and the pid and host
of the process running it. Another process (the CLI, a restarted agent, the status page)
reads the record; a record that says ACTIVE while its process is gone (the pid is dead on
this host, or the heartbeat is stale) is marked FAILED: "lost: the process running it
ended". ``cancel_run`` from another process leaves a cancel request next to the record,
which the owning process acts on within a second.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from beamflow.atomic import atomic_write_json
from beamflow.config import ConfigError, Settings
from beamflow.error_kinds import ErrorKind
from beamflow.local.actions import ActionProvider, iso_time
from beamflow.local.flow_run import RunResult
from beamflow.local.interpreter import FlowDefinitionError, FlowRunner
from beamflow.local.validation import validate_input
from beamflow.processes import pid_alive
from beamflow.registry import (
    RegistrationResult,
    Registry,
    RegistryError,
    content_checksum,
    load_function,
    register_flows,
    register_functions,
)
from beamflow.runs.backend import FlowRunInfo, RunBackendError, StepInfo
from beamflow.runs.records import RunStatus

log = logging.getLogger(__name__)

_STATUS = {
    "ACTIVE": RunStatus.ACTIVE,
    "INACTIVE": RunStatus.INACTIVE,
    "SUCCEEDED": RunStatus.SUCCEEDED,
    "FAILED": RunStatus.FAILED,
    "ENDED": RunStatus.CANCELLED,
}
# States shown as steps of a run (the others are plumbing: choices, waits, failures).
_STEP_TYPES = ("Action", "Pass", "ExpressionEval")
LOST = "lost: the process running it ended"


def _parse_time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class _LocalRun:
    """One run started by this process; ``record`` is what goes to disk."""

    def __init__(self, path: Path, record: dict[str, Any], runner: FlowRunner) -> None:
        self.path = path
        self.record = record
        self.runner = runner
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.done = threading.Event()

    def persist(self) -> None:
        with self.lock:
            self.record["heartbeat"] = time.time()
            atomic_write_json(self.path, self.record, durable=False)

    def append_log(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.record["log"].append(entry)
        self.persist()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return json.loads(json.dumps(self.record, default=str))


class LocalRunBackend:
    """Flows on one machine; see the module docstring."""

    name = "local"

    def __init__(
        self,
        settings: Settings,
        *,
        providers: Mapping[str, ActionProvider] | None = None,
        # Action status here is a read of this process's memory: polled soon and often,
        # a 5 ms transfer is not billed 200 ms, nor a finished reconstruction 2 s.
        poll_interval: float = 0.05,
        max_poll_interval: float = 1.0,
        heartbeat_seconds: float = 5.0,
        stale_after: float = 60.0,
        clock: Any = None,
    ) -> None:
        self.settings = settings
        self.registry = Registry(settings.registry_path, self.name)
        self.runs_dir = settings.state_dir / "local_runs"
        self.flows_dir = settings.state_dir / "local_flows"
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.heartbeat_seconds = heartbeat_seconds
        self.stale_after = stale_after
        self.clock = clock
        self._providers = dict(providers) if providers is not None else None
        self._owned_providers: list[Any] = []
        self._runs: dict[str, _LocalRun] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._host = socket.gethostname()

    # -- registration ------------------------------------------------------------------------
    def register_functions(self, *, dry_run: bool = False) -> list[RegistrationResult]:
        # A local function id only names functions/NAME.py; an update keeps the id. The
        # function must load (and be callable) before it is registered.
        def create(name: str) -> str:
            load_function(name)
            return str(uuid.uuid4())

        def update(name: str, function_id: str) -> str:
            load_function(name)
            return function_id

        try:
            return register_functions(self.registry, create=create, update=update, dry_run=dry_run)
        except RegistryError as exc:
            raise RunBackendError(str(exc)) from None

    def register_flows(self, *, dry_run: bool = False) -> list[RegistrationResult]:
        import flows

        def snapshot(name: str, flow_id: str) -> str:
            definition, schema = flows.load_definition(name), flows.load_schema(name)
            try:
                FlowRunner(definition, {})  # validates, as the service does on deploy
            except FlowDefinitionError as exc:
                raise RunBackendError(f"flows/{name}.json: {exc}") from None
            self.flows_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(
                self.flows_dir / f"{flow_id}.json",
                {
                    "id": flow_id,
                    "name": name,
                    "checksum": content_checksum(definition, schema),
                    "definition": definition,
                    "input_schema": schema,
                    "registered_at": time.time(),
                },
            )
            return flow_id

        try:
            return register_flows(
                self.registry,
                create=lambda name: snapshot(name, str(uuid.uuid4())),
                update=snapshot,
                exists=lambda flow_id: (self.flows_dir / f"{flow_id}.json").is_file(),
                dry_run=dry_run,
            )
        except RegistryError as exc:
            raise RunBackendError(str(exc)) from None

    def _registered_flow(self, flow: str) -> dict[str, Any]:
        entry = self.registry.get("flow", flow)
        if entry is None:
            raise RunBackendError(
                f"flow {flow!r} is not registered for the local backend: run "
                "`beamflow register flows`",
                step="Start",
            )
        path = self.flows_dir / f"{entry.id}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            raise RunBackendError(
                f"flow {flow!r} is registered as {entry.id} but its snapshot {path} is missing "
                "or damaged: run `beamflow register flows` again",
                step="Start",
            ) from None

    # -- providers ---------------------------------------------------------------------------
    def _action_providers(self) -> dict[str, ActionProvider]:
        with self._lock:
            if self._providers is None:
                from beamflow.local.compute import LocalComputeProvider
                from beamflow.local.transfer import LocalTransferProvider

                try:
                    compute = LocalComputeProvider.from_settings(self.settings)
                except ConfigError as exc:
                    raise RunBackendError(str(exc), step="Start") from None
                transfer = LocalTransferProvider.from_settings(self.settings)
                self._owned_providers = [transfer, compute]
                self._providers = {transfer.url: transfer, compute.url: compute}
            return self._providers

    def warm(self) -> None:
        """Start the compute engine now, in the background, so that the first run does not
        wait for its worker pool (the agent and the demo call this when they start)."""
        for provider in self._action_providers().values():
            warm = getattr(provider, "warm", None)
            if warm is not None:
                warm()

    # -- runs --------------------------------------------------------------------------------
    def start_run(self, flow: str, body: dict[str, Any], *, label: str, tags: list[str]) -> str:
        if self._closing.is_set():
            raise RunBackendError("the local backend is closed", step="Start")
        registered = self._registered_flow(flow)
        problems = validate_input(body, registered.get("input_schema"))
        if problems:
            raise RunBackendError(
                f"input for flow {flow!r} does not match its schema: " + "; ".join(problems),
                step="Start",
            )
        try:
            runner = FlowRunner(
                registered["definition"],
                self._action_providers(),
                flow_id=registered["id"],
                input_schema=registered.get("input_schema"),
                clock=self.clock,
                poll_interval=self.poll_interval,
                max_poll_interval=max(self.poll_interval, self.max_poll_interval),
            )
        except FlowDefinitionError as exc:
            raise RunBackendError(f"flow {flow!r}: {exc}", step="Start") from None
        if runner.missing_providers:
            raise RunBackendError(
                f"flow {flow!r} uses action providers the local backend does not have: "
                + ", ".join(runner.missing_providers),
                step="Start",
            )
        run_id = str(uuid.uuid4())
        now = time.time()
        record = {
            "run_id": run_id,
            "flow": flow,
            "flow_id": registered["id"],
            "label": label,
            "tags": list(tags),
            "status": "ACTIVE",
            "input": body,
            "log": [],
            "output": None,
            "error": None,
            "details": None,
            "start_time": iso_time(now),
            "completion_time": None,
            "pid": os.getpid(),
            "host": self._host,
            "heartbeat": now,
        }
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        run = _LocalRun(self.runs_dir / f"{run_id}.json", record, runner)
        run.persist()  # on disk before anything happens, so it can never be unknown
        with self._lock:
            self._runs[run_id] = run
        run.thread = threading.Thread(
            target=self._execute, args=(run, body), name=f"local-run-{run_id[:8]}", daemon=True
        )
        run.thread.start()
        self._ensure_heartbeat()
        return run_id

    def _execute(self, run: _LocalRun, body: dict[str, Any]) -> None:
        rec = run.record
        try:
            result: RunResult | None = run.runner.run(
                body,
                run_id=rec["run_id"],
                label=rec["label"],
                tags=rec["tags"],
                on_log=run.append_log,
            )
        except Exception as exc:  # the interpreter refused late: still end the run, with why
            log.exception("local run %s could not run", rec["run_id"])
            result = None
            error = {"Error": "States.Runtime", "Cause": f"{type(exc).__name__}: {exc}"}
        with run.lock:
            if self._closing.is_set() and (result is None or result.status == "ENDED"):
                # Ended by close(), not by a user: to a later reader the run was lost.
                rec["status"] = "FAILED"
                rec["error"] = {"Error": "RunLost", "Cause": f"{LOST} (backend closed)"}
            elif result is None:
                rec["status"] = "FAILED"
                rec["error"] = error
            else:
                rec["status"] = result.status
                rec["output"] = result.output
                rec["error"] = result.error
                rec["details"] = result.details
                rec["log"] = result.log
            rec["completion_time"] = iso_time(time.time())
        run.persist()
        run.done.set()
        with self._lock:
            self._runs.pop(rec["run_id"], None)

    def _ensure_heartbeat(self) -> None:
        with self._lock:
            if self._heartbeat is not None and self._heartbeat.is_alive():
                return
            self._heartbeat = threading.Thread(
                target=self._beat, name="local-runs-heartbeat", daemon=True
            )
            self._heartbeat.start()

    def _beat(self) -> None:
        # Cancel requests are checked every second; the heartbeat is written less often.
        last = 0.0
        while not self._closing.wait(1.0):
            with self._lock:
                runs = list(self._runs.values())
            if not runs:
                continue
            for run in runs:
                request = run.path.with_suffix(".cancel")
                if request.exists():
                    with contextlib.suppress(FileNotFoundError):
                        request.unlink()
                    run.runner.cancel(run.record["run_id"])
            if time.time() - last >= self.heartbeat_seconds:
                last = time.time()
                for run in runs:
                    if not run.done.is_set():
                        run.persist()

    def _read_record(self, run_id: str) -> dict[str, Any]:
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise RunBackendError(f"{run_id!r} is not a local run id")
        path = self.runs_dir / f"{run_id}.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise RunBackendError(f"no local run {run_id} (no record in {self.runs_dir})") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise RunBackendError(
                f"{path}: cannot read the run record: {exc}", transient=True
            ) from None

    def _record(self, run_id: str) -> dict[str, Any]:
        with self._lock:
            run = self._runs.get(run_id)
        if run is not None:
            return run.snapshot()
        record = self._read_record(run_id)
        if record.get("status") in ("ACTIVE", "INACTIVE") and self._is_lost(record):
            record = self._mark_lost(run_id, record)
        return record

    def _is_lost(self, record: dict[str, Any]) -> bool:
        pid, host = record.get("pid"), record.get("host")
        if host == self._host and isinstance(pid, int):
            if pid == os.getpid():
                return False  # another backend object in this process owns it
            if not pid_alive(pid):
                return True
        beat = record.get("heartbeat") or 0
        return time.time() - beat > self.stale_after

    def _mark_lost(self, run_id: str, record: dict[str, Any]) -> dict[str, Any]:
        beat = record.get("heartbeat")
        when = iso_time(beat) if isinstance(beat, int | float) else "never"
        record["status"] = "FAILED"
        record["error"] = {
            "Error": "RunLost",
            "Cause": f"{LOST} (pid {record.get('pid')} on {record.get('host')}, "
            f"last heartbeat {when})",
        }
        record["completion_time"] = iso_time(time.time())
        atomic_write_json(self.runs_dir / f"{run_id}.json", record, durable=False)
        return record

    def get_run(self, backend_run_id: str) -> FlowRunInfo:
        record = self._record(backend_run_id)
        status = _STATUS.get(str(record.get("status")), RunStatus.FAILED)
        end = _parse_time(record.get("completion_time"))
        steps = steps_from_log(
            record.get("log") or [],
            finished=status.finished,
            end=end,
            ended_as="CANCELLED" if status == RunStatus.CANCELLED else "FAILED",
        )
        error = record.get("error") or None
        output = record.get("output")
        text, step = None, None
        if status == RunStatus.FAILED:
            err = error or {}
            step = err.get("state_name")
            text = f"{err.get('Error', 'Failed')}: {err.get('Cause', '')}".rstrip(": ")
        if status == RunStatus.CANCELLED:
            text = "canceled"
        return FlowRunInfo(
            backend_run_id=backend_run_id,
            status=status,
            steps=steps,
            output=output
            if isinstance(output, dict)
            else ({} if output is None else {"value": output}),
            error=text,
            error_step=step,
            error_kind=ErrorKind.LOST if (error or {}).get("Error") == "RunLost" else None,
        )

    def run_log(self, backend_run_id: str) -> list[dict[str, Any]]:
        """The run's log entries (Globus codes), for `runs show` and debugging."""
        return list(self._record(backend_run_id).get("log") or [])

    def cancel_run(self, backend_run_id: str) -> None:
        with self._lock:
            run = self._runs.get(backend_run_id)
        if run is not None:
            run.runner.cancel(backend_run_id)
            return
        record = self._record(backend_run_id)  # marks it lost if its process is gone
        if record.get("status") not in ("ACTIVE", "INACTIVE"):
            return  # already over
        # Another live process runs it: ask it, through a file next to the record.
        request = self.runs_dir / f"{backend_run_id}.cancel"
        atomic_write_json(request, {"requested_at": time.time(), "by_pid": os.getpid()})

    def wait(self, backend_run_id: str, timeout: float | None = None) -> FlowRunInfo:
        """Block until a run of this process ends (tests, `runs start --wait`)."""
        with self._lock:
            run = self._runs.get(backend_run_id)
        if run is not None:
            run.done.wait(timeout)
        return self.get_run(backend_run_id)

    def close(self) -> None:
        """Stop: runs still going are cancelled and recorded as lost; workers stop."""
        self._closing.set()
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.runner.cancel(run.record["run_id"])
        for run in runs:
            run.done.wait(timeout=30)
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        for provider in self._owned_providers:
            with contextlib.suppress(Exception):
                provider.close()


def steps_from_log(
    entries: list[dict[str, Any]],
    *,
    finished: bool = False,
    end: float | None = None,
    ended_as: str = "CANCELLED",
) -> list[StepInfo]:
    """Steps with timings from Globus-style run-log entries (``<Type>Started`` /
    ``<Type>Completed`` / ``ActionFailed`` with ``details.state_name``). In a run that has
    ended, a step still open ended with it (``ended_as``: a lost run's step FAILED, a
    cancelled run's CANCELLED)."""
    steps: dict[str, StepInfo] = {}
    for entry in entries:
        details = entry.get("details") or {}
        name, kind = details.get("state_name"), details.get("state_type")
        if not name or kind not in _STEP_TYPES:
            continue
        code = str(entry.get("code", ""))
        at = _parse_time(entry.get("time"))
        if code.endswith("Started"):
            info: dict[str, Any] = {"type": kind}
            if kind == "Action":
                info["input"] = details.get("input")
            steps[name] = StepInfo(name=name, status="ACTIVE", started_at=at, details=info)
        elif name in steps:
            step = steps[name]
            if code.endswith("Completed"):
                step.status = "SUCCEEDED"
                step.finished_at = at
                output = details.get("output")
                if kind == "Action" and isinstance(output, dict):
                    step.details["action"] = {
                        k: output.get(k)
                        for k in ("action_id", "status", "display_status", "details")
                    }
                    step.details.pop("input", None)
            elif code.endswith("Failed"):
                step.status = "FAILED"
                step.finished_at = at
                step.details["error"] = details.get("error")
                step.details.pop("input", None)
    if finished:
        for step in steps.values():
            if step.status == "ACTIVE":
                step.status = ended_as
                step.finished_at = end
    for step in steps.values():
        if step.status == "ACTIVE" and step.details.get("type") == "Action":
            step.details.update(_progress_of(step.details.get("input")))
    return list(steps.values())


def _progress_of(action_input: Any) -> dict[str, Any]:
    """Iteration progress of a running compute task that writes ``progress.json`` into its
    ``output_dir`` (functions/reconstruct.py does); empty when there is none."""
    try:
        kwargs = action_input["tasks"][0]["kwargs"]
        path = Path(kwargs["output_dir"]) / "progress.json"
        data = json.loads(path.read_text())
    except (KeyError, IndexError, TypeError, OSError, ValueError):
        return {}
    return {k: data[k] for k in ("iteration", "iterations_total", "loss") if k in data}
