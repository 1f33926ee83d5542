"""What the page and the JSON API show of a run: one place for labels, progress and previews.

The HTML templates and the JSON API are built from the same view models, so the page rendered
by the server and the rows the browser script redraws from ``/api/runs`` always agree.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path, PurePath
from typing import Any

from pydantic import BaseModel, Field, field_serializer

from beamflow.agent_state import ONCE_PREFIX, AgentStateError, read_state
from beamflow.ptycho.state import settings_that_apply
from beamflow.runs.records import Attempt, Event, Run, RunStatus, Step

# Icon ids in static/icons.svg. Every status has an icon and a word, never colour alone.
STATUS_ICON: dict[str, str] = {
    RunStatus.QUEUED: "queued",
    RunStatus.ACTIVE: "active",
    RunStatus.INACTIVE: "inactive",
    RunStatus.SUCCEEDED: "ok",
    RunStatus.FAILED: "failed",
    RunStatus.CANCELLED: "cancelled",
}
STATUS_LABEL: dict[str, str] = {
    RunStatus.QUEUED: "Queued",
    RunStatus.ACTIVE: "Running",
    RunStatus.INACTIVE: "Waiting",
    RunStatus.SUCCEEDED: "Succeeded",
    RunStatus.FAILED: "Failed",
    RunStatus.CANCELLED: "Cancelled",
}
# Steps come from the flow's run log with free-form statuses; map the common ones.
STEP_ICON: dict[str, str] = {
    "SUCCEEDED": "ok",
    "FAILED": "failed",
    "ACTIVE": "active",
    "RUNNING": "active",
    "QUEUED": "queued",
    "PENDING": "queued",
    "INACTIVE": "inactive",
    "CANCELLED": "cancelled",
    "SKIPPED": "cancelled",
}

FULL_PHASE = "object_phase_full"
# Preview kinds in the order the page shows them; matched on the file name.
_KINDS: list[tuple[str, tuple[str, ...], str]] = [
    ("object_phase", ("phase",), "Object phase"),
    # The full [−π, π) view of the phase: offered as a link on the windowed phase's figure
    # (see previews_of), a figure of its own only when there is no windowed one.
    (FULL_PHASE, (), "Object phase, full range"),
    ("object_amplitude", ("amplitude", "amp", "modulus", "abs"), "Object amplitude"),
    # A thick sample's layers, each on its own (the images above show their product).
    ("object_layers", ("layers",), "Object layers"),
    ("probe", ("probe",), "Probe"),
    ("convergence", ("convergence", "loss", "losses", "error", "errors"), "Convergence"),
]
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
               ".gif": "image/gif", ".webp": "image/webp"}


def format_duration(seconds: float | None) -> str:
    """Short and human: ``4.2 s``, ``3 min 12 s``, ``1 h 05 min``."""
    if seconds is None:
        return "–"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def format_time(t: float | None) -> str:
    """Local wall-clock time as the control room reads it (the browser redraws in its zone)."""
    if t is None:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def format_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(", ", ": "), default=str)


def preview_kind(path: str) -> tuple[str, str]:
    """(kind, label) of a preview file from its name; unknown names keep their own name."""
    # Whole words only: "sample.png" is not an amplitude, "probe_phase.png" is a probe.
    words = set(re.split(r"[^a-z0-9]+", PurePath(path).stem.lower()))
    if "probe" in words:
        return "probe", "Probe"
    if {"phase", "full"} <= words:
        return FULL_PHASE, "Object phase, full range"
    for kind, needles, label in _KINDS:
        if words.intersection(needles):
            return kind, label
    return "other", PurePath(path).stem.replace("_", " ")


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _View(BaseModel):
    """Times are Unix seconds inside and ISO 8601 UTC in JSON, as in ``runs list --json``."""

    @field_serializer("*", when_used="json")
    def _times(self, value: Any, info: Any) -> Any:
        if info.field_name.endswith("_at") or info.field_name == "time":
            return iso(value)
        return value


class PreviewView(BaseModel):
    index: int
    name: str
    kind: str
    label: str
    url: str
    exists: bool
    is_image: bool
    version: int  # file mtime in ns: changes when a progressive run rewrites the preview
    full_range_url: str | None = None  # object phase: its full [−π, π) view, when listed


class RunView(Run):
    """A run as the page and the API show it: the stored run (its large ``parameters`` and
    ``result`` left out of the JSON: the run's detail carries them) plus what is derived
    for people. Times are ISO 8601 UTC in JSON, as in ``runs list --json``."""

    parameters: dict[str, Any] = Field(default_factory=dict, exclude=True)
    result: dict[str, Any] = Field(default_factory=dict, exclude=True)
    display_name: str = ""  # tells scans of the same file name apart (store.display_names)
    status_label: str
    status_icon: str
    progress: float | None  # 0..1 where known
    progress_text: str
    duration_text: str
    started_text: str
    finished_text: str
    url: str
    finished: bool
    truth_text: str | None = None

    @classmethod
    def of(cls, run: Run, display_name: str | None = None) -> RunView:
        progress: float | None = None
        text = ""
        if run.iteration is not None and run.iterations_total:
            progress = min(1.0, max(0.0, run.iteration / run.iterations_total))
            text = f"iteration {run.iteration} of {run.iterations_total}"
        elif run.iteration is not None:
            text = f"iteration {run.iteration}"
        if run.status == RunStatus.SUCCEEDED:
            progress = 1.0
            text = text or "done"
        nrmse = run.truth_nrmse
        return cls(
            **run.model_dump(exclude=set(Run.model_computed_fields)),
            display_name=display_name or run.scan_name,
            status_label=STATUS_LABEL[run.status],
            status_icon=STATUS_ICON[run.status],
            progress=progress,
            progress_text=text,
            duration_text=format_duration(run.duration),
            started_text=format_time(run.started_at or run.created_at),
            finished_text=format_time(run.finished_at),
            url=f"/runs/{run.id}",
            finished=run.status.finished,
            truth_text=None if nrmse is None else f"{nrmse:.3f} complex NRMSE against the "
            "simulator's ground truth",
        )


def step_label(name: str) -> str:
    """A flow state's name in words: "TransferScanToHPC" -> "Transfer scan to HPC" (the
    page wraps between words, never inside one)."""
    words = re.findall(r"[A-Z]+(?=[A-Z][a-z]|\d|\b|_|$)|[A-Z]?[a-z]+|\d+|[A-Z]+", name)
    if not words:
        return name
    out = [words[0]] + [w if w.isupper() and len(w) > 1 else w.lower() for w in words[1:]]
    return " ".join(out)


class StepView(_View):
    name: str
    label: str = ""  # the name in words, for people
    status: str
    icon: str
    started_at: float | None
    finished_at: float | None
    duration: float | None
    duration_text: str
    started_text: str
    details: dict[str, Any]
    # The step's bar: how far the step got, percent. A finished step is a full bar (its
    # colour says how it ended, the text its duration); a running one shows the run's
    # iterations where it reports them, else an indeterminate bar; a waiting one is empty.
    left: float = 0.0
    width: float = 0.0
    indeterminate: bool = False

    @classmethod
    def of(cls, step: Step) -> StepView:
        duration = step.duration
        if duration is None and step.started_at is not None and step.status.upper() in (
            "ACTIVE", "RUNNING"
        ):
            duration = time.time() - step.started_at
        return cls(
            name=step.name,
            label=step_label(step.name),
            status=step.status,
            icon=STEP_ICON.get(step.status.upper(), "queued"),
            started_at=step.started_at,
            finished_at=step.finished_at,
            duration=duration,
            duration_text=format_duration(duration),
            started_text=format_time(step.started_at),
            details=step.details,
        )


class AttemptView(_View):
    """One attempt of a run (:meth:`beamflow.runs.store.Store.attempts`), as the run page lists
    them: when it started and ended, how, and why."""

    attempt: int
    status: RunStatus
    status_label: str
    started_at: float | None
    finished_at: float | None
    duration_text: str
    error: str | None
    error_step: str | None
    error_step_text: str | None
    error_kind: str | None

    @classmethod
    def of(cls, attempt: Attempt) -> AttemptView:
        return cls(
            attempt=attempt.attempt, status=attempt.status,
            status_label=STATUS_LABEL[attempt.status], started_at=attempt.started_at,
            finished_at=attempt.finished_at, duration_text=format_duration(attempt.duration),
            error=attempt.error, error_step=attempt.error_step,
            error_step_text=step_label(attempt.error_step) if attempt.error_step else None,
            error_kind=attempt.error_kind.value if attempt.error_kind else None,
        )  # fmt: skip


class EventView(_View):
    time: float
    time_text: str
    level: str
    code: str
    message: str

    @classmethod
    def of(cls, event: Event) -> EventView:
        return cls(
            time=event.time,
            time_text=format_time(event.time),
            level=event.level,
            code=event.code,
            message=event.message,
        )


def resolve_listed(path: str, root: Path | None) -> Path:
    """The file a run lists, as a path on this machine (relative entries under ``root``)."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = (root or Path.cwd()) / p
    return p


