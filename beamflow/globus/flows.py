"""Globus Flows: deploy flows/ definitions, start runs, read their status and logs.

The run log is the only place the service tells what each state did and when, so steps and
their timings are rebuilt from it: ``<Type>Started`` opens a visit of a state,
``<Type>Completed`` / ``<Type>Failed`` / ... closes it (``details.state_name`` names the
state). A run's error is the failure record the flows write at ``$.failure`` (step,
description, error) when there is one, else the last failed state, else the run's own
description.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import globus_sdk
from pydantic import BaseModel, Field

from beamflow.globus.errors import exists_on_service, globus_errors
from beamflow.globus.roles import FlowRoles, RunRoles
from beamflow.registry import GoneOnService
from beamflow.runs.backend import FlowRunInfo, StepInfo
from beamflow.runs.records import RunStatus

log = logging.getLogger(__name__)

# Globus run statuses → the run store's. ENDED is what the service calls a cancelled run.
RUN_STATUS: dict[str, RunStatus] = {
    "ACTIVE": RunStatus.ACTIVE,
    "INACTIVE": RunStatus.INACTIVE,
    "SUCCEEDED": RunStatus.SUCCEEDED,
    "FAILED": RunStatus.FAILED,
    "ENDED": RunStatus.CANCELLED,
}

# How a log code ends → the state's status after it.
_EVENT_STATUS: tuple[tuple[str, str], ...] = (
    ("Started", "ACTIVE"),
    ("Resumed", "ACTIVE"),
    ("Completed", "SUCCEEDED"),
    ("Succeeded", "SUCCEEDED"),
    ("Failed", "FAILED"),
    ("TimedOut", "FAILED"),
    ("Timeout", "FAILED"),
    ("Inactive", "INACTIVE"),
    ("Canceled", "CANCELLED"),
    ("Cancelled", "CANCELLED"),
)
_FINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
LOG_PAGE = 100  # the service's maximum page size


def run_status(globus_status: str) -> RunStatus:
    """The run store's status for a Globus run status (unknown ones count as ACTIVE)."""
    status = RUN_STATUS.get(str(globus_status).upper())
    if status is None:
        log.warning("unknown Globus run status %r, treated as ACTIVE", globus_status)
        return RunStatus.ACTIVE
    return status


def parse_time(value: Any) -> float | None:
    """Unix seconds of an ISO 8601 time as Globus writes it (``...+00:00`` or ``Z``)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _event(code: str) -> tuple[str, str] | None:
    """(state type, status) for a state event code such as ``ActionCompleted``."""
    for suffix, status in _EVENT_STATUS:
        if code.endswith(suffix) and len(code) > len(suffix):
            return code[: -len(suffix)], status
    return None


def _action_summary(output: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an action status document worth keeping on a step (not the whole
    payload: a Compute result or a Transfer listing can be large)."""
    keep: dict[str, Any] = {}
    for key in ("action_id", "status", "display_status", "start_time", "completion_time"):
        if key in output:
            keep["action_status" if key == "status" else key] = output[key]
    details = output.get("details")
    if isinstance(details, Mapping):
        for key in (
            "task_id",
            "status",
            "nice_status",
            "files",
            "files_transferred",
            "files_skipped",
            "bytes_transferred",
            "faults",
            "label",
        ):
            if key in details:
                keep[f"transfer_{key}" if key != "task_id" else "task_id"] = details[key]
    return keep


def steps_from_logs(entries: Iterable[Mapping[str, Any]]) -> list[StepInfo]:
    """The run's states in the order first entered, with status and timings."""
    steps: dict[str, StepInfo] = {}
    for entry in entries:
        code = str(entry.get("code", ""))
        details = entry.get("details") or {}
        name = details.get("state_name") if isinstance(details, Mapping) else None
        parsed = _event(code)
        if not name or parsed is None:
            continue  # flow-level entries (FlowStarted, FlowSucceeded, ...)
        state_type, status = parsed
        when = parse_time(entry.get("time"))
        step = steps.get(name)
        if step is None:
            step = steps[name] = StepInfo(name=name, status=status, details={"type": state_type})
        if status == "ACTIVE" and code.endswith("Started"):
            if step.finished_at is not None:  # a state entered again (a loop): a new visit
                step.finished_at = None
                step.started_at = when
            step.started_at = step.started_at or when
        elif status in _FINAL:
            step.finished_at = when
            if step.started_at is None:
                step.started_at = when
        output = details.get("output")
        if isinstance(output, Mapping):
            step.details.update(_action_summary(output))
            # ExceptionOnActionFailure=false: the state completes, but the action failed.
            if output.get("status") == "FAILED" and status == "SUCCEEDED":
                status = "FAILED"
        if status == "FAILED":
            cause = _failure_text(details)
            if cause:
                step.details["error"] = cause
        step.status = status
    return list(steps.values())


