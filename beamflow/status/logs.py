"""A run's logs, read-only: everything beamflow keeps about one run, in the order it happened.

What exists for a run (and nothing else is shown; only runs in the store have logs):

- the run's events in the store: the edge agent's and the run path's lines for this run
  (created, queued, started, retried, failed, ...), all of them, not only the recent ones
  the run page lists;
- each step as the flow backend reported it: for an action step the provider's own document
  (the compute task's result or its exception and traceback, the transfer task's counts),
  for a failed step the error it failed with.

The engine's worker logs (``<state_dir>/compute-engine/``) are shared by every task of the
process and are not served here; the agent's own log goes to its stderr (the journal under
systemd).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from beamflow.status.views import format_time, step_label
from beamflow.store import Run, Store

MAX_EVENTS = 5000


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


class RunLog(BaseModel):
    """``/api/runs/{id}/logs``."""

    run_id: str
    events: list[LogLine]
    steps: list[StepLog]

    def text(self) -> str:
        """The whole log as plain text (``/runs/{id}/logs.txt``)."""
        lines = [f"# run {self.run_id}", "", "## events"]
        lines += [f"{e.time_text}  {e.level:<7} {e.code:<20} {e.message}" for e in self.events]
        for step in self.steps:
            lines += ["", f"## step {step.label} ({step.name}): {step.status.lower()}, "
                      f"{step.started_text} – {step.finished_text}"]
            if step.output:
                lines.append(step.output)
        return "\n".join(lines) + "\n"


def _output(details: dict[str, Any]) -> str:
    if not details:
        return ""
    return json.dumps(details, indent=2, sort_keys=True, default=str)


def run_log(store: Store, run: Run) -> RunLog:
    events = store.events(run.id, limit=MAX_EVENTS)
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
    )
