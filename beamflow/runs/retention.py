"""Retention: data that does not pile up, while run records and products stay.

``[retention]`` says how many days each kind of file stays once its scan's runs have ended:

- ``raw``: the cluster copy of a scan's frames, ``hpc.scratch_dir/<scan key>/raw/``;
- ``checkpoints``: ``hpc.scratch_dir/<scan key>/checkpoints/`` (a later run of the scan
  starts from iteration 0);
- ``previews``: a finished run's ``beamline.preview_dir/<run name>/previews/`` (its
  ``product.h5`` beside them stays).

The cluster's files are deleted by the retention flow (``flows/retention_cleanup.json``): its
``cleanup`` function runs where the files are and applies the rules of
:mod:`beamflow.cleanup_task` (only ``raw/`` and ``checkpoints/``, a scan untouched for the
kind's days, never a scan in ``keep`` or outside its root, never a product). On Globus a
Timer runs that flow every ``every_hours`` (:meth:`GlobusRunBackend.ensure_timer`, made by the
agent at start); on the local backend the agent runs it as often, as the Timer would. The
beamline's previews live on this host: they are deleted here, from the run store, which
knows which runs have finished.

Either way the run store says what went: every run of a cleaned scan (or the run whose
previews went) gets a ``Cleaned`` event and an entry in ``result["cleaned"]``; its record
and product stay. ``beamflow cleanup [--dry-run] [--older-than DAYS]`` does the same now and
says how much it freed.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from beamflow.atomic import atomic_write_json
from beamflow.cleanup_task import PRODUCT, clean
from beamflow.config import Settings
from beamflow.registry import Registry, RegistryError
from beamflow.runs.backend import FlowRunInfo, RunBackend, RunBackendError
from beamflow.runs.flow_input import run_resources
from beamflow.runs.naming import run_name_for, scan_key
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store

log = logging.getLogger(__name__)

FLOW = "retention_cleanup"
FUNCTION = "cleanup"
DAY = 86400.0
WHAT = {
    "raw": "the cluster copy of the raw frames",
    "checkpoints": "the checkpoints",
    "previews": "the previews",
}


class Item(BaseModel):
    """One directory that retention deleted (or, dry, would delete)."""

    kind: Literal["raw", "checkpoints", "previews"]
    path: str
    bytes: int = 0
    age_days: float = 0.0
    scan_key: str | None = None
    run_id: str | None = None  # previews: the run they belong to


class Skipped(BaseModel):
    path: str
    reason: str


class Report(BaseModel):
    """What one application of retention did."""

    dry_run: bool
    items: list[Item] = Field(default_factory=list)
    skipped: list[Skipped] = Field(default_factory=list)
    cluster_run: str | None = None  # the retention flow's run on the backend
    runs_told: int = 0  # runs whose record now says what went

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.items)


def size_text(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# -- beamline previews, from the run store --------------------------------------------------------
def _size(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def preview_dir_of(settings: Settings, run: Run) -> Path:
    name = run.result.get("run_name") or run_name_for(run)
    return Path(settings.beamline.preview_dir).resolve() / name / "previews"


def clean_previews(settings: Settings, store: Store, days: float | None, *, dry_run: bool,
                   now: float | None = None) -> Report:  # fmt: skip
    """Delete the previews of runs finished ``days`` ago (``None``: none), only inside
    ``beamline.preview_dir``, never a directory holding a product."""
    report = Report(dry_run=dry_run)
    if days is None:
        return report
    now = time.time() if now is None else now
    root = Path(settings.beamline.preview_dir).resolve()
    for run in store.list_runs(limit=None):
        if not run.status.finished or run.finished_at is None:
            continue
        age = (now - run.finished_at) / DAY
        target = preview_dir_of(settings, run)
        if age < days or not (target.exists() or target.is_symlink()):
            continue
        if target.is_symlink() or not target.resolve().is_relative_to(root):
            report.skipped.append(Skipped(path=str(target), reason=f"outside {root}"))
            continue
        if any(target.rglob(PRODUCT)):
            report.skipped.append(Skipped(path=str(target), reason=f"holds a {PRODUCT}"))
            continue
        size = _size(target)
        if not dry_run:
            shutil.rmtree(target)
        report.items.append(Item(kind="previews", path=str(target), bytes=size,
                                 age_days=round(age, 2), run_id=run.id))  # fmt: skip
    return report


# -- the cluster, through the retention flow ------------------------------------------------------
def in_flight(store: Store) -> list[str]:
    """Scan keys with a run that has not ended: the retention flow never touches them."""
    return sorted({scan_key(Path(r.scan_path)) for r in store.list_runs(limit=None)
                   if not r.status.finished})  # fmt: skip


def flow_input(settings: Settings, keep: list[str], *, dry_run: bool,
               older_than: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The retention flow's input (``keep``: scan keys in flight)."""
    try:
        function_id = Registry(settings.registry_path, settings.backend).require_id(
            "function", FUNCTION)
    except RegistryError as exc:
        raise RunBackendError(str(exc), step="Cleanup") from None
    days = settings.retention.days(older_than)
    return {
        "compute": {
            "endpoint_id": settings.compute.endpoint_id,
            "function_id": function_id,
            # The task is small: the preview resources (a short queue) when set.
            "user_endpoint_config": run_resources(settings, 0.5),
        },
        "cleanup": {
            "roots": [str(settings.hpc.scratch_dir)],
            "raw_days": days["raw"],
            "checkpoint_days": days["checkpoints"],
            "keep": keep,
            "dry_run": dry_run,
        },
    }