def _short(value: Any, limit: int = 500) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _failure_text(details: Mapping[str, Any]) -> str | None:
    """The most specific words about a failure found in a log entry's details."""
    candidates: list[Any] = []
    output = details.get("output")
    for where in (details, output if isinstance(output, Mapping) else {}):
        for key in ("cause", "Cause", "error", "Error", "exception", "description"):
            if where.get(key):
                candidates.append(where[key])
        inner = where.get("details")
        if isinstance(inner, Mapping):
            for key in ("exception", "error", "cause", "result", "description", "nice_status"):
                if inner.get(key):
                    candidates.append(inner[key])
    return _short(candidates[0]) if candidates else None


def _caught_text(error: Any) -> str:
    """What a Catch recorded (``{"Error": ..., "Cause": ...}``) as one line."""
    if isinstance(error, Mapping):
        cause = error.get("Cause") or error.get("cause")
        kind = error.get("Error") or error.get("error")
        if isinstance(cause, str):
            try:  # the Cause of an action failure is often the action status, as JSON
                cause_doc = json.loads(cause)
            except ValueError:
                cause_doc = None
            if isinstance(cause_doc, Mapping):
                inner = _failure_text(cause_doc)
                cause = inner or cause
        if kind and cause:
            return _short(f"{kind}: {cause}")
        return _short(cause or kind or error)
    return _short(error)


