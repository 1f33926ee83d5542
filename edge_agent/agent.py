"""The edge agent: watch the detector, start the right runs, never lose or repeat a scan.

The run store is the source of truth. Every decision the agent takes is written there
before it acts on it, keyed so that it cannot be taken twice:

- a run is *created* (QUEUED) under a dedupe key ``<scan path>#<part>`` — the store refuses
  a second run with the same key, so a scan part is processed once however often the agent
  restarts or sees the same files;
- a run is *launched* (ACTIVE, with the backend's run id) when there is capacity and no
  earlier run of the same scan is unfinished (runs of one scan are serialised, so each
  continues from the checkpoint of the one before);
- a run is *followed* by polling the backend with back-off until it ends.

Killed at any moment and restarted, the agent finds QUEUED runs and starts them, finds
ACTIVE runs and re-attaches to them by run id; a run whose process died with the agent
(local backend) is reported lost by the backend and retried, within the retry budget.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from beamflow import runs as run_path
from beamflow.backend import Backend, BackendError, get_backend
from beamflow.config import Settings
from beamflow.store import DuplicateRun, Run, RunStatus, Store

from .scans import Readiness, ScanState, assess, find_scans
from .watch import ChangedScans, scans_in, start_observer

log = logging.getLogger("beamflow.agent")

FINAL = "final"
_UNFINISHED = (RunStatus.QUEUED, RunStatus.ACTIVE, RunStatus.INACTIVE)
_MAX_POLL_SECONDS = 30.0


@dataclass
class _Poll:
    due: float
    interval: float
    status: RunStatus | None = None


@dataclass
class _Tracked:
    first_seen_complete: bool | None = None
    next_check: float = 0.0


@dataclass
class AgentStats:
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    scans_seen: set[str] = field(default_factory=set)


def dedupe_key(scan_path: Path, part: str) -> str:
    return f"{scan_path}#{part}"


def is_transient(run: Run) -> bool:
    """Faults worth a retry: a lost worker, transfers, timeouts, connectivity. Bad input
    (the reader's or the function's validation errors) is never retried."""
    text = f"{run.error_step or ''} {run.error or ''}".lower()
    if any(word in text for word in ("scanformaterror", "invalid", "bad input", "not a readable")):
        return False
    return any(
        word in text
        for word in (
            "lost",
            "transfer",
            "timeout",
            "timed out",
            "connection",
            "unavailable",
            "token",
            "temporar",
        )
    )


class EdgeAgent:
    """Watches ``settings.beamline.detector_dir`` and drives runs through the backend."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        backend: Backend | None = None,
        clock=time.time,  # noqa: ANN001 - injectable for tests
    ) -> None:
        self.settings = settings
        self.policy = settings.agent
        self.store = store or Store(settings.store_path)
        self.backend = backend or get_backend(settings)
        self.clock = clock
        self.root = Path(settings.beamline.detector_dir)
        self.changes = ChangedScans()
        self.stats = AgentStats()
        self._stop = threading.Event()
        self._tracked: dict[Path, _Tracked] = {}
        self._polls: dict[str, _Poll] = {}
        self._retry_at: dict[str, float] = {}
        self._last_rescan = float("-inf")

    # -- lifecycle -------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()
        self.changes.wakeup.set()

    def run_forever(self) -> None:
        """Watch and process until :meth:`stop` (SIGTERM) is called."""
        self.root.mkdir(parents=True, exist_ok=True)
        observer = start_observer(
            self.root, self.changes, self.policy.observer, self.policy.poll_seconds
        )
        log.info(
            "agent started",
            extra={"fields": {"watch": str(self.root), "backend": self.backend.name}},
        )
        try:
            while not self._stop.is_set():
                self.tick()
                self.changes.wakeup.wait(timeout=min(0.25, self.policy.quiet_seconds / 4 or 0.25))
        finally:
            observer.stop()
            observer.join(timeout=5)
            log.info("agent stopped", extra={"fields": self._stats_fields()})

    def run_once(self, timeout: float | None = None) -> bool:
        """Process every scan that is ready now, wait for those runs; True if all succeeded.

        Scans still being written are left for a running agent. Runs queued or active from
        before are finished too.
        """
        deadline = None if timeout is None else self.clock() + timeout
        mine: set[str] = set()
        for path in find_scans(self.root):
            state = self._assess(path)
            if state.readiness in (Readiness.COMPLETE, Readiness.ABORTED, Readiness.BROKEN):
                run = self._ensure_final(state)
                if run is not None:
                    mine.add(run.id)
        mine.update(r.id for r in self._unfinished())
        while not self._stop.is_set():
            self._schedule()
            self._follow()
            runs = [self.store.require_run(i) for i in mine]
            if all(r.status.finished for r in runs):
                return all(r.status == RunStatus.SUCCEEDED for r in runs)
            if deadline is not None and self.clock() > deadline:
                log.error("--once: timed out waiting for runs")
                return False
            time.sleep(min(0.2, self.policy.poll_seconds))
        return False

    # -- one pass --------------------------------------------------------------------------
    def tick(self) -> None:
        self._discover()
        self._check_scans()
        self._schedule()
        self._follow()

    def _discover(self) -> None:
        now = self.clock()
        candidates: set[Path] = set()
        for directory in self.changes.take():
            candidates.update(scans_in(directory))
        if now - self._last_rescan >= self.policy.rescan_seconds:
            self._last_rescan = now
            candidates.update(find_scans(self.root))
        for path in candidates:
            if path not in self._tracked and not self._finalised(path):
                self._tracked[path] = _Tracked()
                self.stats.scans_seen.add(str(path))
                log.info("scan seen", extra={"fields": {"scan": str(path)}})
            elif path in self._tracked:
                self._tracked[path].next_check = 0.0  # something changed: look now

    def _check_scans(self) -> None:
        now = self.clock()
        for path, tracked in list(self._tracked.items()):
            if now < tracked.next_check:
                continue
            tracked.next_check = now + min(1.0, max(0.1, self.policy.quiet_seconds / 2))
            if not path.exists():
                self._tracked.pop(path)
                continue
            state = self._assess(path)
            if tracked.first_seen_complete is None:
                tracked.first_seen_complete = state.readiness != Readiness.WRITING
            if state.readiness == Readiness.WRITING:
                if not tracked.first_seen_complete:
                    for fraction, frames in state.due_fractions(self.policy.progressive):
                        self._ensure_partial(state, fraction, frames)
                continue
            self._ensure_final(state)
            self._tracked.pop(path)

    def _assess(self, path: Path) -> ScanState:
        return assess(
            path,
            quiet_seconds=self.policy.quiet_seconds,
            stall_timeout=self.policy.stall_timeout,
            now=self.clock(),
        )

    def _finalised(self, path: Path) -> bool:
        return self.store.get_run_by_key(dedupe_key(path, FINAL)) is not None

    # -- creating runs (idempotent) ----------------------------------------------------------
    def _create(
        self, state: ScanState, part: str, *, fraction: float | None, extra: dict
    ) -> Run | None:
        params = {**self.settings.reconstruction.model_dump(), **extra}
        try:
            run = run_path.create_scan_run(
                self.settings,
                self.store,
                state.path,
                params=params,
                dedupe_key=dedupe_key(state.path, part),
                fraction=fraction,
                flow=self.policy.flow,
            )
        except DuplicateRun:
            return None
        log.info(
            "run queued",
            extra={
                "fields": {"run": run.id, "scan": state.name, "part": part, "frames": state.frames}
            },
        )
        return run

    def _ensure_partial(self, state: ScanState, fraction: float, frames: int) -> None:
        self._create(state, f"{fraction:.3f}", fraction=fraction, extra={"max_frames": frames})

    def _ensure_final(self, state: ScanState) -> Run | None:
        extra: dict = {}
        if state.readiness == Readiness.ABORTED:
            extra = {"max_frames": state.frames, "aborted": True}
        run = self._create(state, FINAL, fraction=1.0, extra=extra)
        if run is not None and state.readiness == Readiness.BROKEN:
            run = self.store.update_run(
                run.id, status=RunStatus.FAILED, error=state.error, error_step="Readiness"
            )
            self.stats.failed += 1
            log.error("scan unreadable", extra={"fields": {"run": run.id, "error": state.error}})
        return run

    # -- starting runs -------------------------------------------------------------------------
    def _unfinished(self) -> list[Run]:
        return [
            r
            for r in self.store.list_runs(status=_UNFINISHED, limit=None, oldest_first=True)
            if r.backend == self.backend.name
        ]

    def _schedule(self) -> None:
        now = self.clock()
        unfinished = self._unfinished()
        running = [r for r in unfinished if r.status != RunStatus.QUEUED]
        busy_scans = {r.scan_path for r in running}
        capacity = self.policy.max_concurrent_runs - len(running)
        for run in unfinished:
            if run.status != RunStatus.QUEUED:
                continue
            if run.scan_path in busy_scans:
                continue  # serialised per scan, in creation order
            busy_scans.add(run.scan_path)
            if capacity <= 0 or self._retry_at.get(run.id, 0.0) > now:
                continue
            capacity -= 1
            self._launch(run)

    def _launch(self, run: Run) -> None:
        try:
            run = run_path.launch_run(self.settings, self.store, self.backend, run)
        except BackendError as exc:
            self._failed_to_start(run, exc)
            return
        self.stats.started += 1
        self._polls[run.id] = _Poll(
            due=self.clock() + self.policy.poll_seconds,
            interval=self.policy.poll_seconds,
            status=run.status,
        )
        log.info(
            "run started",
            extra={"fields": {"run": run.id, "scan": run.scan, "backend_run": run.backend_run_id}},
        )

    def _failed_to_start(self, run: Run, exc: BackendError) -> None:
        if exc.transient and run.attempt <= self.policy.max_retries:
            self._requeue(run, f"could not start: {exc}")
            return
        self.store.update_run(
            run.id, status=RunStatus.FAILED, error=str(exc), error_step=exc.step or "Start"
        )
        self.stats.failed += 1
        log.error("run failed to start", extra={"fields": {"run": run.id, "error": str(exc)}})

    def _requeue(self, run: Run, reason: str) -> None:
        delay = self.policy.retry_backoff_seconds * 2 ** (run.attempt - 1)
        self._retry_at[run.id] = self.clock() + delay
        self.store.update_run(
            run.id,
            status=RunStatus.QUEUED,
            attempt=run.attempt + 1,
            backend_run_id=None,
            started_at=None,
            finished_at=None,
        )
        self.store.add_event(
            run.id,
            "RetryScheduled",
            f"attempt {run.attempt + 1} in {delay:.0f} s: {reason}",
            level="warning",
        )
        self.stats.retried += 1
        log.warning(
            "run retry",
            extra={"fields": {"run": run.id, "attempt": run.attempt + 1, "reason": reason}},
        )

    # -- following runs ------------------------------------------------------------------------
    def _follow(self) -> None:
        now = self.clock()
        for run in self._unfinished():
            if run.status == RunStatus.QUEUED or not run.backend_run_id:
                continue
            poll = self._polls.setdefault(
                run.id, _Poll(due=now, interval=self.policy.poll_seconds, status=run.status)
            )
            if now < poll.due:
                continue
            try:
                run = run_path.sync_run(self.store, self.backend, run)
            except BackendError as exc:
                poll.interval = min(poll.interval * 2, _MAX_POLL_SECONDS)
                poll.due = now + poll.interval
                log.warning("poll failed", extra={"fields": {"run": run.id, "error": str(exc)}})
                continue
            if run.status != poll.status:
                poll.interval = self.policy.poll_seconds
                poll.status = run.status
            else:
                poll.interval = min(poll.interval * 1.5, _MAX_POLL_SECONDS)
            poll.due = now + poll.interval
            if run.status.finished:
                self._polls.pop(run.id, None)
                self._finished(run)

    def _finished(self, run: Run) -> None:
        if (
            run.status == RunStatus.FAILED
            and is_transient(run)
            and run.attempt <= self.policy.max_retries
        ):
            self._requeue(run, f"{run.error_step}: {run.error}")
            return
        if run.status == RunStatus.SUCCEEDED:
            self.stats.succeeded += 1
        elif run.status == RunStatus.FAILED:
            self.stats.failed += 1
        log.info(
            "run finished",
            extra={
                "fields": {
                    "run": run.id,
                    "scan": run.scan,
                    "status": str(run.status),
                    "error": run.error,
                }
            },
        )

    def _stats_fields(self) -> dict:
        return {
            "started": self.stats.started,
            "succeeded": self.stats.succeeded,
            "failed": self.stats.failed,
            "retried": self.stats.retried,
        }
