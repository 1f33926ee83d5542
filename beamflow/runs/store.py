"""The run store: SQLite in WAL mode, the single source of truth about runs.

The agent writes and the status page reads at the same time, often from different processes.
WAL lets readers go on while one writer commits; a busy timeout absorbs the short write
locks. Each thread gets its own connection (sqlite3 connections are not shared across
threads). The schema carries a version (``PRAGMA user_version``) and migrates forward on open.

Times are stored as Unix seconds (REAL); the records (:mod:`beamflow.runs.records`) show
them as ISO 8601 UTC.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from beamflow.error_kinds import ErrorKind
from beamflow.runs.naming import scan_labels
from beamflow.runs.records import Attempt, Event, Run, RunStatus, Step
from beamflow.runs.schema import MIGRATIONS, SCHEMA_VERSION


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
                for statement in MIGRATIONS[number].split(";"):
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
