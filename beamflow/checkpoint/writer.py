"""Asynchronous two-phase checkpointing: snapshot on the caller's thread, write in the background.

Phase 1 (`save`, on the caller's thread): bring each array to host memory with `to_host`
(a device->host copy for GPU arrays) and copy it, with the metadata, into a shared-memory
snapshot. Phase 2: a writer process (`beamflow.checkpoint.worker`: h5py holds the GIL, so
HDF5 work on a thread of this process would stall the caller) builds the HDF5 image (once
per snapshot, shared by the levels) and commits it, one thread per level; a thread per level
here hands it the snapshots and waits. Per level, at most one write is in flight and at most
one snapshot waits; a newer snapshot REPLACES the waiting one, so memory stays bounded and
the caller never waits on disk. Levels are independent: a slow shared filesystem (L2) never
holds up the node-local level (L1).

`maybe_save` snapshots a level only when its writer is idle and its CPU budget allows
(`CheckpointPolicy.max_overhead`: after a write that cost c CPU-seconds, the level waits
c / max_overhead seconds from the write's start — the adaptive frequency of CheckFreq,
Mohan et al., FAST'21); otherwise the level stays due and the next iteration tries again,
so a write always carries the freshest state and the caller pays no copy for snapshots
that would be dropped. Explicit `save()` calls are never held back.

The writer process runs at idle CPU priority (Linux SCHED_IDLE) so that it uses the cycles
the reconstruction leaves free rather than competing with it. So that a saturated machine
cannot starve them, a writer whose write has taken longer than `starvation_s` while its level
is due again is lifted to normal priority (until that write ends), as are all writers while
`flush()` waits.

Write failures (a full or read-only shared filesystem) never reach the caller's thread: they
are recorded in `errors`, logged, and passed to `on_error`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from beamflow.checkpoint.policy import CheckpointPolicy, LevelConfig
from beamflow.checkpoint.store import LatestRecord, check_arrays, clean_stale_temps, dumps
from beamflow.checkpoint.worker import (
    SharedSnapshot,
    SnapshotBuffers,
    WriteFailed,
    WriterGone,
    WriterProcess,
)

log = logging.getLogger(__name__)

ToHost = Callable[[Any], np.ndarray]
#: hook(level, step, path): called at each commit step, on this process's thread for the
#: level while the writer waits (tests, tracing); an exception fails the write at that step
WriterHook = Callable[[str, str, Path], None]
Priority = Literal["idle", "normal"]


@functools.cache
def idle_priority_is_reversible() -> bool:
    """Whether a thread of this process can go to SCHED_IDLE and come back.

    An unprivileged process may be unable to leave SCHED_IDLE (RLIMIT_NICE); a writer stuck
    at idle priority could then starve on a busy node, even while `flush()` waits. Tried
    once, on a throwaway thread.
    """
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_IDLE"):
        return False
    ok = [False]

    def probe() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            ok[0] = True
        except OSError:
            pass

    t = threading.Thread(target=probe, name="checkpoint-priority-probe")
    t.start()
    t.join()
    return ok[0]


def _set_thread_priority(tid: int, priority: Priority) -> None:
    # Linux applies scheduling policy per thread (tid); elsewhere this is a no-op.
    if not hasattr(os, "sched_setscheduler"):
        return
    policy = os.SCHED_IDLE if priority == "idle" else os.SCHED_OTHER
    with contextlib.suppress(OSError):
        os.sched_setscheduler(tid, policy, os.sched_param(0))


@dataclass(frozen=True)
class CheckpointError:
    level: str
    dir: Path
    iteration: int
    message: str
    time: float

    def __str__(self) -> str:
        return f"checkpoint {self.level} ({self.dir}) at iteration {self.iteration}: {self.message}"


@dataclass
class CheckpointStats:
    snapshots: int = 0
    replaced: int = 0  # waiting snapshots dropped (per level) because a newer one arrived
    deferred: int = 0  # due levels maybe_save held back (writer busy, or over the CPU budget)
    commits: int = 0
    failures: int = 0
    snapshot_seconds: float = 0.0  # time spent on the caller's thread
    write_seconds: float = 0.0  # wall time of the writes (build the file + commit)
    write_cpu_seconds: float = 0.0  # CPU time of the writer process (what it takes from others)
    bytes_written: int = 0


class Checkpointer:
    """Multi-level asynchronous checkpointer of named arrays and JSON metadata."""

    MAX_ERRORS = 100

    def __init__(
        self,
        policy: CheckpointPolicy,
        *,
        to_host: ToHost | None = None,
        fingerprint: Mapping[str, Any] | None = None,
        on_error: Callable[[CheckpointError], None] | None = None,
        hook: WriterHook | None = None,
        start_iteration: int = 0,
        protect: Mapping[str, Path] | None = None,
        priority: Priority = "idle",
        starvation_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.levels: dict[str, LevelConfig] = policy.levels()
        self._to_host = to_host or np.asarray
        self.fingerprint = dict(fingerprint) if fingerprint is not None else None
        self.on_error = on_error
        self.hook = hook
        # idle only where the writers can be lifted again (flush, starvation)
        self.priority: Priority = (
            "idle" if priority == "idle" and idle_priority_is_reversible() else "normal")
        self._clock = clock
        self.errors: list[CheckpointError] = []
        self.n_errors = 0
        self.stats = CheckpointStats()
        #: last successful commit per level
        self.committed: dict[str, LatestRecord] = {}
        # a file we loaded (resumed from) stays until a newer commit exists at that level
        self._protect: dict[str, Path] = dict(protect or {})
        now = clock()
        self._last_iter = dict.fromkeys(self.levels, start_iteration)
        self._last_time = dict.fromkeys(self.levels, now)

        self._cv = threading.Condition()
        self._pending: dict[str, SharedSnapshot | None] = dict.fromkeys(self.levels)
        self._busy = dict.fromkeys(self.levels, False)
        self._boosted: set[str] = set()
        self._busy_since: dict[str, float] = {}
        self._not_before: dict[str, float] = {}  # monotonic time the budget allows next
        self.starvation_s = starvation_s
        self._closed = False
        self._ids = itertools.count(1)
        self._buffers = SnapshotBuffers()
        self._proc_lock = threading.Lock()
        # started by the first level thread: the process dies with the thread that started
        # it (PR_SET_PDEATHSIG), and the level threads live exactly as long as this object
        self._proc: WriterProcess | None = None
        self._started_at = -math.inf
        for name, cfg in self.levels.items():
            try:
                Path(cfg.dir).mkdir(parents=True, exist_ok=True)
                clean_stale_temps(cfg.dir)
            except OSError as e:
                self._record(name, cfg, start_iteration, e)
        self._threads = [
            threading.Thread(target=self._run, args=(name,), name=f"checkpoint-{name}",
                             daemon=True)
            for name in self.levels
        ]
        for t in self._threads:
            t.start()
        # Writers are daemon threads (a hung filesystem must not block exit); flush at
        # interpreter exit so that a normal exit never loses the last snapshot.
        ref = weakref.ref(self)
        self._atexit = lambda: (c := ref()) is not None and c.close()
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ caller side

    def due_levels(self, iteration: int) -> set[str]:
        now = self._clock()
        due = set()
        for name, cfg in self.levels.items():
            n = cfg.every_iterations
            s = cfg.every_seconds
            by_count = n is not None and iteration // n > self._last_iter[name] // n
            by_time = s is not None and now - self._last_time[name] >= s
            if by_count or by_time:
                due.add(name)
        return due

    def maybe_save(
        self,
        iteration: int,
        get_arrays: Callable[[], Mapping[str, Any]],
        meta: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    ) -> set[str]:
        """Snapshot and queue a write for each due level whose writer is idle.

        `get_arrays` (and `meta`, if callable) are called only when something is saved.
        Returns the levels saved; a due level with a busy writer stays due.
        """
        ready = self.ready_levels(iteration)
        if ready:
            m = meta() if callable(meta) else meta
            self.save(iteration, get_arrays(), m, levels=ready)
        return ready

    def ready_levels(self, iteration: int) -> set[str]:
        """The due levels whose writer is idle and within its CPU budget: those `maybe_save`
        would save now. A level left out stays due.

        For a caller that gets its arrays later, off its thread (a device->host copy still
        on its way), and then calls ``save(iteration, ..., levels=ready)``. The caller-side
        methods (`ready_levels`, `maybe_save`, `save`, `finalize`) must not run on two
        threads at once: hand the checkpointer from one thread to the other.
        """
        due = self.due_levels(iteration)
        if not due:
            return due
        now = time.monotonic()
        with self._cv:
            ready = {n for n in due if not self._busy[n] and self._pending[n] is None
                     and now >= self._not_before.get(n, 0.0)}
        self.stats.deferred += len(due) - len(ready)
        for name in due - ready:
            if self._overdue(name) and name not in self._boosted:
                self._boosted.add(name)  # starving at idle priority: compete from now on
                if name in self._tids:
                    _set_thread_priority(self._tids[name], "normal")
        return ready

    def save(
        self,
        iteration: int,
        arrays: Mapping[str, Any],
        meta: Mapping[str, Any] | None = None,
        *,
        levels: set[str] | None = None,
        fingerprint: Mapping[str, Any] | None = None,
    ) -> None:
        """Snapshot `arrays` now (device->host copy) and hand them to the writers."""
        if self._closed:
            raise RuntimeError("Checkpointer is closed")
        t0 = time.perf_counter()
        levels = set(self.levels) if levels is None else set(levels) & set(self.levels)
        if fingerprint is not None:
            self.fingerprint = dict(fingerprint)
        host = {k: self._to_host(v) for k, v in arrays.items()}
        check_arrays(host)  # a programming error: raise here, on the caller's thread
        meta_json, fingerprint_json = dumps(dict(meta or {})), dumps(self.fingerprint)
        try:
            snap = self._buffers.snapshot(next(self._ids), int(iteration), host, meta_json,
                                          fingerprint_json, time.time())
        except OSError as e:  # no shared memory (ENOMEM, EMFILE): report; the job goes on
            for name in levels:
                self._record(name, self.levels[name], int(iteration), e)
            return
        finally:
            del host
        now = self._clock()
        for name in levels:
            self._last_iter[name] = int(iteration)
            self._last_time[name] = now
        with self._cv:
            for name in levels:
                if self._pending[name] is not None:
                    self.stats.replaced += 1  # newest wins
                self._pending[name] = snap
            self.stats.snapshots += 1
            self._cv.notify_all()
        self.stats.snapshot_seconds += time.perf_counter() - t0

    def finalize(
        self,
        iteration: int,
        get_arrays: Callable[[], Mapping[str, Any]],
        meta: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        timeout: float | None = None,
    ) -> bool:
        """Save the final state to every level not already holding it; wait for the disk.

        A level whose last write of this iteration failed is tried once more.
        """
        self.flush(timeout)
        todo = {n for n in self.levels
                if n not in self.committed or self.committed[n].iteration != iteration}
        if todo:
            m = meta() if callable(meta) else meta
            self.save(iteration, get_arrays(), m, levels=todo)
        return self.flush(timeout)

    def _overdue(self, name: str) -> bool:
        since = self._busy_since.get(name)
        return since is not None and time.monotonic() - since > self.starvation_s

    def _idle(self) -> bool:
        return all(p is None for p in self._pending.values()) and not any(self._busy.values())

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or being written; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            if self._idle():
                return True
        self._boost("normal")  # someone is waiting now: do not yield the CPU to others
        try:
            with self._cv:
                while not self._idle():
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    if not any(t.is_alive() for t in self._threads):
                        return False
                    self._cv.wait(1.0 if remaining is None else min(remaining, 1.0))
            return True
        finally:
            self._boost(self.priority)

    def _boost(self, priority: Priority) -> None:
        if self.priority == "idle":
            for tid in list(self._tids.values()):
                _set_thread_priority(tid, priority)

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        drained = self.flush(timeout)
        with self._proc_lock:
            proc = self._proc
        if drained and proc is not None:
            proc.close()  # before the level thread that started it ends (PR_SET_PDEATHSIG)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout)
        if not any(t.is_alive() for t in self._threads):
            if proc is not None:
                proc.close()
            self._buffers.close()
        atexit.unregister(self._atexit)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pending(self) -> bool:
        with self._cv:
            return not self._idle()

    # ------------------------------------------------------------------ writer side

    @property
    def _tids(self) -> dict[str, int]:
        """The writer process's thread id per level (levels it has greeted us on)."""
        proc = self._proc
        return {} if proc is None else proc.tids

    #: a writer process that died is started again at most this often (a broken install or
    #: repeated OOM kills must not cost a process start per checkpoint)
    RESTART_INTERVAL_S = 10.0

    def _start_process(self) -> WriterProcess | None:
        self._started_at = time.monotonic()
        try:
            return WriterProcess(list(self.levels), idle=self.priority == "idle")
        except OSError as e:  # no writes can succeed; each one reports why
            log.error("checkpoint writer process did not start: %s", e)
            return None

    def _writer(self, name: str) -> WriterProcess:
        """The live writer process, started again if the last one died; knows `name`'s tid."""
        with self._proc_lock:
            if self._proc is None or not self._proc.alive:
                if time.monotonic() - self._started_at < self.RESTART_INTERVAL_S:
                    why = ("could not be started" if self._proc is None else
                           f"exited (code {self._proc.proc.returncode})")
                    raise WriterGone(f"checkpoint writer process {why}; "
                                     f"started again at most every {self.RESTART_INTERVAL_S} s")
                if self._proc is not None:
                    self._proc.close(timeout=1.0)
                self._proc = self._start_process()
            proc = self._proc
        if proc is None:
            raise WriterGone("checkpoint writer process could not be started")
        if name not in proc.tids:
            tid = proc.hello(name)
            if name in self._boosted:
                _set_thread_priority(tid, "normal")
        return proc

    def _run(self, name: str) -> None:
        with contextlib.suppress(OSError, WriterGone):
            self._writer(name)  # learn the writer's thread id before the first write
        while True:
            with self._cv:
                while self._pending[name] is None and not self._closed:
                    self._cv.wait()
                snap = self._pending[name]
                if snap is None:
                    return
                self._pending[name] = None
                self._busy[name] = True
                self._busy_since[name] = time.monotonic()
            try:
                self._write(name, snap)
            except BaseException as e:  # never let a writer die silently
                self._record(name, self.levels[name], snap.iteration, e)
            finally:
                if name in self._boosted:
                    self._boosted.discard(name)
                    _set_thread_priority(self._tids[name], self.priority)
                with self._cv:
                    self._busy[name] = False
                    self._busy_since.pop(name, None)
                    self._cv.notify_all()

    def _write(self, name: str, snap: SharedSnapshot) -> None:
        t0 = time.perf_counter()
        start = time.monotonic()
        cost = 0.0
        cfg = self.levels[name]
        step_hook = None
        if self.hook is not None:
            user_hook = self.hook

            def step_hook(step: str, path: Path) -> None:
                user_hook(name, step, path)

        proc: WriterProcess | None = None
        try:
            proc = self._writer(name)
            protect = [self._protect[name]] if name in self._protect else []
            rec, cost = proc.write(name, snap, cfg.dir, cfg.keep, protect, step_hook)
        except WriteFailed as e:
            cost = e.cpu
            self._record(name, cfg, snap.iteration, str(e))
            return
        except (OSError, WriterGone) as e:
            if proc is not None:
                proc.kill()  # out of step with us: the next write starts a new one
            self._record(name, cfg, snap.iteration, e)
            return
        finally:
            with self._cv:
                self.stats.write_seconds += time.perf_counter() - t0
                self.stats.write_cpu_seconds += cost
                if self.policy.max_overhead is not None:
                    self._not_before[name] = start + cost / self.policy.max_overhead
        with self._cv:
            self.committed[name] = rec
            self._protect.pop(name, None)
            self.stats.commits += 1
            self.stats.bytes_written += rec.size or 0

    def _record(self, level: str, cfg: LevelConfig, iteration: int,
                e: BaseException | str) -> None:
        msg = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
        err = CheckpointError(level, Path(cfg.dir), iteration, msg, time.time())
        with self._cv:
            self.n_errors += 1
            self.stats.failures += 1
            if len(self.errors) >= self.MAX_ERRORS:
                del self.errors[0]
            # log the first failure of a kind loudly, repeats quietly (every iteration may fail)
            first = not any(x.level == level and x.message == msg for x in self.errors)
            self.errors.append(err)
        (log.error if first else log.debug)("%s", err)
        if self.on_error is not None:
            try:
                self.on_error(err)
            except Exception:
                log.exception("checkpoint on_error callback failed")
