"""The edge agent: watch the detector, start the right runs, never lose or repeat a scan.

The run store is the source of truth. Every decision the agent takes is written there
before it acts on it, keyed so that it cannot be taken twice:

- a run is *created* (QUEUED) under a dedupe key ``agent:<scan path>#<part>`` — the store
  refuses a second run with the same key, so a scan part is processed once however often
  the agent restarts or sees the same files;
- a run is *launched* (ACTIVE, with the backend's run id) when there is capacity and no
  earlier run of the same scan is unfinished (runs of one scan are serialised, so each
  continues from the checkpoint of the one before);
- a run is *followed* by polling the backend with back-off until it ends.

Killed at any moment and restarted, the agent finds QUEUED runs and starts them, finds
ACTIVE runs and re-attaches to them by run id; a run whose process died with the agent
(local backend) is reported lost by the backend and retried, within the retry budget. A
retry reuses the same run record (``attempt`` goes up; the attempt that failed is kept with
it), so a scan never gets two runs.
Stopped cleanly (SIGTERM), the agent puts the runs that live in its own process (local
backend) back in the queue without using up a retry; runs on Globus go on regardless.

Progressive runs (``agent.progressive``, e.g. ``[0.25, 0.5]``): while a scan is written,
a run is queued for the largest fraction of its frames reached (``max_frames``); the final
run follows when the scan is complete (or aborted). They run one at a time, oldest first,
all with the scan's one checkpoint directory, so each continues from the one before; a
partial run still queued when a later one is queued is superseded (CANCELLED, with why).

Following runs: a remote service is polled from ``poll_seconds`` with back-off (×1.5 while
nothing changes, up to 10 × poll_seconds); a run inside this process is read every 0.1 s.
Failures are retried (``max_retries``, back-off doubling from ``retry_backoff_seconds``, or
from ``no_space_backoff_seconds`` for a full disk) when transient (see
:func:`edge_agent.policy.is_transient`); bad input never is. A retry keeps the run's record;
each earlier attempt is kept with it (``Store.attempts``: start, end, error and kind).

The agent only touches runs it created (their dedupe key starts with ``agent:``): runs that
people start by hand (``beamflow runs start``) belong to whoever started them.

This module is the loop: when to look at which scan, what to tell the operator about it
(log lines and ``agent.json``), and the two ways of running (a daemon, or ``--once``). What
a scan's files say is :mod:`edge_agent.scans`; turning a scan into runs and driving them
through the backend is :mod:`edge_agent.driver`; the keys and the retry rules are
:mod:`edge_agent.policy`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from beamflow.agent_state import (
    HEARTBEAT_SECONDS,
    MAX_LISTED,
    ONCE_PREFIX,
    AgentState,
    SkippedFile,
    WatchedScan,
    state_path,
    write_state,
)
from beamflow.config import Settings
from beamflow.run_backends import get_run_backend
from beamflow.runs import retention
from beamflow.runs.backend import RunBackend, RunBackendError
from beamflow.runs.records import RunStatus
from beamflow.runs.retention import RetentionPass
from beamflow.runs.store import Store

from .driver import AgentStats, RunDriver
from .policy import FINAL, dedupe_key
from .scans import Readiness, ScanState, assess, find_scans, find_skipped, skipped_in
from .watch import ChangedScans, scans_in, start_observer

log = logging.getLogger("beamflow.agent")

_RECHECK_SECONDS = 2.0  # a scan still short of frames is looked at this often without events
_MAX_WAIT = 1.0  # the main loop sleeps at most this long between passes


@dataclass
class _Tracked:
    """A scan the agent is watching until its final run is created."""

    first_seen_complete: bool | None = None
    next_check: float = 0.0
    # What the operator was last told about it (logged once per change) and since when.
    said: tuple | None = None
    waiting: WatchedScan | None = None


@dataclass
class OnceSummary:
    """What `beamflow agent --once` did, for its closing line."""

    processed: int = 0  # runs that succeeded
    waiting: int = 0  # scans still being written or not quiet: left for a running agent
    skipped: int = 0  # HDF5 files that are not scans
    failed: int = 0  # runs that failed or were cancelled, unreadable scans included
    done_before: int = 0  # scans processed by an earlier agent
    unfinished: int = 0  # runs still going when --timeout struck
    waiting_reasons: list[str] = field(default_factory=list)

    def line(self) -> str:
        text = (
            f"{ONCE_PREFIX}{self.processed} processed, {self.waiting} waiting, "
            f"{self.skipped} skipped, {self.failed} failed"
        )
        extra = [f"{n} {what}" for n, what in ((self.done_before, "done before"),
                                               (self.unfinished, "unfinished")) if n]
        return text + (f" ({', '.join(extra)})" if extra else "")


class EdgeAgent:
    """Watches ``settings.beamline.detector_dir`` and drives runs through the backend."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        backend: RunBackend | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.policy = settings.agent
        self.store = store or Store(settings.store_path)
        self.backend = backend or get_run_backend(settings)
        self.clock = clock
        self.root = Path(settings.beamline.detector_dir)
        self.changes = ChangedScans()
        self.stats = AgentStats()
        self.driver = RunDriver(settings, self.store, self.backend, self.stats, clock)
        self.retention = RetentionPass(settings, self.store, self.backend, clock=clock)
        self._stop = threading.Event()
        self._tracked: dict[Path, _Tracked] = {}
        self._done: set[Path] = set()  # scans whose final run exists (pruned at each rescan)
        self._last_rescan = float("-inf")
        self._skipped: dict[Path, SkippedFile] = {}
        self._state_file = state_path(settings.state_dir)
        self._mode = "watch"
        self._started_at = self.clock()
        self._published: tuple | None = None
        self._published_at = float("-inf")
        self.once_summary: OnceSummary | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to end (signal-safe: sets two events, nothing else)."""
        self._stop.set()
        self.changes.wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def prepare(self, warm: bool = True) -> None:
        """Make sure the flow and function can be run. On the embedded backend registration
        is local and idempotent, so the agent does it (a fresh `beamflow init` workspace
        works at once); on Globus it is a deliberate step (`beamflow register`). ``warm``:
        start the embedded compute engine now, for a daemon whose first scan may come any
        moment (`--once` starts it with its first run, or never when nothing is ready)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.driver.runs_outlive_agent:
            self._retention_timer()
            return
        for what, register in (
            ("functions", self.backend.register_functions),
            ("flows", self.backend.register_flows),
        ):
            changed = [r.name for r in register() if r.action != "unchanged"]
            if changed:
                log.info(f"registered {what}", extra={"fields": {"names": changed}})
        # The embedded backend's compute engine takes seconds to start: start it now, not
        # when the first scan is ready.
        start_engine = getattr(self.backend, "warm", None)
        if warm and start_engine is not None:
            start_engine()

    def _retention_timer(self) -> None:
        """On Globus, a Timer runs the retention flow every retention.every_hours, made by
        the agent so that it runs as the agent's client (whose files they are)."""
        ensure = getattr(self.backend, "ensure_timer", None)
        days = self.settings.retention.days()
        if ensure is None or (days["raw"] is None and days["checkpoints"] is None):
            return
        try:
            body = retention.flow_input(self.settings, [], dry_run=False)
            made = ensure(retention.FLOW, body, name="retention",
                          every_seconds=int(self.settings.retention.every_hours * 3600))
        except RunBackendError as exc:
            log.error("retention timer not set up", extra={"fields": {"error": str(exc)}})
            return
        if made.action != "unchanged":
            log.info(f"retention timer {made.action}", extra={"fields": {"timer": made.id}})

    def run_forever(self) -> None:
        """Watch and process until :meth:`stop` (SIGTERM) is called."""
        self.prepare()
        observer = start_observer(
            self.root, self.changes, self.policy.observer, self.policy.poll_seconds
        )
        log.info(
            "agent started",
            extra={
                "fields": {
                    "watch": str(self.root),
                    "config": str(self.settings.source) if self.settings.source else None,
                    "backend": self.backend.name,
                    "observer": type(observer).__name__,
                    "max_concurrent_runs": self.policy.max_concurrent_runs,
                    "progressive": self.policy.progressive,
                }
            },
        )
        try:
            while not self._stop.is_set():
                self.tick()
                self.changes.wakeup.wait(timeout=self._sleep_for())
        finally:
            observer.stop()
            self._shutdown()
            observer.join(timeout=5)
            self._publish(running=False)
            log.info("agent stopped", extra={"fields": self._stats_fields()})

    def run_once(self, timeout: float | None = None) -> bool:
        """Process every scan that is ready now, wait for those runs; True if all succeeded.

        Scans still being written are left for a running agent, each with a log line saying
        what it waits for. Runs queued or active from before are finished too. The counts
        end up in :attr:`once_summary` (and a closing log line).
        """
        deadline = None if timeout is None else self.clock() + timeout
        self._mode = "once"
        self.prepare(warm=False)
        summary = self.once_summary = OnceSummary()
        mine: set[str] = set()
        for path in sorted(find_scans(self.root)):
            state = self._assess(path)
            if state.readiness in (Readiness.COMPLETE, Readiness.ABORTED, Readiness.BROKEN):
                run = self.driver.ensure_final(state)
                if run is not None:
                    mine.add(run.id)
                elif self._finalised(path):
                    summary.done_before += 1
                    log.debug("scan done before", extra={"fields": {"path": str(path)}})
            else:
                # Reported, not looked at again: --once leaves it for a running agent.
                self._note(path, state, self._tracked.setdefault(path, _Tracked(
                    next_check=math.inf)))
                summary.waiting += 1
                summary.waiting_reasons.append(f"{state.name}: {state.reason}")
        self._note_skipped(find_skipped(self.root), prune=True)
        summary.skipped = len(self._skipped)
        mine.update(r.id for r in self.driver.unfinished_runs())
        ok = False
        try:
            while not self._stop.is_set():
                self.driver.schedule()
                self.driver.follow()
                self._publish()
                runs = [self.store.require_run(i) for i in mine]
                if all(r.status.finished for r in runs):
                    ok = all(r.status == RunStatus.SUCCEEDED for r in runs)
                    break
                if deadline is not None and self.clock() > deadline:
                    log.error("--once: timed out waiting for runs")
                    break
                self._stop.wait(self._sleep_for(cap=0.2))
            return ok
        finally:
            self._shutdown()
            for run in (self.store.require_run(i) for i in mine):
                if run.status == RunStatus.SUCCEEDED:
                    summary.processed += 1
                elif run.status.finished:
                    summary.failed += 1
                else:
                    summary.unfinished += 1
            log.info(summary.line(), extra={"fields": {
                "processed": summary.processed, "waiting": summary.waiting,
                "skipped": summary.skipped, "failed": summary.failed,
                "done_before": summary.done_before, "unfinished": summary.unfinished}})
            self._publish(running=False, summary=summary.line())

    def _shutdown(self) -> None:
        """On a clean stop, runs that cannot outlive this process (the local backend runs
        flows inside it) go back to the queue without using up a retry; runs on a remote
        service go on and are re-attached at the next start."""
        if self._stop.is_set():
            self.driver.requeue_launched()

    def _sleep_for(self, cap: float = _MAX_WAIT) -> float:
        """Seconds until something is due: a scan to look at, a poll, a retry, a rescan."""
        now = self.clock()
        due = [self._last_rescan + self.policy.rescan_seconds]
        due += [t.next_check for t in self._tracked.values()]
        due += self.driver.due_times(now)
        due.append(self.retention.due_time())
        return max(0.01, min(cap, min(due) - now))

    # -- one pass --------------------------------------------------------------------------
    def tick(self) -> None:
        for phase in (self._discover, self._check_scans, self.driver.schedule,
                      self.driver.follow, self.retention.tick, self._publish):
            try:
                phase()
            except Exception:  # noqa: BLE001 - one bad pass must not end a weeks-long daemon
                log.exception("agent pass failed", extra={"fields": {"phase": phase.__name__}})

    def _discover(self) -> None:
        now = self.clock()
        candidates: set[Path] = set()
        for directory in self.changes.take():
            candidates.update(scans_in(directory))
            self._note_skipped(skipped_in(directory), directory=directory)
        if now - self._last_rescan >= self.policy.rescan_seconds:
            self._last_rescan = now
            found = set(find_scans(self.root))
            self._done &= found  # forget scans that are gone: memory stays bounded
            candidates.update(found)
            self._note_skipped(find_skipped(self.root), prune=True)
        for path in candidates:
            if path in self._tracked:
                self._tracked[path].next_check = 0.0  # something changed: look now
            elif path not in self._done:
                if self._finalised(path):
                    self._done.add(path)
                    continue
                self._tracked[path] = _Tracked()
                self.stats.scans_seen += 1
                log.info("scan seen", extra={"fields": {"scan": str(path)}})

    def _check_scans(self) -> None:
        now = self.clock()
        for path, tracked in list(self._tracked.items()):
            if now < tracked.next_check:
                continue
            if not path.exists():
                self._tracked.pop(path)
                log.info("scan gone", extra={"fields": {"path": str(path)}})
                continue
            state = self._assess(path, progress=bool(self.policy.progressive))
            if tracked.first_seen_complete is None:
                # A scan already whole when first seen (the agent was down while it was
                # written) gets its final run only: partial runs would be wasted work.
                tracked.first_seen_complete = state.readiness != Readiness.WRITING
            if state.readiness == Readiness.WRITING:
                self._note(path, state, tracked)
                tracked.next_check = self._next_look(state, now)
                if not tracked.first_seen_complete:
                    self.driver.ensure_partial(state)
                continue
            self.driver.ensure_final(state)
            self._tracked.pop(path)
            self._done.add(path)

    # -- telling the operator what the agent sees ------------------------------------------
    def _note(self, path: Path, state: ScanState, tracked: _Tracked) -> None:
        """Log why a scan is not read yet, once per change of what it waits for (a new
        data file counts as a change: one line per file, not one per look)."""
        said = (state.wait, state.frames, state.expected, state.blocker)
        if said == tracked.said:
            return
        tracked.said = said
        tracked.waiting = WatchedScan(
            path=str(path), name=state.name, wait=state.wait, reason=state.reason,
            frames=state.frames, expected=state.expected, since=self.clock(),
        )  # fmt: skip
        level = logging.WARNING if state.wait == "unreadable" else logging.INFO
        log.log(level, "scan waiting", extra={"fields": {
            "scan": state.name, "path": str(path), "wait": state.wait, "reason": state.reason,
            "frames": state.frames, "expected": state.expected}})  # fmt: skip

    def _note_skipped(
        self, found, *, prune: bool = False, directory: Path | None = None  # noqa: ANN001
    ) -> None:
        """Log each HDF5 file that is not read as a scan, once, with why. ``prune``: the
        whole tree was listed, so entries no longer found are forgotten (memory stays
        bounded); ``directory``: that directory was listed."""
        seen: set[Path] = set()
        for path, reason in found:
            seen.add(path)
            known = self._skipped.get(path)
            if known is not None and known.reason == reason:
                continue
            self._skipped[path] = SkippedFile(path=str(path), reason=reason, since=self.clock())
            log.info("file skipped", extra={"fields": {"path": str(path), "reason": reason}})
        for path in list(self._skipped):
            if path not in seen and (prune or path.parent == directory):
                del self._skipped[path]

    def _publish(self, running: bool = True, summary: str | None = None) -> None:
        """Write agent.json when what it says changed, and at least every heartbeat."""
        waiting = [t.waiting for t in self._tracked.values() if t.waiting is not None]
        waiting.sort(key=lambda w: w.since, reverse=True)
        skipped = sorted(self._skipped.values(), key=lambda f: f.since, reverse=True)
        stats = self._stats_fields()
        content = (running, summary, tuple(w.model_dump_json() for w in waiting),
                   tuple(f.path + f.reason for f in skipped), tuple(stats.values()))
        now = self.clock()
        if content == self._published and now - self._published_at < HEARTBEAT_SECONDS:
            return
        state = AgentState(
            pid=os.getpid(), mode=self._mode, running=running, watching=str(self.root),
            backend=self.backend.name, started_at=self._started_at, updated_at=now,
            waiting=waiting[:MAX_LISTED], waiting_total=len(waiting),
            skipped=skipped[:MAX_LISTED], skipped_total=len(skipped), stats=stats,
            summary=summary,
        )  # fmt: skip
        try:
            write_state(self._state_file, state)
        except OSError as exc:  # a report only: never stop the agent for it
            log.warning("cannot write the agent state file",
                        extra={"fields": {"path": str(self._state_file), "error": str(exc)}})
        self._published, self._published_at = content, now

    def _next_look(self, state: ScanState, now: float) -> float:
        """When a scan still being written is worth looking at again without an event: the
        moment it has been quiet long enough, or (short of frames) when it would count as
        stalled, and at least every few seconds in case an event was missed."""
        quiet_at = state.last_change + self.policy.quiet_seconds + 0.01
        if quiet_at > now:
            return min(quiet_at, now + _RECHECK_SECONDS)
        stall_at = state.last_change + self.policy.stall_timeout + 0.01
        return max(now + 0.05, min(stall_at, now + _RECHECK_SECONDS))

    def _assess(self, path: Path, progress: bool = True) -> ScanState:
        return assess(
            path,
            quiet_seconds=self.policy.quiet_seconds,
            stall_timeout=self.policy.stall_timeout,
            now=self.clock(),
            progress=progress,
            root=self.root,
        )

    def _finalised(self, path: Path) -> bool:
        return self.store.get_run_by_key(dedupe_key(path, FINAL)) is not None

    def _stats_fields(self) -> dict:
        return {k: v for k, v in vars(self.stats).items()}
