"""Globus Transfer: the state of a run's transfer tasks, and whether collections answer.

A flow's Transfer actions run as ordinary Transfer tasks; the action's output names the task
(``details.task_id``). For a task still moving (or one that failed) Transfer itself says the
most: files and bytes so far, and the faults.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import globus_sdk

from beamflow.globus.errors import globus_errors
from beamflow.runs.backend import StepInfo

# Action URLs of the Transfer action provider (current and older; with or without "/").
_TRANSFER_URLS = ("transfer.actions.globus.org", "actions.globus.org/transfer")
_TASK_FIELDS = (
    "task_id",
    "status",
    "nice_status",
    "label",
    "files",
    "files_transferred",
    "files_skipped",
    "bytes_transferred",
    "faults",
    "subtasks_failed",
    "request_time",
    "completion_time",
)
FINAL_TASK_STATUSES = {"SUCCEEDED", "FAILED"}


def transfer_states(definition: Mapping[str, Any]) -> set[str]:
    """Names of the Action states of a flow definition that call Transfer."""
    states = definition.get("States") or {}
    return {
        name
        for name, state in states.items()
        if isinstance(state, Mapping)
        and state.get("Type") == "Action"
        and any(u in str(state.get("ActionUrl", "")) for u in _TRANSFER_URLS)
    }


def task_summary(task: Mapping[str, Any]) -> dict[str, Any]:
    """What a run shows of a Transfer task document."""
    return {key: task[key] for key in _TASK_FIELDS if key in task}


def get_task(client: globus_sdk.TransferClient, task_id: str) -> dict[str, Any]:
    with globus_errors(f"read Transfer task {task_id}"):
        return task_summary(client.get_task(task_id).data)


def attach_task_status(
    client: globus_sdk.TransferClient,
    steps: Iterable[StepInfo],
    transfer_step_names: set[str],
    cache: dict[str, dict[str, Any]],
) -> None:
    """Put the Transfer task's status on each transfer step that names a task and has not
    succeeded. Finished tasks are read once (``cache``); a failed lookup is noted on the
    step, never raised: the run's own status does not depend on it."""
    for step in steps:
        task_id = step.details.get("task_id")
        if step.name not in transfer_step_names or not task_id or step.status == "SUCCEEDED":
            continue
        summary = cache.get(task_id)
        if summary is None:
            try:
                summary = get_task(client, task_id)
            except Exception as exc:  # noqa: BLE001 - shown on the step, the run goes on
                step.details["transfer_error"] = str(exc)
                continue
            if summary.get("status") in FINAL_TASK_STATUSES:
                cache[task_id] = summary
        step.details["transfer"] = summary


def check_collection(client: globus_sdk.TransferClient, collection_id: str) -> tuple[str, str]:
    """Look the collection up and list its root; returns (description, entity type, e.g.
    ``GCSv5_mapped_collection``); raises RunBackendError."""
    with globus_errors(f"look up collection {collection_id}"):
        info = client.get_endpoint(collection_id).data
    name = info.get("display_name") or info.get("canonical_name") or collection_id
    with globus_errors(f"list '/' on collection {name} ({collection_id})"):
        listing = client.operation_ls(collection_id, path="/")
    entries = len(listing["DATA"]) if "DATA" in listing else 0
    kind = str(info.get("entity_type") or "collection")
    return f"{name} ({kind}): '/' lists {entries} entries", kind