def cluster_report(info: FlowRunInfo, *, dry_run: bool) -> Report:
    """What the retention flow's run reported (its Compute action's result)."""
    if info.status != RunStatus.SUCCEEDED:
        raise RunBackendError(f"the retention flow's run {info.backend_run_id} ended "
                           f"{info.status.value}: {info.error or 'no reason given'}",
                           step=info.error_step or "Cleanup")  # fmt: skip
    details = (info.output.get("cleaned") or {}).get("details") or {}
    answers = [*(details.get("result") or [])[:1],
               *(r.get("output") for r in (details.get("results") or [])[:1])]
    for answer in answers:
        if isinstance(answer, dict) and "items" in answer:
            return Report(dry_run=dry_run, cluster_run=info.backend_run_id,
                          items=[Item(**i) for i in answer["items"]],
                          skipped=[Skipped(**s) for s in answer.get("skipped", [])])
    raise RunBackendError(f"the retention flow's run {info.backend_run_id} reported nothing",
                       step="Cleanup")


def start_cluster_cleanup(settings: Settings, store: Store, backend: RunBackend, *,
                          dry_run: bool, older_than: float | None = None) -> str:  # fmt: skip
    """Start the retention flow on the backend; returns its run id."""
    body = flow_input(settings, in_flight(store), dry_run=dry_run, older_than=older_than)
    return backend.start_run(FLOW, body, label="beamflow retention" + (" (dry run)" * dry_run),
                             tags=["beamflow", "retention"])


# -- the run store says what went -----------------------------------------------------------------
def record(store: Store, report: Report, now: float | None = None) -> int:
    """Tell every run concerned what retention deleted (an event, ``result["cleaned"]``;
    a run whose previews went lists none any more). Returns the runs told."""
    if report.dry_run or not report.items:
        return 0
    now = time.time() if now is None else now
    runs = store.list_runs(limit=None)
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        by_key.setdefault(scan_key(Path(run.scan_path)), []).append(run)
    told: set[str] = set()
    for item in report.items:
        concerned = ([r for r in runs if r.id == item.run_id] if item.run_id
                     else by_key.get(item.scan_key or "", []))  # fmt: skip
        for run in concerned:
            run = store.require_run(run.id)
            entry = {**item.model_dump(exclude={"run_id"}), "at": now}
            fields: dict[str, Any] = {
                "result": {**run.result, "cleaned": [*run.result.get("cleaned", []), entry]}}
            if item.kind == "previews":
                fields["previews"] = []
            store.update_run(run.id, **fields)
            store.add_event(run.id, "Cleaned",
                            f"retention deleted {WHAT[item.kind]} ({size_text(item.bytes)}): "
                            f"{item.path}; the run record and the product stay",
                            details=entry)  # fmt: skip
            told.add(run.id)
    return len(told)


