"""Runs carry their scan's path, and scans with the same file name in three directories are
told apart everywhere: the store, `runs list/show` (tables and --json), the API, the pages.
Output into a pipe is never cut at 80 columns; neither is `--help`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest
import typer
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.config import load_config
from beamflow.formats import Geometry
from beamflow.formats.eiger import data_file_name, master_path, write_data_file, write_master
from beamflow.runs.lifecycle import create_scan_run
from beamflow.runs.naming import scan_labels
from beamflow.runs.records import RunStatus
from beamflow.runs.request import RunRequest
from beamflow.runs.store import Store
from beamflow.status import StatusOptions, create_app

ROOT = Path(__file__).resolve().parents[2]  # this checkout's beamflow, whatever the cwd
NAME = "demo_scan_001"
LONG_ERROR = (
    "Reconstruct: /very/long/path/to/the/cluster/scratch/beamflow/runs/demo_scan_001-0123abcd/"
    "raw/demo_scan_001/demo_scan_001_data_000007.h5: /entry/data/data: last frame cannot be "
    "read: truncated or corrupt (bitshuffle decompression failed at chunk 41 of 50)"
)


def write_scan(directory: Path) -> Path:
    master = master_path(directory, NAME)
    master.parent.mkdir(parents=True)
    positions = np.stack([np.arange(4) * 2e-7, np.zeros(4)], axis=1)
    write_master(master, geometry=Geometry(energy_eV=8800.0, distance_m=2.0,
                                           detector_pixel_size_m=75e-6),
                 frame_shape=(16, 16), positions_m=positions, frames_per_file=4)
    write_data_file(master.parent / data_file_name(NAME, 1), np.ones((4, 16, 16), np.uint32), 1)
    return master


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Store, dict]:
    """A workspace whose store holds one run of each of three demo_scan_001 scans, in the
    directories day1/, day2/ and the deeper beamtime/day3/; the last run failed with a long
    error."""
    for key in [k for k in os.environ if k.startswith("BEAMFLOW_")]:
        monkeypatch.delenv(key)
    ws = tmp_path / "ws"
    assert CliRunner().invoke(app, ["init", str(ws)]).exit_code == 0
    settings = load_config(ws / "beamflow.toml")
    store = Store(settings.store_path)
    detector = settings.beamline.detector_dir
    runs = {}
    for sub in ("day1", "day2", "beamtime/day3"):
        master = write_scan(detector / sub)
        runs[sub] = create_scan_run(settings, store, RunRequest(scan_path=master))
    runs["beamtime/day3"] = store.update_run(runs["beamtime/day3"].id, status=RunStatus.FAILED,
                                             error=LONG_ERROR, error_step="Reconstruct")
    return ws, store, runs


def cli(ws: Path, *args: str) -> subprocess.CompletedProcess:
    """The real command with its output into a pipe, as a log or `| grep` gets it."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(ws), "COLUMNS": "80",
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "beamflow.cli", *args], cwd=ws, env=env,
                          capture_output=True, text=True, timeout=60)


def test_display_names_are_the_shortest_unique_path_suffix() -> None:
    assert scan_labels("s", ["/d/a/s/s_master.h5"]) == {"/d/a/s/s_master.h5": "s"}
    assert scan_labels("s", ["/d/a/s/s_master.h5", "/d/b/s_master.h5", "/e/a/x/s.cxi"]) == {
        "/d/a/s/s_master.h5": "a/s", "/d/b/s_master.h5": "b/s", "/e/a/x/s.cxi": "x/s"}
    assert scan_labels("s", ["/d/a/s/s_master.h5", "/e/a/s/s_master.h5"]) == {
        "/d/a/s/s_master.h5": "d/a/s", "/e/a/s/s_master.h5": "e/a/s"}


def test_the_store_tells_the_three_scans_apart(workspace) -> None:
    ws, store, runs = workspace
    assert {r.scan_name for r in runs.values()} == {NAME}
    names = store.display_names(store.list_runs())
    assert {names[r.id] for r in runs.values()} == {
        f"day1/{NAME}", f"day2/{NAME}", f"day3/{NAME}"}
    for sub, run in runs.items():
        assert run.scan_path.endswith(f"/detector/{sub}/{NAME}/{NAME}_master.h5")
    # A scan of a new name is just its name; the filter finds a directory.
    assert [r.id for r in store.list_runs(scan="day2/")] == [runs["day2"].id]


