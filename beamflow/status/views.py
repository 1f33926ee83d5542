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

from pydantic import BaseModel, field_serializer

from beamflow.store import Event, Run, RunStatus, Step

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


class RunView(_View):
    """A run as the page and the API show it (the store's fields plus derived ones)."""

    id: str
    scan: str
    scan_path: str | None = None  # the master (or .cxi) file or scan directory
    display_name: str = ""  # tells scans of the same file name apart (store.display_names)
    status: RunStatus
    status_label: str
    status_icon: str
    backend: str
    flow: str
    label: str | None
    current_step: str | None
    iteration: int | None
    iterations_total: int | None
    progress: float | None  # 0..1 where known
    progress_text: str
    fraction: float | None
    attempt: int
    parent_run_id: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    duration: float | None
    duration_text: str
    started_text: str
    finished_text: str
    error: str | None
    error_step: str | None
    product: str | None
    url: str
    finished: bool
    verdict: str | None = None  # "trusted" / "suspect" once a reconstruction finished
    verdict_reasons: list[str] = []

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
        return cls(
            id=run.id,
            scan=run.scan,
            scan_path=run.scan_path,
            display_name=display_name or run.scan,
            status=run.status,
            status_label=STATUS_LABEL[run.status],
            status_icon=STATUS_ICON[run.status],
            backend=run.backend,
            flow=run.flow,
            label=run.label,
            current_step=run.current_step,
            iteration=run.iteration,
            iterations_total=run.iterations_total,
            progress=progress,
            progress_text=text,
            fraction=run.fraction,
            attempt=run.attempt,
            parent_run_id=run.parent_run_id,
            created_at=run.created_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
            duration=run.duration,
            duration_text=format_duration(run.duration),
            started_text=format_time(run.started_at or run.created_at),
            finished_text=format_time(run.finished_at),
            error=run.error,
            error_step=run.error_step,
            product=run.product,
            url=f"/runs/{run.id}",
            finished=run.status.finished,
            verdict=run.verdict,
            verdict_reasons=run.verdict_reasons,
        )


class StepView(_View):
    name: str
    status: str
    icon: str
    started_at: float | None
    finished_at: float | None
    duration: float | None
    duration_text: str
    started_text: str
    details: dict[str, Any]
    # Position on the run's time axis, percent of the whole (for the timeline bars).
    left: float = 0.0
    width: float = 0.0

    @classmethod
    def of(cls, step: Step) -> StepView:
        duration = step.duration
        if duration is None and step.started_at is not None and step.status.upper() in (
            "ACTIVE", "RUNNING"
        ):
            duration = time.time() - step.started_at
        return cls(
            name=step.name,
            status=step.status,
            icon=STEP_ICON.get(step.status.upper(), "queued"),
            started_at=step.started_at,
            finished_at=step.finished_at,
            duration=duration,
            duration_text=format_duration(duration),
            started_text=format_time(step.started_at),
            details=step.details,
        )


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
    return [(key, format_value(value)) for key, value in sorted(run.parameters.items())]


def timeline(steps: list[Step], now: float | None = None) -> list[StepView]:
    """Steps with their place on one time axis: where each starts and how long it takes."""
    views = [StepView.of(s) for s in steps]
    starts = [v.started_at for v in views if v.started_at is not None]
    if not starts:
        return views
    now = time.time() if now is None else now
    t0 = min(starts)
    ends = [
        v.finished_at if v.finished_at is not None else (now if v.started_at else t0)
        for v in views
    ]
    span = max(max(ends) - t0, 1e-9)
    for view, end in zip(views, ends, strict=True):
        if view.started_at is None:
            continue
        view.left = round(100 * (view.started_at - t0) / span, 2)
        # A step of a few milliseconds still gets a visible sliver.
        view.width = round(max(100 * (end - view.started_at) / span, 0.6), 2)
        view.width = min(view.width, round(100 - view.left, 2)) or 0.6
    return views
