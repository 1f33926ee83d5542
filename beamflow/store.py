"""The run store: SQLite in WAL mode, the single source of truth about runs.

The agent writes and the status page reads at the same time, often from different processes.
WAL lets readers go on while one writer commits; a busy timeout absorbs the short write
locks. Each thread gets its own connection (sqlite3 connections are not shared across
threads). The schema carries a version (``PRAGMA user_version``) and migrates forward on open.

Times are stored as Unix seconds (REAL) and shown as ISO 8601 UTC by the models.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field, field_serializer

from beamflow.error_kinds import ErrorKind


class RunStatus(StrEnum):
    QUEUED = "QUEUED"
    ACTIVE = "ACTIVE"
    INACTIVE = "INACTIVE"  # Globus: waiting on something a person must do (e.g. consent)
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


class StoreError(Exception):
    """The store cannot do what was asked (unknown run, duplicate key, bad field)."""


class DuplicateRun(StoreError):
    """A run with this dedupe key exists already: the scan was processed (or is queued)."""

    def __init__(self, key: str, run_id: str) -> None:
        super().__init__(f"a run for {key!r} exists already: {run_id}")
        self.key = key
        self.run_id = run_id


# list_runs(sort=...): the ORDER BY terms; runs without the time sort last either way
# (duration: of unfinished runs, until now).
_SORT_KEYS = {
    "created": "created_at {order}",
    "finished": "finished_at IS NULL, finished_at {order}",
    "duration": "started_at IS NULL, COALESCE(finished_at, {now}) - started_at {order}",
}


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Timed(BaseModel):
    @field_serializer("*", when_used="json")
    def _times(self, value: Any, info: Any) -> Any:
        if info.field_name.endswith("_at") or info.field_name == "time":
            return _iso(value)
        return value


class Run(_Timed):
    id: str
    scan_name: str  # the scan's short name (its directory, or file without _master.h5)
    scan_path: str  # the scan's one path: absolute, as the user's files are on the beamline
    flow: str
    backend: str
    status: RunStatus
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    updated_at: float
    error: str | None = None
    error_step: str | None = None
    error_kind: ErrorKind | None = None  # what kind of fault ended it: decides retries
    parameters: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any] = Field(default_factory=dict)
    product: str | None = None
    previews: list[str] = Field(default_factory=list)
    current_step: str | None = None
    iteration: int | None = None
    iterations_total: int | None = None
    backend_run_id: str | None = None
    label: str | None = None
    attempt: int = 1
    parent_run_id: str | None = None
    fraction: float | None = None
    dedupe_key: str | None = None
    retried_by: str | None = None  # the one run that retries this one (see Store.add_retry)
    # Trust in the reconstruction, from its summary when it arrived (None: none finished).
    verdict: Literal["trusted", "suspect"] | None = None
    verdict_reasons: list[str] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.finished_at or time.time()) - self.started_at

    @computed_field  # type: ignore[prop-decorator]
    @property
    def retry_refusal(self) -> str | None:
        """Why a new attempt of this run is refused, in a sentence (None: it may be retried).
        One failed run has at most one retry; one that failed on bad input would only fail
        again."""
        if not self.status.finished:
            return f"run {self.id} is {self.status.value}: cancel it before retrying"
        if self.status == RunStatus.SUCCEEDED:
            return (f"run {self.id} succeeded; start a new run of the scan with "
                    "`beamflow runs start`")
        if self.retried_by:
            return f"run {self.id} was retried already, as run {self.retried_by}"
        if self.error_kind == ErrorKind.BAD_INPUT:
            return (f"run {self.id} failed on bad input: a retry would not help; fix the scan "
                    "or the parameters and start a new run")
        return None

    def new_attempt(self, backend: str) -> Run:
        """A QUEUED copy of this run (same scan, flow, parameters and fraction) on
        ``backend``, linked to it: nothing of this attempt's outcome is carried over."""
        now = time.time()
        return Run(
            **self.model_dump(include=_REQUEST_FIELDS),
            id=str(uuid.uuid4()),
            backend=backend,
            status=RunStatus.QUEUED,
            created_at=now,
            updated_at=now,
            parent_run_id=self.id,
            attempt=self.attempt + 1,
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def truth_nrmse(self) -> float | None:
        """The demo's score against the simulator's ground truth (``result.truth``)."""
        truth = self.result.get("truth")
        nrmse = truth.get("nrmse") if isinstance(truth, dict) else None
        return float(nrmse) if isinstance(nrmse, int | float) else None


# What a run was asked to do; everything else of a run is its identity or its outcome.
_REQUEST_FIELDS = {"scan_name", "scan_path", "flow", "parameters", "fraction", "iterations_total"}


class Step(_Timed):
    run_id: str
    name: str
    status: str
    started_at: float | None = None
    finished_at: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


class Attempt(_Timed):
    """One attempt of a run: the agent retries a run in its own record (``attempt`` goes
    up), so the run keeps each earlier attempt here, as it ended."""

    run_id: str
    attempt: int
    backend_run_id: str | None = None
    status: RunStatus  # how it ended (FAILED, or CANCELLED when the agent stopped), or stands
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    error_step: str | None = None
    error_kind: ErrorKind | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.finished_at or time.time()) - self.started_at


