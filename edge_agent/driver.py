"""The agent's runs, from queued to finished: each scan part's run created once (under its
dedupe key), started within the concurrency limit and one at a time per scan, followed with
back-off, retried in the same record or given up, and put back in the queue on a clean stop.

The rules (the keys, what is retried and after how long) are :mod:`edge_agent.policy`; what
a scan's files say (ready, aborted, broken) is :mod:`edge_agent.scans`; when to look at what
is the loop, :mod:`edge_agent.agent`, whose docstring tells the whole story. The life of a
run is kept here, apart from the loop, so that each reads on its own.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from beamflow.config import Settings
from beamflow.error_kinds import ErrorKind
from beamflow.runs.backend import RunBackend, RunBackendError
from beamflow.runs.lifecycle import create_scan_run, launch_run, record_refused_run, sync_run
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.request import RunInputError, RunRequest
from beamflow.runs.store import DuplicateRun, Store

from .policy import KEY_PREFIX, dedupe_key, is_transient, part_of, retry_delay
from .scans import Readiness, ScanState

# One logger for the whole agent: operators filter on it.
log = logging.getLogger("beamflow.agent")

_RUNNING = (RunStatus.ACTIVE, RunStatus.INACTIVE)
_MAX_POLL_SECONDS = 30.0
_QUEUE_PAGE = 64  # queued runs read per scheduling pass (the queue can hold thousands)
_LOCAL_POLL = 0.1  # seconds between polls of a run that lives in this process
INTERRUPTED = ("interrupted: the agent stopped; the run starts again at its next start (no "
               "retry used)")


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


@dataclass
class _Poll:
    due: float
    interval: float
    status: RunStatus | None = None


class RunDriver:
    """Creates, starts, follows and retries the agent's runs through ``backend``."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        backend: RunBackend,
        stats: AgentStats,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.policy = settings.agent
        self.store = store
        self.backend = backend
        self.stats = stats
        self.clock = clock
        self._polls: dict[str, _Poll] = {}
        self._retry_at: dict[str, float] = {}
        self._launched_here: set[str] = set()
        self._next_attach = float("-inf")
        self._schedule_needed = True
        # The local backend runs flows inside this process; a remote service keeps them.
        self.runs_outlive_agent = bool(
            getattr(backend, "runs_outlive_agent", backend.name != "local")
        )
        # Polls of a remote service back off (its runs take minutes to hours, and its API
        # is shared); polls of an in-process run are reads of this process's memory: they
        # stay frequent, so a run's end is recorded at once and the next one starts.
        if self.runs_outlive_agent:
            self._poll_first = self.policy.poll_seconds
            self._max_poll = max(
                self._poll_first, min(_MAX_POLL_SECONDS, 10 * self.policy.poll_seconds)
            )
        else:
            self._poll_first = self._max_poll = min(self.policy.poll_seconds, _LOCAL_POLL)

    # -- creating runs (idempotent) --------------------------------------------------------
    def ensure_partial(self, state: ScanState) -> None:
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

    def ensure_final(self, state: ScanState) -> Run | None:
        """Create the final run of a scan that is complete, aborted (with the frames there
        are) or broken (failed at once, with the reader's message); None if it exists."""
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
        elif state.readiness == Readiness.BROKEN and run.status != RunStatus.FAILED:
            run = self.store.update_run(run.id, status=RunStatus.FAILED, error=state.error,
                                        error_step="Readiness", error_kind=ErrorKind.BAD_INPUT)
            self.store.add_event(run.id, "ScanUnreadable", state.error or "", level="error")
            self.stats.failed += 1
            log.error(
                "scan unreadable",
                extra={"fields": {"run": run.id, "scan": state.name, "path": str(state.path),
                                  "error": state.error}},
            )
        return run

    def _create(
        self, state: ScanState, *, fraction: float, extra: dict
    ) -> Run | None:
        part = part_of(fraction)
        params = {**self.settings.reconstruction.model_dump(), **extra}
        request = RunRequest(
            scan_path=state.path, params=params, dedupe_key=dedupe_key(state.path, part),
            fraction=fraction, flow=self.policy.flow,
        )  # fmt: skip
        try:
            run = create_scan_run(self.settings, self.store, request)
        except DuplicateRun:
            return None
        except RunInputError as exc:
            return self._record_refused(state, request, exc)
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
        self, state: ScanState, request: RunRequest, exc: RunInputError
    ) -> Run | None:
        """A scan part that cannot even be queued (the scan vanished, the configured
        parameters are invalid) is recorded as a failed run once, visible with the reason,
        instead of being tried again at every look."""
        run = record_refused_run(self.settings, self.store, request, exc)
        if run is None:
            return None
        self.stats.failed += 1
        log.error("run refused", extra={"fields": {"run": run.id, "scan": state.name,
                                                   "error": str(exc)}})  # fmt: skip
        return run

    # -- the queue -------------------------------------------------------------------------
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

    def unfinished_runs(self) -> list[Run]:
        return self._active_runs() + list(self._queued_runs())

    def schedule(self) -> None:
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
        for run in self.store.list_runs(status=RunStatus.QUEUED, scan=final.scan_path, limit=None):
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
                error_kind=ErrorKind.CANCELLED,
            )
            self.store.add_event(run.id, "Superseded", f"superseded by run {final.id}")
            self._retry_at.pop(run.id, None)
            self.stats.superseded += 1
            log.info("run superseded", extra={"fields": {"run": run.id, "by": final.id}})

    def _launch(self, run: Run) -> None:
        try:
            run = launch_run(self.settings, self.store, self.backend, run)
        except RunBackendError as exc:
            self._failed_to_start(run, exc)
            return
        except Exception as exc:  # noqa: BLE001 - e.g. an SDK error the backend let through
            log.exception("run could not start", extra={"fields": {"run": run.id}})
            self._failed_to_start(
                run, RunBackendError(f"{type(exc).__name__}: {exc}", transient=True, step="Start")
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
                    "scan": run.scan_name,
                    "part": part_of(run.fraction),
                    "attempt": run.attempt,
                    "backend_run": run.backend_run_id,
                }
            },
        )

    def _failed_to_start(self, run: Run, exc: RunBackendError) -> None:
        if exc.transient and run.attempt <= self.policy.max_retries:
            self._requeue(run, f"could not start: {exc}", error=str(exc),
                          error_step=exc.step or "Start", error_kind=exc.kind)
            return
        self._retry_at.pop(run.id, None)
        self.store.update_run(run.id, status=RunStatus.FAILED, error=str(exc),
                              error_step=exc.step or "Start", error_kind=exc.kind)
        self.stats.failed += 1
        log.error("run failed to start", extra={"fields": {"run": run.id, "error": str(exc)}})

    def _requeue(self, run: Run, reason: str, **failure) -> None:  # noqa: ANN003
        """Retry ``run`` in its own record after the back-off; the attempt that failed is
        kept with the run (its error, step and kind: ``failure``, else the run's)."""
        kind = failure.get("error_kind", run.error_kind)
        backoff = (self.policy.no_space_backoff_seconds if kind == ErrorKind.NO_SPACE
                   else self.policy.retry_backoff_seconds)  # a disk takes a person to free
        delay = retry_delay(backoff, run.attempt)
        self._retry_at[run.id] = self.clock() + delay
        self.store.requeue(run.id, **failure)
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

    def requeue_launched(self) -> None:
        """Put the runs this process started back in the queue, without using up a retry,
        when they cannot outlive it (the local backend runs flows inside it); runs on a
        remote service go on and are re-attached at the next start."""
        if self.runs_outlive_agent:
            return
        for run in self._active_runs():
            if run.id not in self._launched_here:
                continue
            try:
                if run.backend_run_id:
                    self.backend.cancel_run(run.backend_run_id)
            except RunBackendError as exc:
                log.warning("cancel on shutdown failed", extra={"fields": {"run": run.id,
                                                                           "error": str(exc)}})
            self.store.requeue(run.id, status=RunStatus.CANCELLED, next_attempt=False,
                               error=INTERRUPTED, error_kind=ErrorKind.CANCELLED)
            self.store.add_event(
                run.id, "Interrupted", "the agent stopped; the run starts again at its next start",
                level="warning",
            )  # fmt: skip
            log.info("run requeued on shutdown", extra={"fields": {"run": run.id}})

    def due_times(self, now: float) -> list[float]:
        """When something of the runs' is due: a poll, a retry, a scheduling pass."""
        due = [p.due for p in self._polls.values()]
        due += [t for t in self._retry_at.values() if t > now]  # due ones wait for capacity
        if self._schedule_needed:
            due.append(now)
        return due

    # -- following runs --------------------------------------------------------------------
    def follow(self) -> None:
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
            run = sync_run(self.store, self.backend, run)
        except RunBackendError as exc:
            if not exc.transient and not self.runs_outlive_agent:
                # The local backend does not know the run (its record is gone): it is lost,
                # and handled like any lost run (retried within the budget). A remote
                # service's refusal is only backed off: its run may well go on.
                run = self.store.update_run(run.id, status=RunStatus.FAILED, error=f"lost: {exc}",
                                            error_step="Poll", error_kind=ErrorKind.LOST)
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
                    "scan": run.scan_name,
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
                extra={"fields": {"run": run.id, "scan": run.scan_name,
                                  "reasons": run.verdict_reasons}},
            )