def test_runs_list_into_a_pipe_shows_whole_names_paths_and_errors(workspace) -> None:
    ws, store, runs = workspace
    result = cli(ws, "runs", "list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for sub, run in runs.items():
        (row,) = [line for line in lines if run.id[:8] in line]
        assert run.scan_path in row and f"{sub.split('/')[-1]}/{NAME}" in row
    assert any(LONG_ERROR in line for line in lines)  # one line, not cut
    assert "…" not in result.stdout and all(line == line.rstrip() for line in lines)

    listed = json.loads(cli(ws, "runs", "list", "--json").stdout)
    assert {r["scan_path"] for r in listed} == {r.scan_path for r in runs.values()}
    assert {r["display_name"] for r in listed} == {
        f"day1/{NAME}", f"day2/{NAME}", f"day3/{NAME}"}

    day3 = runs["beamtime/day3"]
    shown = cli(ws, "runs", "show", day3.id[:8])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"day3/{NAME}  run {day3.id}"
    assert f"  scan      {day3.scan_path}" in shown.stdout.splitlines()
    assert LONG_ERROR in shown.stdout
    data = json.loads(cli(ws, "runs", "show", day3.id, "--json").stdout)
    assert data["scan_path"] == day3.scan_path and data["display_name"] == f"day3/{NAME}"


def test_api_and_pages_show_path_and_display_name(workspace) -> None:
    ws, store, runs = workspace
    client = TestClient(create_app(store, StatusOptions()), base_url="http://127.0.0.1:8765")
    listed = client.get("/api/runs").json()["runs"]
    assert {(r["display_name"], r["scan_path"]) for r in listed} == {
        (f"{sub.split('/')[-1]}/{NAME}", run.scan_path) for sub, run in runs.items()}
    page = client.get("/").text
    for sub, run in runs.items():
        assert f">{sub.split('/')[-1]}/{NAME}</a>" in page and run.scan_path in page
    day1 = runs["day1"]
    detail = client.get(f"/api/runs/{day1.id}").json()["run"]
    assert detail["display_name"] == f"day1/{NAME}" and detail["scan_path"] == day1.scan_path
    html = client.get(f"/runs/{day1.id}").text
    assert f'<h1 class="scan-title">day1/{NAME}</h1>' in html and day1.scan_path in html
    assert [r["id"] for r in client.get("/api/runs", params={"scan": "day1/"}).json()[
        "runs"]] == [day1.id]


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):  # noqa: ANN202
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def test_help_at_80_columns_keeps_every_option_name_whole(tmp_path: Path) -> None:
    root = typer.main.get_command(app)
    checked = 0
    for path, command in _commands(root):
        result = cli(tmp_path, *path, "--help")
        assert result.returncode == 0, result.stderr
        assert "…" not in result.stdout, path
        words = set(result.stdout.replace(",", " ").split())
        for param in command.params:
            for opt in [*param.opts, *param.secondary_opts]:
                if opt.startswith("-"):
                    assert opt in words, (path, opt)
                    checked += 1
    assert checked > 70  # every command, every option


def test_a_scan_outside_the_beamline_collection_is_refused_before_a_run_is_queued(workspace):
    ws, store, _runs = workspace
    settings = load_config(ws / "beamflow.toml")
    outside = write_scan(ws.parent / "elsewhere")
    before = len(store.list_runs())
    from beamflow.runs.request import RunInputError

    with pytest.raises(RunInputError, match="outside the beamline collection root"):
        create_scan_run(settings, store, RunRequest(scan_path=outside))
    assert len(store.list_runs()) == before


def test_one_scan_has_one_path_however_it_was_named(workspace) -> None:
    """A scan started as its directory, as its master file, through a symbolic link, and
    found by the agent: one scan_path (its master file), one name on the runs page."""
    from edge_agent.scans import find_scans

    ws, store, runs = workspace
    settings = load_config(ws / "beamflow.toml")
    master = Path(runs["day2"].scan_path)
    (settings.beamline.detector_dir / "latest").symlink_to(master.parent)
    (found,) = [p for p in find_scans(settings.beamline.detector_dir) if p.parent.name == NAME
                and p.parent.parent.name == "day2"]
    made = [create_scan_run(settings, store, RunRequest(scan_path=p)) for p in (
        master.parent, master, settings.beamline.detector_dir / "latest", found)]
    assert {r.scan_path for r in made} == {str(master)}
    assert {r.scan_name for r in made} == {NAME}
    names = store.display_names(store.list_runs(limit=None))
    assert {names[r.id] for r in [*made, runs["day2"]]} == {f"day2/{NAME}"}


def test_a_directory_that_is_not_one_scan_is_refused_naming_why(workspace) -> None:
    from beamflow.runs.request import RunInputError

    ws, store, runs = workspace
    settings = load_config(ws / "beamflow.toml")
    before = len(store.list_runs())
    empty = settings.beamline.detector_dir / "empty"
    empty.mkdir()
    with pytest.raises(RunInputError, match=rf"^{empty}: directory holds no \*_master.h5 or "):
        create_scan_run(settings, store, RunRequest(scan_path=empty))
    two = settings.beamline.detector_dir / "day1"
    master = write_scan(two / "other")
    master.rename(two / NAME / "other_master.h5")
    with pytest.raises(RunInputError, match="holds several scans"):
        create_scan_run(settings, store, RunRequest(scan_path=two / NAME))
    assert len(store.list_runs()) == before


def test_a_runs_recorded_directory_and_its_master_file_are_one_scan() -> None:
    """Runs recorded before the master file became every scan's one path name its
    directory: the two are labelled alike, never told apart by full paths."""
    assert scan_labels("s", ["/d/a/s", "/d/a/s/s_master.h5"]) == {
        "/d/a/s": "s", "/d/a/s/s_master.h5": "s"}
    assert scan_labels("s", ["/d/a/s", "/d/a/s/s_master.h5", "/d/b/s/s_master.h5"]) == {
        "/d/a/s": "a/s", "/d/a/s/s_master.h5": "a/s", "/d/b/s/s_master.h5": "b/s"}