class Event(_Timed):
    id: int
    run_id: str | None
    time: float
    level: str
    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


def scan_labels(name: str, paths: Iterable[str]) -> dict[str, str]:
    """Labels for the scans called ``name`` at ``paths``: the name alone when there is one
    scan, else the fewest parent directories that tell them apart, then the name
    (``a/s1``, ``b/s1``; a directory named like the scan, the usual layout, is skipped).
    A scan's directory and its master (or CXI) file are one scan, one label (runs recorded
    before the master file became the one ``scan_path`` name the directory)."""
    files = (f"{name}_master.h5", f"{name}.cxi")
    place: dict[str, str] = {}  # each path -> the scan it names (one key per scan)
    context: dict[str, tuple[str, ...]] = {}  # each scan -> the directories it lies in
    for p in set(paths):
        path = PurePath(p)
        folder = path if path.name == name and not path.suffix else path.parent
        place[p] = str(folder) if folder != path.parent or path.name in files else p
        parts = [x for x in folder.parts if x not in ("/", "\\")]
        if parts and parts[-1] == name:
            parts.pop()
        context[place[p]] = tuple(parts)
    if len(context) <= 1:
        return {p: name for p in place}
    labels = {scan: name for scan in context}
    for k in range(1, max(len(c) for c in context.values()) + 1):
        labels = {scan: "/".join([*c[-k:], name]) for scan, c in context.items()}
        if len(set(labels.values())) == len(context):
            return {p: labels[place[p]] for p in place}
    # Still alike (two scans in one directory): each by its own path.
    taken = list(labels.values())
    return {p: p if taken.count(labels[place[p]]) > 1 else labels[place[p]] for p in place}