def previews_of(run: Run, root: Path | None) -> list[PreviewView]:
    """The run's previews, newest file of each known kind, in a stable display order.

    Progressive runs may list a new file for the same kind at each stage; the page shows the
    last one listed (the agent appends in the order they arrive). URLs carry the file's mtime so
    the browser fetches a preview again exactly when it has been rewritten.
    """
    latest: dict[str, PreviewView] = {}
    others: list[PreviewView] = []
    for index, entry in enumerate(run.previews):
        kind, label = preview_kind(entry)
        path = resolve_listed(entry, root)
        try:
            st = path.stat()
            exists = path.is_file()
            version = st.st_mtime_ns
        except OSError:
            exists, version = False, 0
        view = PreviewView(
            index=index,
            name=PurePath(entry).name,
            kind=kind,
            label=label,
            url=f"/files/{run.id}/{index}?v={version}",
            exists=exists,
            is_image=PurePath(entry).suffix.lower() in IMAGE_TYPES,
            version=version,
        )
        if kind == "other":
            others.append(view)
        else:
            latest[kind] = view
    full = latest.get(FULL_PHASE)
    if full is not None and full.exists and "object_phase" in latest:
        latest["object_phase"].full_range_url = latest.pop(FULL_PHASE).url
    order = [k for k, _, _ in _KINDS]
    return [latest[k] for k in order if k in latest] + others


