"""The run store's SQLite schema, as the migrations that build it: each entry moves a store
one version forward (``PRAGMA user_version``); a store opened by a newer beamflow migrates on
open, one opened by an older one is refused."""

from __future__ import annotations

# Each entry moves the schema one version forward; never edit a released entry.
MIGRATIONS: list[str] = [
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
SCHEMA_VERSION = len(MIGRATIONS)
