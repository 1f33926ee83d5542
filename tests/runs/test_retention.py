"""Data that does not pile up: [retention] deletes the cluster's raw copies and checkpoints of
scans untouched for long enough, and old previews on the beamline, never a product, a scan
with a run in flight, or anything outside its roots; the run records stay and say what went.

The rules run for real on files here (beamflow.cleanup_task, the retention flow's function);
the retention flow runs on the local backend's interpreter and compute engine, as `beamflow
cleanup` and the agent run it there (imitating the Globus Timer); on Globus, the Timer is
made and its runs read through globus-sdk's registered responses."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import flows
from beamflow.cleanup_task import clean
from beamflow.cli import app
from beamflow.config import ConfigError, load_config
from beamflow.runs.naming import scan_key
from beamflow.runs.records import RunStatus
from beamflow.runs.retention import (
    FLOW,
    Item,
    Report,
    RetentionPass,
    clean_previews,
    flow_input,
    in_flight,
    record,
)
from beamflow.runs.store import Store

DAY = 86400.0


def aged(path: Path, days: float) -> None:
    """Every file and directory under ``path`` last changed ``days`` ago."""
    when = time.time() - days * DAY
    for p in [path, *path.rglob("*")]:
        os.utime(p, (when, when), follow_symlinks=False)


def scan_dir(root: Path, key: str, days: float, *, product: bool = True) -> Path:
    """``root/key`` as the flows lay a scan out: raw/, checkpoints/, runs/<run>/product.h5."""
    d = root / key
    (d / "raw" / "scan").mkdir(parents=True)
    (d / "raw" / "scan" / "scan_data_000001.h5").write_bytes(b"x" * 5000)
    (d / "checkpoints").mkdir()
    (d / "checkpoints" / "ckpt_000010.h5").write_bytes(b"c" * 700)
    if product:
        (d / "runs" / "run-1").mkdir(parents=True)
        (d / "runs" / "run-1" / "product.h5").write_bytes(b"p" * 300)
    aged(d, days)
    return d


# -- the rules, on files -----------------------------------------------------------------------
def test_only_raw_and_checkpoints_of_scans_untouched_long_enough_go(tmp_path):
    old = scan_dir(tmp_path, "old-00000001", 20)
    middle = scan_dir(tmp_path, "middle-0000002", 10)
    fresh = scan_dir(tmp_path, "fresh-00000003", 1)
    report = clean([str(tmp_path)], raw_days=7, checkpoint_days=14)
    gone = {(i["scan_key"], i["kind"]): i for i in report["items"]}
    assert set(gone) == {("old-00000001", "raw"), ("old-00000001", "checkpoints"),
                         ("middle-0000002", "raw")}
    assert gone[("old-00000001", "raw")]["bytes"] == 5000 and report["bytes"] == 5000 + 700 + 5000
    assert not (old / "raw").exists() and not (old / "checkpoints").exists()
    assert (middle / "checkpoints").exists() and (fresh / "raw").exists()
    for d in (old, middle, fresh):  # never a run's output: the product stays
        assert (d / "runs" / "run-1" / "product.h5").read_bytes() == b"p" * 300


def test_a_run_in_flight_a_keep_mark_and_never_keep_their_files(tmp_path):
    busy = scan_dir(tmp_path, "busy-00000001", 30)
    pinned = scan_dir(tmp_path, "pinned-0000002", 30)
    (pinned / ".beamflow-keep").write_text("")
    aged(pinned, 30)
    report = clean([str(tmp_path)], raw_days=7, checkpoint_days=None, keep=["busy-00000001"])
    reasons = {Path(s["path"]).name: s["reason"] for s in report["skipped"]}
    assert reasons == {"busy-00000001": "a run of this scan is in flight",
                       "pinned-0000002": "kept by .beamflow-keep"}
    assert report["items"] == []
    assert (busy / "raw").exists() and (pinned / "raw").exists()


def test_nothing_outside_a_root_nor_a_product_is_touched(tmp_path):
    root = tmp_path / "scratch"
    root.mkdir()
    elsewhere = tmp_path / "precious"
    (elsewhere / "raw").mkdir(parents=True)
    (elsewhere / "raw" / "data.h5").write_bytes(b"d")
    (root / "linked-00000001").symlink_to(elsewhere)  # a scan directory that leads out
    escaping = scan_dir(root, "escape-0000002", 30)
    (escaping / "checkpoints").rename(escaping / "old-checkpoints")
    (escaping / "checkpoints").symlink_to(elsewhere / "raw")  # a target that leads out
    mixed = scan_dir(root, "mixed-00000003", 30)
    (mixed / "raw" / "product.h5").write_bytes(b"p")  # a product where raw data should be
    aged(root, 30)
    report = clean([str(root)], raw_days=1, checkpoint_days=1)
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}
    assert reasons[str(root / "linked-00000001")].startswith("outside its root")
    assert reasons[str(escaping / "checkpoints")].startswith("outside its root")
    assert reasons[str(mixed / "raw")] == "holds a product.h5"
    assert (elsewhere / "raw" / "data.h5").exists() and (mixed / "raw" / "product.h5").exists()
    assert {i["path"] for i in report["items"]} == {str(escaping / "raw"),
                                                     str(mixed / "checkpoints")}
    assert clean(["relative/root"], 1, 1)["skipped"][0]["reason"].startswith("a root must")


def test_a_dry_run_deletes_nothing_and_says_the_same(tmp_path):
    d = scan_dir(tmp_path, "old-00000001", 20)
    dry = clean([str(tmp_path)], raw_days=7, checkpoint_days=7, dry_run=True)
    assert (d / "raw").exists() and dry["dry_run"] is True
    real = clean([str(tmp_path)], raw_days=7, checkpoint_days=7)
    assert [i["path"] for i in dry["items"]] == [i["path"] for i in real["items"]]
    assert dry["bytes"] == real["bytes"] == 5700


# -- configuration --------------------------------------------------------------------------------
def test_retention_config_and_its_errors(tmp_path):
    config = tmp_path / "beamflow.toml"
    config.write_text('[retention]\nraw_days = 3\npreview_days = 30\ncheckpoint_days = '
                      '"never"\n')
    days = load_config(config).retention.days()
    assert days == {"raw": 3, "checkpoints": None, "previews": 30}
    assert load_config(config).retention.days(older_than=0.5)["checkpoints"] is None
    config.write_text('[retention]\nraw_days = 0\n')
    with pytest.raises(ConfigError, match=r"beamflow.toml: retention.raw_days"):
        load_config(config)
    config.write_text('[retention]\nraw_day = 3\n')
    with pytest.raises(ConfigError, match="did you mean retention.raw_days"):
        load_config(config)


# -- the beamline's previews and the run records --------------------------------------------------
@pytest.fixture
def workspace(tmp_path):
    assert CliRunner().invoke(app, ["init", str(tmp_path / "ws")]).exit_code == 0
    return tmp_path / "ws"


def finished_run(settings, store: Store, name: str, days_ago: float,
                 status: RunStatus = RunStatus.SUCCEEDED):
    scan = Path(settings.beamline.detector_dir) / name
    scan.mkdir(parents=True, exist_ok=True)
    run = store.create_run(scan_name=name, scan_path=str(scan.resolve()), flow=FLOW,
                           backend="local", parameters={})
    run_name = f"{name}-{run.id[:8]}"
    results = Path(settings.beamline.preview_dir) / run_name
    (results / "previews").mkdir(parents=True)
    (results / "previews" / "object_phase.png").write_bytes(b"i" * 2000)
    (results / "product.h5").write_bytes(b"p" * 100)
    fields = {"status": status, "result": {"run_name": run_name},
              "previews": [str(results / "previews" / "object_phase.png")]}
    if status.finished:
        fields["finished_at"] = time.time() - days_ago * DAY
    return store.update_run(run.id, **fields), results


def test_old_previews_go_the_product_and_the_record_stay_and_say_so(workspace):
    settings = load_config(workspace / "beamflow.toml")
    store = Store(settings.store_path)
    old, old_dir = finished_run(settings, store, "s1", 40)
    recent, recent_dir = finished_run(settings, store, "s2", 2)
    active, active_dir = finished_run(settings, store, "s3", 0, RunStatus.ACTIVE)
    report = clean_previews(settings, store, 30, dry_run=False)
    assert [i.path for i in report.items] == [str((old_dir / "previews").resolve())]
    assert report.items[0].bytes == 2000
    assert not (old_dir / "previews").exists() and (old_dir / "product.h5").exists()
    assert (recent_dir / "previews").exists() and (active_dir / "previews").exists()
    assert record(store, report) == 1
    run = store.require_run(old.id)
    assert run.previews == [] and run.status == RunStatus.SUCCEEDED
    (cleaned,) = run.result["cleaned"]
    assert cleaned["kind"] == "previews" and cleaned["bytes"] == 2000
    (event,) = [e for e in store.events(old.id) if e.code == "Cleaned"]
    assert "the product stay" in event.message and "2.0 KB" in event.message
    assert in_flight(store) == [scan_key(Path(active.scan_path))]


def test_cluster_items_are_told_to_every_run_of_the_scan(workspace):
    settings = load_config(workspace / "beamflow.toml")
    store = Store(settings.store_path)
    a, _ = finished_run(settings, store, "s1", 10)
    b = store.create_run(scan_name="s1", scan_path=a.scan_path, flow=FLOW, backend="local",
                         parameters={})
    other, _ = finished_run(settings, store, "s2", 10)
    key = scan_key(Path(a.scan_path))
    report = Report(dry_run=False, items=[Item(kind="raw", path=f"/hpc/{key}/raw",
                                               bytes=3 * 10**9, scan_key=key)])
    assert record(store, report) == 2
    for run_id in (a.id, b.id):
        assert store.require_run(run_id).result["cleaned"][0]["kind"] == "raw"
    assert "cleaned" not in store.require_run(other.id).result
    assert record(store, report.model_copy(update={"dry_run": True})) == 0


def test_the_flow_input_keeps_runs_in_flight(workspace):
    settings = load_config(workspace / "beamflow.toml")
    store = Store(settings.store_path)
    active, _ = finished_run(settings, store, "s9", 0, RunStatus.ACTIVE)
    from beamflow.registry import Registry

    Registry(settings.registry_path, "local").record("function", "cleanup", "fid", "x")
    body = flow_input(settings, in_flight(store), dry_run=True, older_than=3)
    assert body["cleanup"] == {"roots": [str(settings.hpc.scratch_dir)], "raw_days": 3,
                               "checkpoint_days": 3, "keep": [scan_key(Path(active.scan_path))],
                               "dry_run": True}
    import jsonschema

    body["compute"]["function_id"] = "44444444-4444-4444-8444-444444444444"
    jsonschema.validate(body, flows.load_schema(FLOW))


# -- the retention flow on the local backend (the Timer imitated) ---------------------------------
@pytest.mark.timeout(240)
def test_cleanup_and_the_agents_pass_run_the_retention_flow_locally(workspace):
    config = str(workspace / "beamflow.toml")
    toml = workspace / "beamflow.toml"
    text = toml.read_text()
    assert 'preview_days = "never"' in text  # what `init` writes
    toml.write_text(text.replace('preview_days = "never"', "preview_days = 60"))
    settings = load_config(toml)
    store = Store(settings.store_path)
    done, done_dir = finished_run(settings, store, "s1", 40)
    busy, _ = finished_run(settings, store, "s2", 0, RunStatus.ACTIVE)
    hpc = Path(settings.hpc.scratch_dir)
    old_key, busy_key = scan_key(Path(done.scan_path)), scan_key(Path(busy.scan_path))
    scan_dir(hpc, old_key, 20)
    scan_dir(hpc, busy_key, 20)
    for what in ("functions", "flows"):
        assert CliRunner().invoke(app, ["register", what, "--config", config]).exit_code == 0
    dry = CliRunner().invoke(app, ["cleanup", "--dry-run", "--config", config])
    assert dry.exit_code == 0, dry.output
    assert "dry run" in dry.output and f"{old_key}/raw" in dry.output
    assert "would free 5.7 KB" in dry.output and busy_key in dry.output  # kept: in flight
    assert (hpc / old_key / "raw").exists()
    result = CliRunner().invoke(app, ["cleanup", "--json", "--older-than", "30",
                                      "--config", config])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # 30 days for every kind kept a number of days: the 40-day-old previews go (60 days
    # by the configuration); the scan, untouched for 20 days, stays.
    assert [i["kind"] for i in report["items"]] == ["previews"]
    result = CliRunner().invoke(app, ["cleanup", "--config", config])
    assert result.exit_code == 0, result.output
    assert "freed 5.7 KB" in result.output and "run record(s) say so" in result.output
    assert not (hpc / old_key / "raw").exists() and (hpc / busy_key / "raw").exists()
    assert (hpc / old_key / "runs" / "run-1" / "product.h5").exists()
    kinds = [c["kind"] for c in store.require_run(done.id).result["cleaned"]]
    assert sorted(kinds) == ["checkpoints", "previews", "raw"]
    # The agent's pass: the same flow, started and followed without blocking.
    scan_dir(hpc, "later-00000009", 20)
    from beamflow.run_backends import get_run_backend

    backend = get_run_backend(settings)
    try:
        now = [0.0]
        agent_pass = RetentionPass(settings, store, backend, clock=lambda: now[0])
        agent_pass.tick()
        assert agent_pass.running is not None
        deadline = time.monotonic() + 120
        while agent_pass.running is not None and time.monotonic() < deadline:
            time.sleep(0.2)
            agent_pass.tick()
        assert agent_pass.running is None and not (hpc / "later-00000009" / "raw").exists()
        assert agent_pass.due_time() == settings.retention.every_hours * 3600
        agent_pass.tick()  # not due again yet: nothing started
        assert agent_pass.running is None
    finally:
        backend.close()
    assert done_dir.exists() and (done_dir / "product.h5").exists()