def cleanup(settings: Settings, store: Store, backend: RunBackend, *, dry_run: bool,
            older_than: float | None = None, timeout: float = 3600.0,
            poll_seconds: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> Report:
    """Apply retention now (`beamflow cleanup`): the beamline's previews here, the
    cluster's files through the retention flow, waited for; recorded in the run store."""
    days = settings.retention.days(older_than)
    report = clean_previews(settings, store, days["previews"], dry_run=dry_run)
    if days["raw"] is not None or days["checkpoints"] is not None:
        run_id = start_cluster_cleanup(settings, store, backend, dry_run=dry_run,
                                       older_than=older_than)  # fmt: skip
        deadline = time.monotonic() + timeout
        info = backend.get_run(run_id)
        while not info.status.finished:
            if time.monotonic() > deadline:
                raise RunBackendError(f"the retention flow's run {run_id} did not end within "
                                   f"{timeout:.0f} s; it goes on (`beamflow cleanup` again "
                                   "later reports nothing twice)", step="Cleanup")
            sleep(poll_seconds)
            info = backend.get_run(run_id)
        cluster = cluster_report(info, dry_run=dry_run)
        report.items += cluster.items
        report.skipped += cluster.skipped
        report.cluster_run = run_id
    report.runs_told = record(store, report)
    return report


class RetentionPass:
    """Retention as the agent applies it, every ``retention.every_hours``, never blocking its
    loop: the previews here at once; on the local backend the retention flow started, as the
    Globus Timer would, and looked at on later passes; on Globus the Timer's runs that ended
    since the last pass read and recorded (the last one read is kept in
    ``state_dir/retention.json``, so none is recorded twice)."""

    def __init__(self, settings: Settings, store: Store, backend: RunBackend, *,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.settings, self.store, self.backend, self.clock = settings, store, backend, clock
        self.next_at = clock()  # the first pass at start
        self.running: str | None = None
        # Globus: a Timer runs the flow; the agent reads what its runs did.
        self.timer = getattr(backend, "finished_runs", None)
        self.state = Path(settings.state_dir) / "retention.json"

    def due_time(self) -> float:
        return self.next_at

    def tick(self) -> None:
        if self.running is not None:
            self._follow()
        if self.clock() < self.next_at:
            return
        self.next_at = self.clock() + self.settings.retention.every_hours * 3600
        days = self.settings.retention.days()
        self._done(clean_previews(self.settings, self.store, days["previews"], dry_run=False))
        if self.timer is not None:
            self._read_timer_runs()
        elif self.running is None and self._anything_due(days):
            try:
                self.running = start_cluster_cleanup(self.settings, self.store, self.backend,
                                                     dry_run=False)  # fmt: skip
            except RunBackendError as exc:
                log.error("retention flow not started", extra={"fields": {"error": str(exc)}})

    def _anything_due(self, days: dict[str, float | None]) -> bool:
        """The local backend's cluster is this machine: look (the same rules, deleting
        nothing) before starting the flow, so that a day with nothing due costs no task."""
        if days["raw"] is None and days["checkpoints"] is None:
            return False
        found = clean([str(self.settings.hpc.scratch_dir)], days["raw"], days["checkpoints"],
                      keep=in_flight(self.store), dry_run=True)  # fmt: skip
        return bool(found["items"])

    def _follow(self) -> None:
        assert self.running is not None
        info = self.backend.get_run(self.running)
        if not info.status.finished:
            return
        self.running = None
        self._report(info)

    def _read_timer_runs(self) -> None:
        assert self.timer is not None
        try:
            last = json.loads(self.state.read_text()).get("last_run")
        except (OSError, ValueError):
            last = None
        try:
            ended = self.timer(FLOW, after=last)
        except RunBackendError as exc:
            log.error("retention: the Timer's runs not read", extra={"fields": {
                "error": str(exc)}})  # fmt: skip
            return
        for info in ended:
            self._report(info)
        if ended:
            atomic_write_json(self.state, {"last_run": ended[-1].backend_run_id})

    def _report(self, info: FlowRunInfo) -> None:
        try:
            report = cluster_report(info, dry_run=False)
        except RunBackendError as exc:
            log.error("retention flow failed", extra={"fields": {
                "run": info.backend_run_id, "error": str(exc)}})  # fmt: skip
            return
        self._done(report)

    def _done(self, report: Report) -> None:
        told = record(self.store, report)
        if report.items:
            log.info("retention applied", extra={"fields": {
                "deleted": len(report.items), "freed": size_text(report.bytes),
                "runs_told": told}})  # fmt: skip
        for skipped in report.skipped:
            log.warning("retention skipped", extra={"fields": skipped.model_dump()})