# Each entry moves the schema one version forward; never edit a released entry.
_MIGRATIONS: list[str] = [
    """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        scan TEXT NOT NULL,
        scan_path TEXT,
        flow TEXT NOT NULL,
        backend TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        updated_at REAL NOT NULL,
        error TEXT,
        error_step TEXT,
        parameters TEXT NOT NULL DEFAULT '{}',
        result TEXT NOT NULL DEFAULT '{}',
        product TEXT,
        previews TEXT NOT NULL DEFAULT '[]',
        current_step TEXT,
        iteration INTEGER,
        iterations_total INTEGER,
        backend_run_id TEXT,
        label TEXT,
        attempt INTEGER NOT NULL DEFAULT 1,
        parent_run_id TEXT,
        fraction REAL,
        dedupe_key TEXT UNIQUE
    );
    CREATE INDEX runs_created ON runs (created_at DESC);
    CREATE INDEX runs_status_created ON runs (status, created_at DESC);
    CREATE INDEX runs_scan ON runs (scan);
    CREATE TABLE steps (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        seq INTEGER NOT NULL,
        status TEXT NOT NULL,
        started_at REAL,
        finished_at REAL,
        details TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, name)
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT,
        time REAL NOT NULL,
        level TEXT NOT NULL,
        code TEXT NOT NULL,
        message TEXT NOT NULL,
        details TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_run ON events (run_id, id);
    """,
    # 2: one name per meaning (scan_name, scan_path; rows without a path keep what stood
    # for it), the kind of fault that ended a run, and the one retry of a run.
    """
    ALTER TABLE runs RENAME COLUMN scan TO scan_name;
    UPDATE runs SET scan_path = scan_name WHERE scan_path IS NULL;
    ALTER TABLE runs ADD COLUMN error_kind TEXT;
    ALTER TABLE runs ADD COLUMN retried_by TEXT;
    ALTER TABLE runs ADD COLUMN verdict TEXT;
    ALTER TABLE runs ADD COLUMN verdict_reasons TEXT NOT NULL DEFAULT '[]';
    UPDATE runs SET verdict = json_extract(result, '$.summary.verdict'),
        verdict_reasons = COALESCE(json_extract(result, '$.summary.verdict_reasons'), '[]')
        WHERE json_extract(result, '$.summary.verdict') IN ('trusted', 'suspect');
    CREATE INDEX runs_parent ON runs (parent_run_id);
    UPDATE runs SET retried_by = (
        SELECT c.id FROM runs AS c WHERE c.parent_run_id = runs.id
        ORDER BY c.created_at, c.rowid LIMIT 1
    );
    """,
    # 3: the earlier attempts of a run the agent retried in its own record.
    """
    CREATE TABLE attempts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        attempt INTEGER NOT NULL,
        backend_run_id TEXT,
        status TEXT NOT NULL,
        started_at REAL,
        finished_at REAL,
        error TEXT,
        error_step TEXT,
        error_kind TEXT
    );
    CREATE INDEX attempts_run ON attempts (run_id, id);
    """,
]
SCHEMA_VERSION = len(_MIGRATIONS)

_COMPUTED = set(Run.model_computed_fields)
_JSON_FIELDS = {"parameters", "result", "previews", "verdict_reasons"}
_RUN_FIELDS = set(Run.model_fields)
_UPDATABLE = _RUN_FIELDS - {"id", "created_at", "updated_at", "retried_by"}


