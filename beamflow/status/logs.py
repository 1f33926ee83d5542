"""A run's logs, read-only: everything beamflow keeps about one run, in the order it happened.

What exists for a run (and nothing else is shown; only runs in the store have logs):

- the run's events in the store: the edge agent's and the run path's lines for this run
  (created, queued, started, retried, failed, ...), all of them, not only the recent ones
  the run page lists;
- each step as the flow backend reported it: for an action step the provider's own document
  (the compute task's result or its exception and traceback, the transfer task's counts),
  for a failed step the error it failed with;
- on the local backend, the flow run's own log, which the backend keeps whole in
  ``<state_dir>/local_runs/<flow run id>.json`` (every state entered and left, with the
  actions' inputs and outputs): only the file of the run's own flow run id, read-only.

The engine's worker logs (``<state_dir>/compute-engine/``) are shared by every task of the
process and are not served here; the agent's own log goes to its stderr (the journal under
systemd).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from beamflow.runs.records import Run
from beamflow.runs.store import Store
from beamflow.status.views import format_time, step_label

MAX_EVENTS = 5000
MAX_FLOW_LOG_BYTES = 32 << 20  # a run record larger than this is not read into the page
_RUN_ID = re.compile(r"^[0-9a-fA-F-]{8,64}$")  # the local backend's flow run ids (uuid4)


class LogLine(BaseModel):
    time: float
    time_text: str
    level: str
    code: str
    message: str


class StepLog(BaseModel):
    name: str
    label: str
    status: str
    started_text: str
    finished_text: str
    output: str  # the step's recorded details, as indented JSON ("" when none)


class FlowLogEntry(BaseModel):
    time: str  # as the flow run log writes it (ISO 8601)
    code: str
    description: str
    details: str  # indented JSON ("" when none)


class RunLog(BaseModel):
    """``/api/runs/{id}/logs``."""

    run_id: str
    events: list[LogLine]
    steps: list[StepLog]
    flow_log: list[FlowLogEntry] = []
    flow_log_note: str | None = None  # why there is no flow run log, where that is worth saying

    def text(self) -> str:
        """The whole log as plain text (``/runs/{id}/logs.txt``)."""
        lines = [f"# run {self.run_id}", "", "## events"]
        lines += [f"{e.time_text}  {e.level:<7} {e.code:<20} {e.message}" for e in self.events]
        for step in self.steps:
            lines += ["", f"## step {step.label} ({step.name}): {step.status.lower()}, "
                      f"{step.started_text} – {step.finished_text}"]
            if step.output:
                lines.append(step.output)
        if self.flow_log or self.flow_log_note:
            lines += ["", "## flow run log"]
            if self.flow_log_note:
                lines.append(self.flow_log_note)
            for entry in self.flow_log:
                lines.append(f"{entry.time}  {entry.code}  {entry.description}")
                if entry.details:
                    lines.append(entry.details)
        return "\n".join(lines) + "\n"


def _output(details: dict[str, Any]) -> str:
    if not details:
        return ""
    return json.dumps(details, indent=2, sort_keys=True, default=str)


def flow_log(run: Run, local_runs: Path | None) -> tuple[list[FlowLogEntry], str | None]:
    """The local backend's log of the run's flow run, and a note where it cannot be read."""
    if local_runs is None or run.backend != "local" or not run.backend_run_id:
        return [], None
    if not _RUN_ID.match(run.backend_run_id):  # the id names a file: never a path
        return [], f"flow run id {run.backend_run_id!r} is not a local run id"
    path = local_runs / f"{run.backend_run_id}.json"
    try:
        if path.stat().st_size > MAX_FLOW_LOG_BYTES:
            return [], f"{path.name} is over {MAX_FLOW_LOG_BYTES >> 20} MiB: read it on disk"
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return [], f"no flow run record {path.name} (pruned, or another state directory)"
    except (OSError, ValueError) as exc:
        return [], f"{path.name} cannot be read: {exc}"
    entries = record.get("log") if isinstance(record, dict) else None
    if not isinstance(entries, list):
        return [], f"{path.name} holds no run log"
    out = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        details = entry.get("details")
        out.append(FlowLogEntry(
            time=str(entry.get("time") or ""), code=str(entry.get("code") or ""),
            description=str(entry.get("description") or ""),
            details=_output(details) if isinstance(details, dict) else "",
        ))
    return out, None


def run_log(store: Store, run: Run, local_runs: Path | None = None) -> RunLog:
    events = store.events(run.id, limit=MAX_EVENTS)
    entries, note = flow_log(run, local_runs)
    return RunLog(
        run_id=run.id,
        events=[
            LogLine(time=e.time, time_text=format_time(e.time), level=e.level, code=e.code,
                    message=e.message)
            for e in events
        ],
        steps=[
            StepLog(
                name=s.name, label=step_label(s.name), status=s.status,
                started_text=format_time(s.started_at), finished_text=format_time(s.finished_at),
                output=_output(s.details),
            )
            for s in store.steps(run.id)
        ],
        flow_log=entries,
        flow_log_note=note,
    )
