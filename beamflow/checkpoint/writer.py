"""Asynchronous two-phase checkpointing: snapshot on the caller's thread, write in the background.

Phase 1 (`save`, on the caller's thread): copy each array to host memory with `to_host`
(a device->host copy for GPU arrays; a plain copy for numpy, since the caller mutates its
arrays in place) and serialize the metadata. Phase 2 (a single writer thread): build the HDF5
image and commit it to each due level. At most one write is in flight; a snapshot that
arrives while another is still waiting REPLACES it (the levels it was due for are carried
over), so memory stays bounded at two snapshots and the caller never waits on disk.

Write failures (a full or read-only shared filesystem) never reach the caller's thread: they
are recorded in `errors`, logged, and passed to `on_error`.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from beamflow.checkpoint.policy import CheckpointPolicy, LevelConfig
from beamflow.checkpoint.store import (
    CommitHook,
    LatestRecord,
    check_arrays,
    clean_stale_temps,
    commit,
    dumps,
    serialize,
)

log = logging.getLogger(__name__)

ToHost = Callable[[Any], np.ndarray]
#: hook(level, step, path): called by the writer thread at each commit step (tests, tracing)
WriterHook = Callable[[str, str, Path], None]


def _copy_to_host(a: Any) -> np.ndarray:
    return np.array(a, copy=True, order="C")


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
    replaced: int = 0  # snapshots dropped because a newer one arrived before they were written
    commits: int = 0
    failures: int = 0
    snapshot_seconds: float = 0.0  # time spent on the caller's thread
    write_seconds: float = 0.0  # time spent by the writer thread
    bytes_written: int = 0


@dataclass
class _Snapshot:
    iteration: int
    arrays: dict[str, np.ndarray]
    meta_json: str
    fingerprint: dict[str, Any] | None
    levels: set[str]
    created: float = field(default_factory=time.time)


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.levels: dict[str, LevelConfig] = policy.levels()
        self._to_host = to_host or _copy_to_host
        self.fingerprint = dict(fingerprint) if fingerprint is not None else None
        self.on_error = on_error
        self.hook = hook
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
        self._pending: _Snapshot | None = None
        self._busy = False
        self._closed = False
        for name, cfg in self.levels.items():
            try:
                Path(cfg.dir).mkdir(parents=True, exist_ok=True)
                clean_stale_temps(cfg.dir)
            except OSError as e:
                self._record(name, cfg, start_iteration, e)
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()
        # The writer is a daemon thread (a hung filesystem must not block exit); flush at
        # interpreter exit so a normal exit never loses the last snapshot.
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
        """Snapshot and queue a write if any level is due; `get_arrays` is called only then."""
        due = self.due_levels(iteration)
        if due:
            m = meta() if callable(meta) else meta
            self.save(iteration, get_arrays(), m, levels=due)
        return due

    def save(
        self,
        iteration: int,
        arrays: Mapping[str, Any],
        meta: Mapping[str, Any] | None = None,
        *,
        levels: set[str] | None = None,
        fingerprint: Mapping[str, Any] | None = None,
    ) -> None:
        """Snapshot `arrays` now (device->host copy) and hand them to the writer thread."""
        if self._closed:
            raise RuntimeError("Checkpointer is closed")
        t0 = time.perf_counter()
        levels = set(self.levels) if levels is None else set(levels) & set(self.levels)
        if fingerprint is not None:
            self.fingerprint = dict(fingerprint)
        host = {k: self._to_host(v) for k, v in arrays.items()}
        check_arrays(host)  # a programming error: raise here, on the caller's thread
        snap = _Snapshot(int(iteration), host, dumps(dict(meta or {})),
                         self.fingerprint, levels)
        now = self._clock()
        for name in levels:
            self._last_iter[name] = int(iteration)
            self._last_time[name] = now
        with self._cv:
            if self._pending is not None:
                # newest wins; it must still reach every level the dropped one was due for
                snap.levels |= self._pending.levels
                self.stats.replaced += 1
            self._pending = snap
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

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or being written; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._pending is not None or self._busy:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if not self._thread.is_alive():
                    return False
                self._cv.wait(remaining if remaining is not None else 1.0)
        return True

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        self.flush(timeout)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout)
        atexit.unregister(self._atexit)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pending(self) -> bool:
        with self._cv:
            return self._pending is not None or self._busy

    # ------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                if self._pending is None:
                    return
                snap, self._pending = self._pending, None
                self._busy = True
            try:
                self._write(snap)
            except BaseException as e:  # never let the thread die silently
                log.exception("checkpoint writer failed")
                for name in snap.levels:
                    self._record(name, self.levels[name], snap.iteration, e)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _write(self, snap: _Snapshot) -> None:
        t0 = time.perf_counter()
        try:
            image = serialize(snap.iteration, snap.arrays, snap.meta_json,
                              dumps(snap.fingerprint), created=snap.created)
        except Exception as e:
            for name in snap.levels:
                self._record(name, self.levels[name], snap.iteration, e)
            return
        sha = hashlib.sha256(image).hexdigest()
        for name in [n for n in self.levels if n in snap.levels]:  # L1 (fast) first
            cfg = self.levels[name]
            hook: CommitHook | None = None
            if self.hook is not None:
                user_hook = self.hook

                def hook(step: str, path: Path, _n: str = name, _h: WriterHook = user_hook) -> None:
                    _h(_n, step, path)

            try:
                protect = [self._protect[name]] if name in self._protect else []
                rec = commit(cfg.dir, snap.iteration, image, fingerprint=snap.fingerprint,
                             keep=cfg.keep, protect=protect, hook=hook, sha256=sha)
            except Exception as e:
                self._record(name, cfg, snap.iteration, e)
                continue
            self.committed[name] = rec
            self._protect.pop(name, None)
            self.stats.commits += 1
            self.stats.bytes_written += len(image)
        self.stats.write_seconds += time.perf_counter() - t0

    def _record(self, level: str, cfg: LevelConfig, iteration: int, e: BaseException) -> None:
        msg = f"{type(e).__name__}: {e}"
        err = CheckpointError(level, Path(cfg.dir), iteration, msg, time.time())
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