class Store:
    """Runs, their steps and events, in one SQLite file."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._migrate()

    # -- connections -------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front, so two writers never deadlock
        # upgrading read locks; the busy timeout makes the second one wait.
        conn = self._connect()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _migrate(self) -> None:
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {version} is newer than this beamflow "
                    f"({SCHEMA_VERSION}); upgrade beamflow"
                )
            for number in range(version, SCHEMA_VERSION):
                for statement in _MIGRATIONS[number].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {number + 1}")

    # -- runs --------------------------------------------------------------------------
    def create_run(
        self,
        *,
        scan_name: str,
        scan_path: str,
        flow: str,
        backend: str,
        parameters: dict[str, Any] | None = None,
        status: RunStatus = RunStatus.QUEUED,
        dedupe_key: str | None = None,
        label: str | None = None,
        fraction: float | None = None,
        iterations_total: int | None = None,
    ) -> Run:
        """Record a new run. A second run with the same ``dedupe_key`` raises DuplicateRun."""
        now = time.time()
        return self.add_run(Run(
            id=str(uuid.uuid4()), scan_name=scan_name, scan_path=scan_path, flow=flow,
            backend=backend, status=status, created_at=now, updated_at=now,
            started_at=now if status == RunStatus.ACTIVE else None,
            parameters=parameters or {}, dedupe_key=dedupe_key, label=label,
            fraction=fraction, iterations_total=iterations_total,
        ))  # fmt: skip

    def add_run(self, run: Run) -> Run:
        """Record ``run`` as it is (a second run with its ``dedupe_key`` raises
        DuplicateRun)."""
        with self._write() as conn:
            self._insert(conn, run)
        return run

    def add_retry(self, old: Run, new: Run) -> Run:
        """Record ``new`` as the one retry of ``old``, in one transaction: a second retry of
        the same run, even one racing this one from another process, raises DuplicateRun
        with the id of the first."""
        with self._write() as conn:
            row = conn.execute("SELECT retried_by FROM runs WHERE id = ?", (old.id,)).fetchone()
            if row is None:
                raise StoreError(f"no run with id {old.id!r} in {self.path}")
            if row["retried_by"]:
                raise DuplicateRun(f"retry of {old.id}", row["retried_by"])
            self._insert(conn, new)
            conn.execute("UPDATE runs SET retried_by = ?, updated_at = ? WHERE id = ?",
                         (new.id, time.time(), old.id))  # fmt: skip
        return new

    def _insert(self, conn: sqlite3.Connection, run: Run) -> None:
        row = self._to_row(run.model_dump(exclude=_COMPUTED))
        columns = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        try:
            conn.execute(f"INSERT INTO runs ({columns}) VALUES ({marks})", list(row.values()))
        except sqlite3.IntegrityError:
            key = run.dedupe_key
            existing = key and conn.execute(
                "SELECT id FROM runs WHERE dedupe_key = ?", (key,)
            ).fetchone()
            if existing:
                raise DuplicateRun(key, existing["id"]) from None
            raise

    def get_run(self, run_id: str) -> Run | None:
        row = self._connect().execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return self._run(row) if row else None

    def require_run(self, run_id: str) -> Run:
        run = self.get_run(run_id)
        if run is None:
            raise StoreError(f"no run with id {run_id!r} in {self.path}")
        return run

    def get_run_by_key(self, dedupe_key: str) -> Run | None:
        row = (
            self._connect()
            .execute("SELECT * FROM runs WHERE dedupe_key = ?", (dedupe_key,))
            .fetchone()
        )
        return self._run(row) if row else None

    def list_runs(
        self,
        *,
        status: RunStatus | str | Sequence[RunStatus | str] | None = None,
        scan: str | None = None,
        limit: int | None = 50,
        offset: int = 0,
        oldest_first: bool = False,
        since: float | None = None,
        sort: str = "created",
    ) -> list[Run]:
        """Runs, newest first; ``scan`` matches a substring of the scan name; ``since`` keeps
        the runs that ended at or after that time or have not ended; ``sort`` orders by
        ``created``, ``finished`` (unfinished last) or ``duration`` (longest first)."""
        where, args = self._filters(status, scan, since)
        order = "ASC" if oldest_first else "DESC"
        key = _SORT_KEYS.get(sort)
        if key is None:
            raise StoreError(f"unknown sort {sort!r}; use one of {', '.join(_SORT_KEYS)}")
        terms = key.format(order=order, now=f"{time.time():.3f}")
        sql = f"SELECT * FROM runs {where} ORDER BY {terms}, rowid {order}"
        if limit is not None:
            sql += " LIMIT ? OFFSET ?"
            args += [limit, offset]
        return [self._run(r) for r in self._connect().execute(sql, args)]

    def count_runs(
        self,
        *,
        status: RunStatus | str | Sequence[RunStatus | str] | None = None,
        scan: str | None = None,
    ) -> int:
        where, args = self._filters(status, scan)
        return self._connect().execute(f"SELECT COUNT(*) FROM runs {where}", args).fetchone()[0]

    def count_by_status(
        self, *, scan: str | None = None, since: float | None = None
    ) -> dict[str, int]:
        """Runs per status (every status present, zeros included), in one query."""
        where, args = self._filters(None, scan, since)
        rows = self._connect().execute(
            f"SELECT status, COUNT(*) FROM runs {where} GROUP BY status", args
        )
        counts = {s.value: 0 for s in RunStatus}
        counts.update({status: n for status, n in rows})
        return counts

    def display_names(self, runs: Iterable[Run]) -> dict[str, str]:
        """A name for each run that tells scans of the same file name apart: the scan name
        where it is the only scan of that name in the store, else the shortest path suffix
        that is unique (``day1/demo_scan_001``). Keyed by run id."""
        runs = list(runs)
        names = sorted({r.scan_name for r in runs})
        paths: dict[str, set[str]] = {n: set() for n in names}
        for start in range(0, len(names), 500):  # SQLite's bound-parameter limit
            chunk = names[start : start + 500]
            rows = self._connect().execute(
                f"SELECT DISTINCT scan_name, scan_path FROM runs "
                f"WHERE scan_name IN ({', '.join('?' for _ in chunk)})", chunk,
            )  # fmt: skip
            for scan, path in rows:
                paths[scan].add(path)
        labels = {n: scan_labels(n, paths[n]) for n in names}
        return {r.id: labels[r.scan_name][r.scan_path] for r in runs}

    def update_run(self, run_id: str, **fields: Any) -> Run:
        """Change fields of a run. Status changes stamp started_at/finished_at on the way."""
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise StoreError(f"cannot update run fields {sorted(unknown)}")
        now = time.time()
        with self._write() as conn:
            row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise StoreError(f"no run with id {run_id!r} in {self.path}")
            current = self._run(row)
            if "status" in fields:
                status = RunStatus(fields["status"])
                fields["status"] = status
                if status == RunStatus.ACTIVE and current.started_at is None:
                    fields.setdefault("started_at", now)
                if status.finished and current.finished_at is None:
                    fields.setdefault("finished_at", now)
                    fields.setdefault("started_at", current.started_at or now)
            fields["updated_at"] = now
            row_values = self._to_row(fields)
            assignments = ", ".join(f"{k} = ?" for k in row_values)
            conn.execute(
                f"UPDATE runs SET {assignments} WHERE id = ?", [*row_values.values(), run_id]
            )
            row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return self._run(row)

    def add_previews(self, run_id: str, paths: Sequence[str | Path]) -> Run:
        """Link preview files to a run (kept once each, in the order first seen)."""
        run = self.require_run(run_id)
        previews = list(run.previews)
        for p in map(str, paths):
            if p not in previews:
                previews.append(p)
        return self.update_run(run_id, previews=previews)

    # -- attempts ------------------------------------------------------------------------
    def requeue(
        self,
        run_id: str,
        *,
        status: RunStatus = RunStatus.FAILED,
        error: str | None = None,
        error_step: str | None = None,
        error_kind: ErrorKind | None = None,
        next_attempt: bool = True,
    ) -> Run:
        """Close the run's current attempt (kept in :meth:`attempts` as it ended: ``status``,
        the error, its step and kind; those of the run where not given) and put the run back
        in the queue, as the next attempt (``next_attempt``) or as the same one (an attempt
        the agent interrupted does not count against the retries). One transaction."""
        now = time.time()
        with self._write() as conn:
            row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise StoreError(f"no run with id {run_id!r} in {self.path}")
            run = self._run(row)
            kind = error_kind if error_kind is not None else run.error_kind
            conn.execute(
                "INSERT INTO attempts (run_id, attempt, backend_run_id, status, started_at, "
                "finished_at, error, error_step, error_kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run.id, run.attempt, run.backend_run_id, RunStatus(status).value,
                 run.started_at, run.finished_at or now, error or run.error,
                 error_step or run.error_step, None if kind is None else ErrorKind(kind).value),
            )  # fmt: skip
            conn.execute(
                "UPDATE runs SET status = ?, attempt = ?, backend_run_id = NULL, "
                "started_at = NULL, finished_at = NULL, error = NULL, error_step = NULL, "
                "error_kind = NULL, current_step = NULL, iteration = NULL, updated_at = ? "
                "WHERE id = ?",
                (RunStatus.QUEUED.value, run.attempt + (1 if next_attempt else 0), now, run_id),
            )  # fmt: skip
            row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return self._run(row)

    def attempts(self, run: Run) -> list[Attempt]:
        """Every attempt of ``run``, oldest first: those that ended, then the current one
        (the run as it stands)."""
        rows = self._connect().execute(
            "SELECT * FROM attempts WHERE run_id = ? ORDER BY id", (run.id,))
        ended = [Attempt(**{k: v for k, v in dict(r).items() if k != "id"}) for r in rows]
        current = Attempt(**run.model_dump(include=set(Attempt.model_fields) - {"run_id"}),
                          run_id=run.id)
        return [*ended, current]

    # -- steps and events --------------------------------------------------------------
    def record_step(
        self,
        run_id: str,
        name: str,
        status: str,
        *,
        started_at: float | None = None,
        finished_at: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> Step:
        """Create or update the step ``name`` of a run; fields left None keep their value."""
        with self._write() as conn:
            row = conn.execute(
                "SELECT * FROM steps WHERE run_id = ? AND name = ?", (run_id, name)
            ).fetchone()
            if row is None:
                seq = conn.execute(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM steps WHERE run_id = ?", (run_id,)
                ).fetchone()[0]
                conn.execute(
                    "INSERT INTO steps (run_id, name, seq, status, started_at, finished_at, "
                    "details) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (run_id, name, seq, status, started_at, finished_at, json.dumps(details or {})),
                )
            else:
                merged = {**json.loads(row["details"]), **(details or {})}
                conn.execute(
                    "UPDATE steps SET status = ?, started_at = COALESCE(?, started_at), "
                    "finished_at = COALESCE(?, finished_at), details = ? "
                    "WHERE run_id = ? AND name = ?",
                    (status, started_at, finished_at, json.dumps(merged), run_id, name),
                )
            conn.execute("UPDATE runs SET current_step = ? WHERE id = ?", (name, run_id))
            row = conn.execute(
                "SELECT * FROM steps WHERE run_id = ? AND name = ?", (run_id, name)
            ).fetchone()
        return self._step(row)

    def steps(self, run_id: str) -> list[Step]:
        rows = self._connect().execute(
            "SELECT * FROM steps WHERE run_id = ? ORDER BY seq", (run_id,)
        )
        return [self._step(r) for r in rows]

    def add_event(
        self,
        run_id: str | None,
        code: str,
        message: str,
        *,
        level: str = "info",
        details: dict[str, Any] | None = None,
    ) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO events (run_id, time, level, code, message, details) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, time.time(), level, code, message, json.dumps(details or {})),
            )

    def events(self, run_id: str | None = None, limit: int = 200) -> list[Event]:
        if run_id is None:
            rows = self._connect().execute(
                "SELECT * FROM events ORDER BY id DESC LIMIT ?", (limit,)
            )
        else:
            rows = self._connect().execute(
                "SELECT * FROM events WHERE run_id = ? ORDER BY id DESC LIMIT ?", (run_id, limit)
            )
        return [
            Event(**{**dict(r), "details": json.loads(r["details"])}) for r in rows
        ][::-1]

    # -- helpers -----------------------------------------------------------------------
    @staticmethod
    def _filters(
        status: RunStatus | str | Sequence[RunStatus | str] | None, scan: str | None,
        since: float | None = None,
    ) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        if status:
            statuses = [status] if isinstance(status, str) else list(status)
            values = [RunStatus(str(s).upper()).value for s in statuses]
            clauses.append(f"status IN ({', '.join('?' for _ in values)})")
            args += values
        if scan:
            # The name or the path: "day2/" finds the scans of one directory.
            clauses.append("(scan_name LIKE ? ESCAPE '\\' OR scan_path LIKE ? ESCAPE '\\')")
            escaped = scan.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            args += [f"%{escaped}%", f"%{escaped}%"]
        if since is not None:  # ended in the window, or not ended: what happened since
            clauses.append("(finished_at IS NULL OR finished_at >= ?)")
            args.append(since)
        return ("WHERE " + " AND ".join(clauses)) if clauses else "", args

    @staticmethod
    def _to_row(fields: dict[str, Any]) -> dict[str, Any]:
        row = {}
        for key, value in fields.items():
            if key in _JSON_FIELDS:
                value = json.dumps(value)
            elif isinstance(value, Path):
                value = str(value)
            elif isinstance(value, RunStatus | ErrorKind):
                value = value.value
            row[key] = value
        return row

    @staticmethod
    def _run(row: sqlite3.Row) -> Run:
        data = dict(row)
        for key in _JSON_FIELDS:
            data[key] = json.loads(data[key])
        return Run(**data)

    @staticmethod
    def _step(row: sqlite3.Row) -> Step:
        data = dict(row)
        data.pop("seq")
        data["details"] = json.loads(data["details"])
        return Step(**data)
