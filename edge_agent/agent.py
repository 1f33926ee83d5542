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
retry reuses the same run record (``attempt`` goes up), so a scan never gets two runs.
Stopped cleanly (SIGTERM), the agent puts the runs that live in its own process (local
backend) back in the queue without using up a retry; runs on Globus go on regardless.

Progressive runs (``agent.progressive``, e.g. ``[0.25, 0.5]``): while a scan is written,
a run is queued for the largest fraction of its frames reached (``max_frames``); the final
run follows when the scan is complete (or aborted). They run one at a time, oldest first,
all with the scan's one checkpoint directory, so each continues from the one before; a
partial run still queued when a later one is queued is superseded (CANCELLED, with why).

Following runs: a remote service is polled from ``poll_seconds`` with back-off (×1.5 while
nothing changes, up to 10 × poll_seconds); a run inside this process is read every 0.1 s.
Failures are retried (``max_retries``, back-off doubling from ``retry_backoff_seconds``)
when transient (see :func:`is_transient`); bad input never is.

The agent only touches runs it created (their dedupe key starts with ``agent:``): runs that
people start by hand (``beamflow runs start``) belong to whoever started them.
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

from beamflow import runs as run_path
from beamflow.agent_state import (
    HEARTBEAT_SECONDS,
    MAX_LISTED,
    AgentState,
    SkippedFile,
    WatchedScan,
    state_path,
    write_state,
)
from beamflow.backend import Backend, BackendError
from beamflow.config import Settings
from beamflow.store import DuplicateRun, Run, RunStatus, Store

from .scans import Readiness, ScanState, assess, find_scans, find_skipped, skipped_in
from .watch import ChangedScans, scans_in, start_observer

log = logging.getLogger("beamflow.agent")

KEY_PREFIX = "agent:"
FINAL = "final"
_RUNNING = (RunStatus.ACTIVE, RunStatus.INACTIVE)
_MAX_POLL_SECONDS = 30.0
_RECHECK_SECONDS = 2.0  # a scan still short of frames is looked at this often without events
_QUEUE_PAGE = 64  # queued runs read per scheduling pass (the queue can hold thousands)
_MAX_WAIT = 1.0  # the main loop sleeps at most this long between passes
_LOCAL_POLL = 0.1  # seconds between polls of a run that lives in this process


@dataclass
class _Poll:
    due: float
    interval: float
    status: RunStatus | None = None


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
            f"agent --once: {self.processed} processed, {self.waiting} waiting, "
            f"{self.skipped} skipped, {self.failed} failed"
        )
        extra = [f"{n} {what}" for n, what in ((self.done_before, "done before"),
                                               (self.unfinished, "unfinished")) if n]
        return text + (f" ({', '.join(extra)})" if extra else "")


@dataclass
class AgentStats:
    """Counters for logs and benchmarks (numbers only: the agent runs for weeks)."""

    scans_seen: int = 0
    queued: int = 0
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    retried: int = 0
    superseded: int = 0


def dedupe_key(scan_path: Path, part: str) -> str:
    """The store key of one part of one scan: the real path (symlinks resolved), so the
    same files watched through another path are still the same scan."""
    return f"{KEY_PREFIX}{Path(scan_path).resolve()}#{part}"


def part_of(fraction: float | None) -> str:
    """The dedupe-key part of a run at ``fraction`` of the frames (1.0 or None: final)."""
    if fraction is None or fraction >= 1.0:
        return FINAL
    return f"{fraction:.3f}"


# How a failure reads decides whether it is worth another attempt. Bad input is checked
# first: it is never retried, whatever step it surfaced in.
_BAD_INPUT = (
    "scanformaterror",
    "valueerror",
    "validationerror",
    "incompatiblecheckpoint",
    "does not match its schema",
    "invalid",
    "bad input",
    "not a readable",
    "refused",
    "permission_denied",
    "permission denied",
)
_TRANSIENT = (
    "lost",  # RunLost (the process running it ended), WorkerLost (killed, out of memory)
    "timeout",  # ActionTimeout, socket timeouts
    "timed out",
    "connection",
    "unavailable",
    "network",
    "token",  # an expired or revoked token that a refresh fixes
    "temporar",
    "actionunabletorun",  # the provider could not start the action (endpoint offline, ...)
    "endpoint is offline",
    "throttl",
    "too many requests",
    "busy",
    "file_not_found",  # a file renamed by the detector's writer while it was copied
    "vanished",
)


