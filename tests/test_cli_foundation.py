"""CLI: init writes a working workspace; runs list/show; exit codes 0/1/2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.config import load_config
from beamflow.store import Store

runner = CliRunner()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    result = runner.invoke(app, ["init", str(tmp_path / "ws")])
    assert result.exit_code == 0, result.output
    return tmp_path / "ws"


def test_init_writes_a_complete_local_workspace(workspace: Path) -> None:
    for sub in ("beamflow.toml", "beamline/detector", "beamline/previews", "hpc", "state"):
        assert (workspace / sub).exists(), sub
    settings = load_config(workspace / "beamflow.toml")
    assert settings.beamline.detector_dir == (workspace / "beamline/detector").resolve()


def test_init_refuses_to_overwrite(workspace: Path) -> None:
    result = runner.invoke(app, ["init", str(workspace)])
    assert result.exit_code == 1
    assert "exists already" in result.output


def test_init_globus_writes_a_template(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", str(tmp_path / "g"), "--backend", "globus"])
    assert result.exit_code == 0
    assert "FILL" in (tmp_path / "g" / "beamflow.toml").read_text()


def test_bad_backend_is_a_usage_error(tmp_path: Path) -> None:
    assert runner.invoke(app, ["init", str(tmp_path / "x"), "--backend", "aws"]).exit_code == 2


def test_runs_list_json_and_show(workspace: Path) -> None:
    config = str(workspace / "beamflow.toml")
    store = Store(load_config(workspace / "beamflow.toml").store_path)
    run = store.create_run(scan_name="scan_7", scan_path="/data/scan_7",
                           flow="ptycho_reconstruct", backend="local")
    store.update_run(run.id, status="FAILED", error="frame/position mismatch", error_step="Load")

    result = runner.invoke(app, ["runs", "list", "--json", "--config", config])
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)
    assert [r["id"] for r in runs] == [run.id]
    for key in ("id", "scan_name", "scan_path", "status", "error", "created_at", "finished_at",
                "previews"):
        assert key in runs[0]

    result = runner.invoke(app, ["runs", "show", run.id[:8], "--config", config])
    assert result.exit_code == 0
    assert "frame/position mismatch" in result.output

    shown = json.loads(runner.invoke(app, ["runs", "show", run.id, "--json", "-c", config]).stdout)
    assert shown["status"] == "FAILED" and shown["steps"] == []


def test_runs_show_unknown_run_fails_cleanly(workspace: Path) -> None:
    result = runner.invoke(app, ["runs", "show", "nope", "-c", str(workspace / "beamflow.toml")])
    assert result.exit_code == 1
    assert "no run" in result.output and "Traceback" not in result.output


def test_bad_config_fails_with_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "beamflow.toml"
    bad.write_text("[status]\nport = 'eighty'\n")
    result = runner.invoke(app, ["runs", "list", "--config", str(bad)])
    assert result.exit_code == 1
    assert "status.port" in result.output


@pytest.mark.parametrize("command", [[], ["runs"], ["flows"], ["register"], ["init"]])
def test_help_everywhere(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.output


def test_runs_show_refreshes_an_unfinished_run_from_its_backend(workspace: Path) -> None:
    config = str(workspace / "beamflow.toml")
    store = Store(load_config(workspace / "beamflow.toml").store_path)
    run = store.create_run(scan_name="scan_8", scan_path="/data/scan_8",
                           flow="ptycho_reconstruct", backend="local")
    store.update_run(run.id, status="ACTIVE", backend_run_id="no-such-local-run")
    result = runner.invoke(app, ["runs", "show", run.id, "-c", config])
    # The local backend has no record of that run: the run is shown, with the reason it
    # could not be refreshed.
    assert result.exit_code == 0, result.output
    assert "could not refresh" in result.output and "no local run" in result.output
