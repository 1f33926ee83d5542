"""The run store: lifecycle, filters, steps, migrations, and a writer and reader at once."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from beamflow.runs.records import RunStatus
from beamflow.runs.schema import SCHEMA_VERSION
from beamflow.runs.store import DuplicateRun, Store, StoreError


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "state" / "runs.sqlite")


def test_run_lifecycle_stamps_times_and_keeps_error(store: Store) -> None:
    run = store.create_run(scan_name="scan_001", scan_path="/data/scan_001",
                           flow="ptycho_reconstruct", backend="local")
    assert run.status == RunStatus.QUEUED and run.started_at is None
    active = store.update_run(run.id, status="ACTIVE", backend_run_id="r-1")
    assert active.started_at is not None and active.finished_at is None
    failed = store.update_run(
        run.id, status=RunStatus.FAILED, error="no positions", error_step="Reconstruct"
    )
    assert failed.finished_at is not None and failed.finished_at >= failed.started_at
    again = store.get_run(run.id)
    assert again is not None
    assert (again.status, again.error) == ("FAILED", "no positions")
    assert again.error_step == "Reconstruct"
    assert again.backend_run_id == "r-1"


def test_json_view_has_the_contract_fields(store: Store) -> None:
    run = store.create_run(scan_name="s", scan_path="/data/s", flow="f", backend="local")
    store.add_previews(run.id, ["/b/p/object_phase.png", "/b/p/probe.png", "/b/p/probe.png"])
    data = store.require_run(run.id).model_dump(mode="json")
    for key in ("id", "scan_name", "scan_path", "status", "error", "created_at", "finished_at",
                "previews"):
        assert key in data
    assert data["previews"] == ["/b/p/object_phase.png", "/b/p/probe.png"]
    assert data["created_at"].endswith("Z")  # ISO 8601 UTC


def test_dedupe_key_makes_a_scan_run_once(store: Store) -> None:
    first = store.create_run(scan_name="s", scan_path="/data/s",
                             flow="f", backend="local", dedupe_key="/d/s#1.0")
    with pytest.raises(DuplicateRun) as info:
        store.create_run(scan_name="s", scan_path="/data/s",
                         flow="f", backend="local", dedupe_key="/d/s#1.0")
    assert info.value.run_id == first.id
    assert store.count_runs() == 1


def test_filters_newest_first_and_pagination(store: Store) -> None:
    ids = []
    for i in range(7):
        r = store.create_run(scan_name=f"scan_{i:03d}", scan_path=f"/data/scan_{i:03d}",
                             flow="f", backend="local")
        ids.append(r.id)
        if i % 2:
            store.update_run(r.id, status="FAILED", error="x")
    newest = store.list_runs(limit=3)
    assert [r.id for r in newest] == ids[::-1][:3]
    assert [r.id for r in store.list_runs(limit=3, offset=3)] == ids[::-1][3:6]
    assert store.count_runs(status="failed") == 3
    assert {r.scan_name for r in store.list_runs(scan="_00")} == {f"scan_00{i}" for i in range(7)}
    assert [r.scan_name for r in store.list_runs(scan="scan_004")] == ["scan_004"]
    # LIKE wildcards in the filter are literal characters, not patterns
    assert store.list_runs(scan="%") == []


def test_steps_upsert_in_order_and_set_current_step(store: Store) -> None:
    run = store.create_run(scan_name="s", scan_path="/data/s", flow="f", backend="local")
    store.record_step(run.id, "TransferIn", "ACTIVE", started_at=10.0)
    store.record_step(run.id, "Reconstruct", "ACTIVE", started_at=12.0)
    store.record_step(run.id, "TransferIn", "SUCCEEDED", finished_at=11.5, details={"files": 3})
    steps = store.steps(run.id)
    assert [s.name for s in steps] == ["TransferIn", "Reconstruct"]
    assert steps[0].duration == pytest.approx(1.5) and steps[0].details == {"files": 3}
    assert store.require_run(run.id).current_step == "TransferIn"


def test_unknown_fields_and_runs_are_refused(store: Store) -> None:
    run = store.create_run(scan_name="s", scan_path="/data/s", flow="f", backend="local")
    with pytest.raises(StoreError, match="cannot update"):
        store.update_run(run.id, colour="red")
    with pytest.raises(StoreError, match="no run"):
        store.update_run("missing", status="FAILED")
    with pytest.raises(ValueError):
        store.update_run(run.id, status="DONE")


def test_schema_version_and_newer_schema_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    Store(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        Store(path)


def test_a_store_of_schema_1_opens_and_is_migrated(tmp_path: Path) -> None:
    """A run store written by the previous beamflow: its runs keep their names and paths
    (a row without a path keeps the name that stood for it), a finished reconstruction
    its verdict, and a run already retried the id of its retry."""
    from beamflow.runs.schema import MIGRATIONS

    path = tmp_path / "runs.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0])
    conn.execute("PRAGMA user_version = 1")
    summary = '{"summary": {"verdict": "suspect", "verdict_reasons": ["probe collapsed"]}}'
    rows = [  # id, scan, scan_path, status, created_at, result, parent_run_id
        ("a", "s1", "/bl/detector/s1", "SUCCEEDED", 1.0, summary, None),
        ("b", "s2", None, "FAILED", 2.0, "{}", None),
        ("c", "s2", None, "FAILED", 3.0, "{}", "b"),
        ("d", "s3", "/bl/detector/s3", "FAILED", 4.0, '{"summary": {"verdict": "odd"}}', None),
    ]
    conn.executemany(
        "INSERT INTO runs (id, scan, scan_path, flow, backend, status, created_at, updated_at, "
        "result, parent_run_id) VALUES (?, ?, ?, 'ptycho_reconstruct', 'local', ?, ?, 0, ?, ?)",
        rows,
    )
    conn.commit()
    conn.close()

    store = Store(path)
    a, b, c, d = (store.require_run(i) for i in "abcd")
    assert (a.scan_name, a.scan_path) == ("s1", "/bl/detector/s1")
    assert (b.scan_name, b.scan_path) == ("s2", "s2")
    assert (a.verdict, a.verdict_reasons) == ("suspect", ["probe collapsed"])
    assert (d.verdict, d.verdict_reasons) == (None, [])  # not a verdict: none is made up
    assert (b.retried_by, c.retried_by) == ("c", None)
    assert b.retry_refusal == "run b was retried already, as run c"
    assert [r.id for r in store.list_runs(scan="s2")] == ["c", "b"]
    store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_run_has_at_most_one_retry_even_when_two_race(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    store = Store(path)
    old = store.create_run(scan_name="s", scan_path="/data/s", flow="f", backend="local")
    old = store.update_run(old.id, status=RunStatus.FAILED, error="lost", error_kind="lost")
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def retry() -> None:
        mine = Store(path)  # each its own connection, as two processes would have
        barrier.wait()
        try:
            outcomes.append("new:" + mine.add_retry(old, old.new_attempt("local")).id)
        except DuplicateRun as exc:
            outcomes.append("refused:" + exc.run_id)

    threads = [threading.Thread(target=retry) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (new,) = [o.removeprefix("new:") for o in outcomes if o.startswith("new:")]
    assert sorted(outcomes) == [f"new:{new}"] + [f"refused:{new}"] * 7
    assert store.count_runs() == 2
    retry_run = store.require_run(new)
    assert (retry_run.parent_run_id, retry_run.attempt, retry_run.status) == (
        old.id, 2, RunStatus.QUEUED)
    assert (retry_run.scan_path, retry_run.error, retry_run.retried_by) == ("/data/s", None, None)
    assert store.require_run(old.id).retried_by == new


def _writer(path: str, n: int) -> None:
    store = Store(path)
    for i in range(n):
        run = store.create_run(scan_name=f"scan_{i}", scan_path=f"/data/scan_{i}",
                               flow="f", backend="local")
        store.record_step(run.id, "Reconstruct", "ACTIVE", started_at=time.time())
        store.update_run(run.id, status="SUCCEEDED")


def _reader(path: str, seconds: float, out: mp.Queue) -> None:
    store = Store(path)
    deadline = time.time() + seconds
    seen, errors = 0, 0
    while time.time() < deadline:
        try:
            runs = store.list_runs(limit=20)
            for r in runs:
                assert r.status in RunStatus
            seen = max(seen, store.count_runs())
        except Exception:  # noqa: BLE001 - counted and asserted below
            errors += 1
    out.put((seen, errors))


def test_writer_and_reader_processes_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "runs.sqlite")
    Store(path).close()
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(path, 60)) for _ in range(2)]
    reader = ctx.Process(target=_reader, args=(path, 3.0, out))
    reader.start()
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
        assert w.exitcode == 0
    reader.join(60)
    seen, errors = out.get(timeout=5)
    assert errors == 0
    assert seen > 0
    store = Store(path)
    assert store.count_runs() == 120
    assert store.count_runs(status="SUCCEEDED") == 120