def failure_record(entries: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The flows' own failure record ($.failure: step, description, caught error), in the
    last state output that holds one."""
    for entry in reversed(entries):
        details = entry.get("details") or {}
        output = details.get("output") if isinstance(details, Mapping) else None
        failure = output.get("failure") if isinstance(output, Mapping) else None
        if isinstance(failure, Mapping) and failure.get("step"):
            return failure
    return None


def run_error(
    run: Mapping[str, Any], entries: list[Mapping[str, Any]], steps: list[StepInfo]
) -> tuple[str | None, str | None]:
    """(error, error_step) of a run that did not succeed."""
    # 1. the flows' own failure record ($.failure), in any state output
    failure = failure_record(entries)
    if failure is not None:
        text = str(failure.get("description") or "failed")
        if failure.get("error") is not None:
            text = f"{text}: {_caught_text(failure['error'])}"
        return _short(text, 1000), str(failure["step"])
    # 2. the last state that failed
    for step in reversed(steps):
        if step.status == "FAILED":
            return step.details.get("error") or f"state {step.name} failed", step.name
    # 3. what the run document says
    details = run.get("details") or {}
    description = details.get("description") if isinstance(details, Mapping) else None
    return (_short(description) if description else None), None


def run_info(run: Mapping[str, Any], entries: list[Mapping[str, Any]]) -> FlowRunInfo:
    """A FlowRunInfo from a run document (get_run) and its log entries (oldest first)."""
    status = run_status(str(run.get("status", "")))
    steps = steps_from_logs(entries)
    details = run.get("details") or {}
    output = details.get("output") if isinstance(details, Mapping) else None
    error = error_step = None
    if status in (RunStatus.FAILED, RunStatus.INACTIVE, RunStatus.CANCELLED):
        error, error_step = run_error(run, entries, steps)
    if status == RunStatus.INACTIVE:
        hint = (
            "the run is waiting (often for a consent or a fresh login): run `beamflow login`, "
            "then resume it"
        )
        error = f"{error}; {hint}" if error else hint
    if status == RunStatus.CANCELLED and not error:
        error = "cancelled"
    output = dict(output) if isinstance(output, Mapping) else {}
    if status == RunStatus.FAILED and "failure" not in output:
        # The run document of a failed run holds no output: the record is in the log, and
        # the run path reads the kind of the fault and its cause from it.
        output["failure"] = failure_record(entries)
    return FlowRunInfo(
        backend_run_id=str(run.get("run_id") or run.get("action_id")),
        status=status,
        steps=steps,
        output=output,
        error=error,
        error_step=error_step,
    )


# -- service calls ------------------------------------------------------------------------------
def flow_title(name: str) -> str:
    return f"beamflow {name}"


def create_flow(
    client: globus_sdk.FlowsClient,
    name: str,
    definition: dict[str, Any],
    input_schema: dict[str, Any],
    roles: FlowRoles,
) -> str:
    """Deploy a flow with its roles; returns its id. The definition and schema are sent
    unchanged."""
    with globus_errors(f"create the flow {name!r} on Globus Flows", step="register"):
        response = client.create_flow(
            title=flow_title(name),
            definition=definition,
            input_schema=input_schema,
            subtitle=_subtitle(definition),
            keywords=["beamflow", name],
            **roles.model_dump(),
        )
    return str(response["id"])


def update_flow(
    client: globus_sdk.FlowsClient,
    flow_id: str,
    name: str,
    definition: dict[str, Any],
    input_schema: dict[str, Any],
    roles: FlowRoles,
) -> str:
    """Replace a deployed flow's definition, schema and roles; returns its id. Raises
    :class:`beamflow.registry.GoneOnService` when the flow was deleted on the service (the
    registry then creates it again)."""
    with globus_errors(f"update the flow {name!r} ({flow_id}) on Globus Flows", step="register"):
        try:
            response = client.update_flow(
                flow_id,
                title=flow_title(name),
                definition=definition,
                input_schema=input_schema,
                subtitle=_subtitle(definition),
                keywords=["beamflow", name],
                **roles.model_dump(),
            )
        except globus_sdk.FlowsAPIError as exc:
            if exc.http_status != 404:
                raise
            log.warning("flow %s (%s) is gone from Globus Flows; creating it again", name, flow_id)
            raise GoneOnService(flow_id) from exc
    return str(response["id"])


class ServiceValidation(BaseModel):
    """What the Flows service said of a definition and schema (``POST /flows/validate``)."""

    valid: bool
    problems: list[str] = Field(default_factory=list)
    scopes: dict[str, list[str]] = Field(default_factory=dict)


def validate_flow(
    client: globus_sdk.FlowsClient,
    name: str,
    definition: dict[str, Any],
    input_schema: dict[str, Any] | None,
) -> ServiceValidation:
    """Ask the service whether it would deploy the flow; its refusal comes back as
    ``valid=False`` with one problem per line, never as an exception."""
    with globus_errors(f"validate the flow {name!r} with Globus Flows", step="register"):
        try:
            response = client.validate_flow(
                definition, input_schema=globus_sdk.MISSING if input_schema is None
                else input_schema,
            )  # fmt: skip
        except globus_sdk.FlowsAPIError as exc:
            if exc.http_status not in (400, 422):
                raise
            return ServiceValidation(valid=False, problems=service_problems(exc))
    scopes = response.get("scopes") if isinstance(response.data, dict) else None
    return ServiceValidation(valid=True, scopes=scopes if isinstance(scopes, dict) else {})


def service_problems(exc: globus_sdk.FlowsAPIError) -> list[str]:
    """The service's reasons, one per line: ``$.definition.States.X: message``."""
    body = exc.raw_json if isinstance(exc.raw_json, dict) else {}
    error = body.get("error") if isinstance(body.get("error"), dict) else body
    detail = error.get("detail")
    if isinstance(detail, list):
        lines = []
        for item in detail:
            if not isinstance(item, Mapping):
                lines.append(str(item))
                continue
            where = "$." + ".".join(str(p) for p in item.get("loc") or [])
            lines.append(f"{where}: {item.get('msg', item)}" if item.get("loc") else
                         str(item.get("msg", item)))  # fmt: skip
        if lines:
            return lines
    if isinstance(detail, str) and detail:
        return [detail]
    return [str(error.get("message") or exc.message or exc.text or f"HTTP {exc.http_status}")]


def deployed_flow(client: globus_sdk.FlowsClient, flow_id: str) -> dict[str, Any] | None:
    """The service's document of a flow (its roles included, for its owner and
    administrators), or None when it is gone or not shared with this identity."""
    found: dict[str, Any] = {}

    def lookup() -> None:
        found.update(client.get_flow(flow_id).data)

    if not exists_on_service(f"look up flow {flow_id} on Globus Flows", lookup):
        return None
    return found


def flow_exists(client: globus_sdk.FlowsClient, flow_id: str) -> bool:
    """Whether the service still has the flow (False on 404 or 403: gone, or not ours)."""
    return exists_on_service(f"look up flow {flow_id} on Globus Flows",
                             lambda: client.get_flow(flow_id))  # fmt: skip


def _subtitle(definition: Mapping[str, Any]) -> str:
    comment = str(definition.get("Comment", ""))
    first = comment.split(". ")[0].strip()
    return first[:120]


def get_logs(client: globus_sdk.FlowsClient, run_id: str) -> list[dict[str, Any]]:
    """Every log entry of a run, oldest first (all pages)."""
    entries: list[dict[str, Any]] = []
    with globus_errors(f"read the log of run {run_id}"):
        for page in client.paginated.get_run_logs(run_id, limit=LOG_PAGE):
            entries.extend(page["entries"])
    return entries


def get_run(client: globus_sdk.FlowsClient, run_id: str) -> FlowRunInfo:
    with globus_errors(f"read the status of run {run_id}"):
        run = client.get_run(run_id).data
    return run_info(run, get_logs(client, run_id))


def start_run(
    client: globus_sdk.SpecificFlowClient,
    body: dict[str, Any],
    *,
    label: str,
    tags: list[str],
    roles: RunRoles,
) -> str:
    """Start a run with its managers and monitors; returns the run id. Labels are cut to the
    service's 64 characters."""
    with globus_errors("start the flow run", step="start"):
        response = client.run_flow(body, label=label[:64], tags=tags, **roles.model_dump())
    return str(response["run_id"])


def cancel_run(client: globus_sdk.FlowsClient, run_id: str) -> None:
    with globus_errors(f"cancel run {run_id}"):
        client.cancel_run(run_id)


def resume_run(client: globus_sdk.SpecificFlowClient, run_id: str) -> None:
    with globus_errors(f"resume run {run_id}"):
        client.resume_run(run_id)