def parameters_of(run: Run) -> list[tuple[str, str]]:
    """The run's parameters as asked; where the engine used another value (an unset alpha,
    the batch size for the scan, ...: the summary's ``parameters``), that value follows."""
    summary = run.result.get("summary") if isinstance(run.result, dict) else None
    used = summary.get("parameters") if isinstance(summary, dict) else None
    used = used if isinstance(used, dict) else {}
    rows = []
    # Settings that do nothing for this run (mPIE's momenta on an rpie run, ...) are left out.
    shown = settings_that_apply({**run.parameters, **used})
    for key in sorted(shown):
        text = format_value(run.parameters[key]) if key in run.parameters else "–"
        if key in used and used[key] != run.parameters.get(key):
            text += f" → {format_value(used[key])} used"
        rows.append((key, text))
    return rows


def timeline(steps: list[Step], progress: float | None = None) -> list[StepView]:
    """The steps with their bars (see StepView). ``progress``: the run's iteration progress
    (0..1), shown on the running step."""
    views = [StepView.of(s) for s in steps]
    for view in views:
        if view.icon in ("ok", "failed", "cancelled") and view.finished_at is not None:
            view.width = 100.0
        elif view.icon == "active":
            if progress is not None:
                view.width = round(100 * min(1.0, max(0.0, progress)), 2)
            else:
                view.indeterminate = True
    return views


class WaitingView(BaseModel):
    name: str
    path: str
    wait: str
    reason: str
    frames: int
    expected: int | None
    since_text: str


class SkippedView(BaseModel):
    name: str
    path: str
    reason: str


class AgentView(BaseModel):
    """``/api/agent``: what the edge agent watches and waits for (from its agent.json)."""

    available: bool
    state: str  # none | running | stale | stopped | unreadable
    headline: str
    watching: str | None = None
    backend: str | None = None
    mode: str | None = None
    pid: int | None = None
    updated_at: float | None = None
    updated_text: str = "–"
    waiting: list[WaitingView] = []
    waiting_total: int = 0
    skipped: list[SkippedView] = []
    skipped_total: int = 0
    summary: str | None = None

    @field_serializer("updated_at", when_used="json")
    def _iso(self, value: float | None) -> str | None:
        return iso(value)

    @classmethod
    def of(cls, path: Path | None, now: float | None = None) -> AgentView:
        if path is None:
            return cls(available=False, state="none", headline="No agent state directory "
                       "is configured for this page.")
        try:
            state = read_state(path)
        except AgentStateError as exc:
            return cls(available=False, state="unreadable", headline=str(exc))
        if state is None:
            return cls(available=False, state="none", headline=(
                f"No edge agent has reported here yet (a running agent writes {path})."))
        now = time.time() if now is None else now
        when = format_time(state.updated_at)
        if state.stale(now):
            kind = "stale"
            headline = (f"Not responding: the agent (pid {state.pid}) last reported at {when}, "
                        f"{format_duration(now - state.updated_at)} ago. Is it still running?")
        elif state.running:
            kind = "running"
            headline = f"Watching {state.watching} ({state.backend} backend)"
        else:
            kind = "stopped"
            # Plain words: the panel shows text, not Markdown.
            headline = (f"beamflow agent --once ended at {when}: "
                        f"{state.summary.removeprefix(ONCE_PREFIX)}" if state.summary
                        else f"Stopped at {when}: no agent is watching {state.watching}")
        return cls(
            available=True, state=kind, headline=headline, watching=state.watching,
            backend=state.backend, mode=state.mode, pid=state.pid, updated_at=state.updated_at,
            updated_text=when,
            waiting=[WaitingView(name=w.name, path=w.path, wait=w.wait, reason=w.reason,
                                 frames=w.frames, expected=w.expected,
                                 since_text=format_time(w.since)) for w in state.waiting],
            waiting_total=state.waiting_total,
            skipped=[SkippedView(name=PurePath(f.path).name, path=f.path, reason=f.reason)
                     for f in state.skipped],
            skipped_total=state.skipped_total, summary=state.summary,
        )  # fmt: skip