def is_transient(run: Run) -> bool:
    """Faults worth a retry: a lost run or worker, transfer and network faults, timeouts,
    an expired token, an endpoint that could not take the task. Bad input (the reader's or
    the function's validation errors, refused paths) is never retried; a reconstruction
    that failed on good input (it diverged) is not either: the same input fails again."""
    text = f"{run.error_step or ''} {run.error or ''}".lower()
    if any(word in text for word in _BAD_INPUT):
        return False
    if (run.error_step or "").startswith("Transfer"):
        return True  # transfers are retried, as Globus Transfer retries its own faults
    return any(word in text for word in _TRANSIENT)


class EdgeAgent:
    """Watches ``settings.beamline.detector_dir`` and drives runs through the backend."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        backend: Backend | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.policy = settings.agent
        self.store = store or Store(settings.store_path)
        self.backend = backend or run_path.get_backend(settings)
        self.clock = clock
        self.root = Path(settings.beamline.detector_dir)
        self.changes = ChangedScans()
        self.stats = AgentStats()
        self._stop = threading.Event()
        self._tracked: dict[Path, _Tracked] = {}
        self._done: set[Path] = set()  # scans whose final run exists (pruned at each rescan)
        self._polls: dict[str, _Poll] = {}
        self._retry_at: dict[str, float] = {}
        self._launched_here: set[str] = set()
        self._last_rescan = float("-inf")
        self._next_attach = float("-inf")
        self._schedule_needed = True
        self._skipped: dict[Path, SkippedFile] = {}
        self._state_file = state_path(settings.state_dir)
        self._mode = "watch"
        self._started_at = self.clock()
        self._published: tuple | None = None
        self._published_at = float("-inf")
        self.once_summary: OnceSummary | None = None
        # The local backend runs flows inside this process; a remote service keeps them.
        self._runs_outlive_agent = bool(
            getattr(self.backend, "runs_outlive_agent", self.backend.name != "local")
        )
        # Polls of a remote service back off (its runs take minutes to hours, and its API
        # is shared); polls of an in-process run are reads of this process's memory: they
        # stay frequent, so a run's end is recorded at once and the next one starts.
        if self._runs_outlive_agent:
            self._poll_first = self.policy.poll_seconds
            self._max_poll = max(
                self._poll_first, min(_MAX_POLL_SECONDS, 10 * self.policy.poll_seconds)
            )
        else:
            self._poll_first = self._max_poll = min(self.policy.poll_seconds, _LOCAL_POLL)

    # -- lifecycle -------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to end (signal-safe: sets two events, nothing else)."""
        self._stop.set()
        self.changes.wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def prepare(self) -> None:
        """Make sure the flow and function can be run. On the embedded backend registration
        is local and idempotent, so the agent does it (a fresh `beamflow init` workspace
        works at once); on Globus it is a deliberate step (`beamflow register`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self._runs_outlive_agent:
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
        warm = getattr(self.backend, "warm", None)
        if warm is not None:
            warm()

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
        self.prepare()
        summary = self.once_summary = OnceSummary()
        mine: set[str] = set()
        for path in sorted(find_scans(self.root)):
            state = self._assess(path)
            if state.readiness in (Readiness.COMPLETE, Readiness.ABORTED, Readiness.BROKEN):
                run = self._ensure_final(state)
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
        mine.update(r.id for r in self._unfinished_runs())
        ok = False
        try:
            while not self._stop.is_set():
                self._schedule()
                self._follow()
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
        if not self._stop.is_set() or self._runs_outlive_agent:
            return
        for run in self._active_runs():
            if run.id not in self._launched_here:
                continue
            try:
                if run.backend_run_id:
                    self.backend.cancel_run(run.backend_run_id)
            except BackendError as exc:
                log.warning("cancel on shutdown failed", extra={"fields": {"run": run.id,
                                                                           "error": str(exc)}})
            self.store.update_run(
                run.id, status=RunStatus.QUEUED, backend_run_id=None, started_at=None,
                finished_at=None, current_step=None, iteration=None,
            )  # fmt: skip
            self.store.add_event(
                run.id, "Interrupted", "the agent stopped; the run starts again at its next start",
                level="warning",
            )  # fmt: skip
            log.info("run requeued on shutdown", extra={"fields": {"run": run.id}})

    def _sleep_for(self, cap: float = _MAX_WAIT) -> float:
        """Seconds until something is due: a scan to look at, a poll, a retry, a rescan."""
        now = self.clock()
        due = [self._last_rescan + self.policy.rescan_seconds]
        due += [t.next_check for t in self._tracked.values()]
        due += [p.due for p in self._polls.values()]
        due += [t for t in self._retry_at.values() if t > now]  # due ones wait for capacity
        if self._schedule_needed:
            due.append(now)
        return max(0.01, min(cap, min(due) - now))

    # -- one pass --------------------------------------------------------------------------
    def tick(self) -> None:
        for phase in (self._discover, self._check_scans, self._schedule, self._follow,
                      self._publish):
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
                    self._ensure_partial(state)
                continue
            self._ensure_final(state)
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
        )

    def _finalised(self, path: Path) -> bool:
        return self.store.get_run_by_key(dedupe_key(path, FINAL)) is not None

    # -- creating runs (idempotent) ----------------------------------------------------------
    def _create(
        self, state: ScanState, *, fraction: float, extra: dict
    ) -> Run | None:
        part = part_of(fraction)
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
        except run_path.RunInputError as exc:
            return self._record_refused(state, part, fraction, params, exc)
        self.stats.queued += 1
        self._schedule_needed = True
        log.info(
            "run queued",
            extra={
                "fields": {
                    "run": run.id,
                    "scan": state.name,
                    "path": str(state.path),
                    "part": part,
                    "frames": state.frames,
                    "expected": state.expected,
                }
            },
        )
        return run

    def _record_refused(
        self, state: ScanState, part: str, fraction: float, params: dict, exc: Exception
    ) -> Run | None:
        """A scan part that cannot even be queued (the scan vanished, the configured
        parameters are invalid) is recorded as a failed run once, visible with the reason,
        instead of being tried again at every look."""
        if not state.path.exists():
            return None  # gone: nothing to record
        try:
            run = self.store.create_run(
                scan=state.name, scan_path=str(state.path.resolve()), flow=self.policy.flow,
                backend=self.backend.name, parameters=params,
                dedupe_key=dedupe_key(state.path, part), fraction=fraction,
            )  # fmt: skip
        except DuplicateRun:
            return None
        run = self.store.update_run(
            run.id, status=RunStatus.FAILED, error=str(exc), error_step="Queue"
        )
        self.stats.failed += 1
        log.error("run refused", extra={"fields": {"run": run.id, "scan": state.name,
                                                   "error": str(exc)}})  # fmt: skip
        return run

    def _ensure_partial(self, state: ScanState) -> None:
        """Queue the run for the largest fraction of frames reached (a smaller one not yet
        queued is skipped: the larger one gives the scientist more, sooner)."""
        due = state.due_fractions(self.policy.progressive)
        if not due:
            return
        fraction, frames = due[-1]
        if self.store.get_run_by_key(dedupe_key(state.path, part_of(fraction))) is not None:
            return
        run = self._create(state, fraction=fraction, extra={"max_frames": frames})
        if run is not None:
            self._supersede_partials(run)

    def _ensure_final(self, state: ScanState) -> Run | None:
        extra: dict = {}
        if state.readiness == Readiness.ABORTED:
            extra = {"max_frames": state.frames, "aborted": True}
        run = self._create(state, fraction=1.0, extra=extra)
        if run is None:
            return None
        if self.policy.progressive:
            self._supersede_partials(run)
        if state.readiness == Readiness.ABORTED:
            message = (
                f"scan stopped at {state.frames} of {state.expected} frames and nothing new "
                f"came for {self.policy.stall_timeout:g} s: reconstructing the frames there are"
            )
            self.store.add_event(
                run.id, "ScanAborted", message, level="warning",
                details={"frames": state.frames, "expected": state.expected},
            )  # fmt: skip
            log.warning("scan aborted", extra={"fields": {"run": run.id, "scan": state.name,
                                                          "frames": state.frames,
                                                          "expected": state.expected}})
        elif state.readiness == Readiness.BROKEN:
            run = self.store.update_run(
                run.id, status=RunStatus.FAILED, error=state.error, error_step="Readiness"
            )
            self.store.add_event(run.id, "ScanUnreadable", state.error or "", level="error")
            self.stats.failed += 1
            log.error(
                "scan unreadable",
                extra={"fields": {"run": run.id, "scan": state.name, "path": str(state.path),
                                  "error": state.error}},
            )
        return run

    # -- the queue -----------------------------------------------------------------------------
    def _mine(self, run: Run) -> bool:
        return run.backend == self.backend.name and (run.dedupe_key or "").startswith(KEY_PREFIX)

    def _active_runs(self) -> list[Run]:
        return [
            r
            for r in self.store.list_runs(status=_RUNNING, limit=None, oldest_first=True)
            if self._mine(r)
        ]

    def _queued_runs(self):  # noqa: ANN202 - Iterator[Run]
        """QUEUED runs of this agent, oldest first, read a page at a time."""
        offset = 0
        while True:
            page = self.store.list_runs(
                status=RunStatus.QUEUED, limit=_QUEUE_PAGE, offset=offset, oldest_first=True
            )
            yield from (r for r in page if self._mine(r))
            if len(page) < _QUEUE_PAGE:
                return
            offset += _QUEUE_PAGE

    def _unfinished_runs(self) -> list[Run]:
        return self._active_runs() + list(self._queued_runs())

    def _schedule(self) -> None:
        """Start queued runs, oldest first, within the concurrency limit, one at a time per
        scan (in creation order, so each continues from the checkpoint of the one before)."""
        now = self.clock()
        if not self._schedule_needed and now < min(self._retry_at.values(), default=math.inf):
            return
        self._schedule_needed = False
        running = self._active_runs()
        capacity = self.policy.max_concurrent_runs - len(running)
        if capacity <= 0:
            return
        busy_scans = {r.scan_path for r in running}
        for run in self._queued_runs():
            if run.scan_path in busy_scans:
                continue
            busy_scans.add(run.scan_path)  # later runs of this scan wait for this one
            if self._retry_at.get(run.id, 0.0) > now:
                continue
            self._launch(run)
            capacity -= 1
            if capacity <= 0:
                break

    def _supersede_partials(self, final: Run) -> None:
        """Cancel queued partial runs of the scan of ``final`` that have not started: the
        newer run reconstructs more frames, and the scientist wants that sooner."""
        for run in self.store.list_runs(status=RunStatus.QUEUED, scan=final.scan, limit=None):
            if (
                run.id == final.id
                or run.scan_path != final.scan_path
                or not self._mine(run)
                or (run.fraction or 1.0) >= (final.fraction or 1.0)
            ):
                continue
            self.store.update_run(
                run.id,
                status=RunStatus.CANCELLED,
                error=f"superseded by run {final.id} ({part_of(final.fraction)} of the frames), "
                "queued before this one could start",
                error_step="Queue",
            )
            self.store.add_event(run.id, "Superseded", f"superseded by run {final.id}")
            self._retry_at.pop(run.id, None)
            self.stats.superseded += 1
            log.info("run superseded", extra={"fields": {"run": run.id, "by": final.id}})

    def _launch(self, run: Run) -> None:
        try:
            run = run_path.launch_run(self.settings, self.store, self.backend, run)
        except BackendError as exc:
            self._failed_to_start(run, exc)
            return
        except Exception as exc:  # noqa: BLE001 - e.g. an SDK error the backend let through
            log.exception("run could not start", extra={"fields": {"run": run.id}})
            self._failed_to_start(
                run, BackendError(f"{type(exc).__name__}: {exc}", transient=True, step="Start")
            )
            return
        self._retry_at.pop(run.id, None)
        self._launched_here.add(run.id)
        self.stats.started += 1
        self._polls[run.id] = _Poll(
            due=self.clock() + self._poll_first,
            interval=self._poll_first,
            status=run.status,
        )
        log.info(
            "run started",
            extra={
                "fields": {
                    "run": run.id,
                    "scan": run.scan,
                    "part": part_of(run.fraction),
                    "attempt": run.attempt,
                    "backend_run": run.backend_run_id,
                }
            },
        )

    def _failed_to_start(self, run: Run, exc: BackendError) -> None:
        if exc.transient and run.attempt <= self.policy.max_retries:
            self._requeue(run, f"could not start: {exc}")
            return
        self._retry_at.pop(run.id, None)
        self.store.update_run(
            run.id, status=RunStatus.FAILED, error=str(exc), error_step=exc.step or "Start"
        )
        self.stats.failed += 1
        log.error("run failed to start", extra={"fields": {"run": run.id, "error": str(exc)}})

    def retry_delay(self, attempt: int) -> float:
        """Back-off before attempt ``attempt + 1``: doubling from retry_backoff_seconds."""
        return self.policy.retry_backoff_seconds * 2 ** (attempt - 1)

    def _requeue(self, run: Run, reason: str) -> None:
        delay = self.retry_delay(run.attempt)
        self._retry_at[run.id] = self.clock() + delay
        self.store.update_run(
            run.id,
            status=RunStatus.QUEUED,
            attempt=run.attempt + 1,
            backend_run_id=None,
            started_at=None,
            finished_at=None,
            error=None,
            error_step=None,
            current_step=None,
            iteration=None,
        )
        self.store.add_event(
            run.id,
            "RetryScheduled",
            f"attempt {run.attempt + 1} of {self.policy.max_retries + 1} in {delay:g} s: "
            f"{reason}",
            level="warning",
        )
        self.stats.retried += 1
        self._schedule_needed = True
        log.warning(
            "run retry",
            extra={"fields": {"run": run.id, "attempt": run.attempt + 1, "delay_s": delay,
                              "reason": reason}},
        )  # fmt: skip

    # -- following runs ------------------------------------------------------------------------
    def _follow(self) -> None:
        now = self.clock()
        if now >= self._next_attach:
            # At start (and now and then after): follow every run of ours the store says
            # is running, including those a previous agent process started.
            self._next_attach = now + self.policy.rescan_seconds
            for run in self._active_runs():
                if run.backend_run_id and run.id not in self._polls:
                    self._polls[run.id] = _Poll(
                        due=now, interval=self._poll_first, status=run.status
                    )
                    log.info("run re-attached", extra={"fields": {
                        "run": run.id, "backend_run": run.backend_run_id}})  # fmt: skip
        for run_id, poll in list(self._polls.items()):
            if now < poll.due:
                continue
            run = self.store.get_run(run_id)
            if run is None or run.status not in _RUNNING or not run.backend_run_id:
                self._polls.pop(run_id, None)  # ended elsewhere (e.g. `beamflow runs cancel`)
                self._schedule_needed = True
                continue
            self._poll(run, poll, now)

    def _poll(self, run: Run, poll: _Poll, now: float) -> None:
        try:
            run = run_path.sync_run(self.store, self.backend, run)
        except BackendError as exc:
            if not exc.transient and not self._runs_outlive_agent:
                # The local backend does not know the run (its record is gone): it is lost,
                # and handled like any lost run (retried within the budget). A remote
                # service's refusal is only backed off: its run may well go on.
                run = self.store.update_run(
                    run.id, status=RunStatus.FAILED, error=f"lost: {exc}", error_step="Poll"
                )
                self._polls.pop(run.id, None)
                self._launched_here.discard(run.id)
                self._schedule_needed = True
                self._finished(run)
                return
            self._poll_failed(run, poll, now, exc)
            return
        except Exception as exc:  # noqa: BLE001 - anything unexpected: back off, try again
            self._poll_failed(run, poll, now, exc)
            return
        if run.status != poll.status:
            poll.interval = self._poll_first
            poll.status = run.status
        else:
            poll.interval = min(poll.interval * 1.5, self._max_poll)
        poll.due = now + poll.interval
        if run.status.finished:
            self._polls.pop(run.id, None)
            self._launched_here.discard(run.id)
            self._schedule_needed = True
            self._finished(run)

    def _poll_failed(self, run: Run, poll: _Poll, now: float, exc: Exception) -> None:
        poll.interval = min(poll.interval * 2, self._max_poll)
        poll.due = now + poll.interval
        log.warning("poll failed", extra={"fields": {"run": run.id, "error": str(exc),
                                                     "next_poll_s": poll.interval}})

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
        else:
            self.stats.cancelled += 1
        level = logging.INFO if run.status == RunStatus.SUCCEEDED else logging.WARNING
        log.log(
            level,
            "run finished",
            extra={
                "fields": {
                    "run": run.id,
                    "scan": run.scan,
                    "part": part_of(run.fraction),
                    "status": str(run.status),
                    "attempt": run.attempt,
                    "seconds": None if run.duration is None else round(run.duration, 3),
                    "error_step": run.error_step,
                    "error": run.error,
                    "verdict": run.verdict,
                }
            },
        )
        if run.verdict == "suspect":
            # The flow succeeded, but the result failed the physics checks: say so loudly.
            log.warning(
                "suspect result",
                extra={"fields": {"run": run.id, "scan": run.scan,
                                  "reasons": run.verdict_reasons}},
            )

    def _stats_fields(self) -> dict:
        return {k: v for k, v in vars(self.stats).items()}
