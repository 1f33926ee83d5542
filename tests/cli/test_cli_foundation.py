"""CLI: init writes a working workspace; runs list/show; exit codes 0/1/2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.config import load_config
from beamflow.runs.records import RunStatus
from beamflow.runs.store import Store

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


# -- a person's habits -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command",
    [["runs", "list"], ["runs", "start", "scan.h5"], ["agent", "--once"], ["serve"],
     ["register", "functions"], ["login"], ["whoami"]],
)
def test_without_a_workspace_state_is_refused_not_created_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, command)
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: no beamflow.toml here ({tmp_path}) nor in ")
    assert f"will not create {tmp_path / 'state'}" in line and "beamflow init DIR" in line
    assert list(tmp_path.iterdir()) == []


def test_the_users_config_is_named_when_it_is_the_one_used(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = Path.home() / ".config" / "beamflow" / "beamflow.toml"
    user.parent.mkdir(parents=True)
    user.write_text((workspace / "beamflow.toml").read_text().replace(
        'state_dir = "state"', f'state_dir = "{workspace / "state"}"'))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    try:
        result = runner.invoke(app, ["runs", "list", "--json"])
    finally:
        user.unlink()
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == f"config: {user}"
    assert json.loads(result.stdout) == [] and list(elsewhere.iterdir()) == []
    # In the workspace itself, nothing to say.
    monkeypatch.chdir(workspace)
    result = runner.invoke(app, ["runs", "list", "--json"])
    assert result.exit_code == 0 and result.stderr == ""


def test_doctor_without_a_beamflow_toml_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 1
    first = result.stdout.splitlines()[0]
    assert first.startswith("FAIL  config: no beamflow.toml found"), result.stdout
    assert list(tmp_path.iterdir()) == []


def test_top_level_help_gives_whole_summaries(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.main import get_command

    from beamflow.cli.common import summary

    monkeypatch.setenv("COLUMNS", "80")
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    text = result.stdout
    commands = text.split("Commands:\n", 1)[1]
    assert "..." not in commands and "…" not in commands
    flat = " ".join(commands.split())
    group = get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        assert f"{name} {summary(command)}" in flat, name
    assert "Log in to Globus: prints a URL, reads the code back." in flat
    assert max(len(line) for line in text.splitlines()) <= 80
    runs_help = runner.invoke(app, ["runs", "--help"]).stdout.split("Commands:\n", 1)[1]
    assert "..." not in runs_help
    assert ("start Start one flow run of SCAN through the configured backend and record it."
            in " ".join(runs_help.split()))


def test_waiting_for_a_run_outside_a_terminal_prints_its_progress(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from beamflow.cli.common import RunProgress

    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run(scan_name="s1", scan_path="/beamline/s1", flow="ptycho_reconstruct",
                           backend="local")
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    seen = [
        run.model_copy(update={"status": RunStatus.ACTIVE, "current_step": "TransferScanToHPC"}),
        run.model_copy(update={"status": RunStatus.ACTIVE, "current_step": "Reconstruct",
                               "iteration": 0, "iterations_total": 100}),
        *[run.model_copy(update={"status": RunStatus.ACTIVE, "current_step": "Reconstruct",
                                 "iteration": i, "iterations_total": 100}) for i in range(1, 40)],
        run.model_copy(update={"status": RunStatus.SUCCEEDED, "current_step": None,
                               "iteration": 100, "iterations_total": 100}),
    ]
    with RunProgress(run, console) as progress:
        for state in seen:
            progress.update(state)
    lines = [line.rsplit(" (", 1)[0] for line in out.getvalue().splitlines()]
    assert lines == [
        "s1: TransferScanToHPC",
        "s1: Reconstruct, iteration 0/100",
        "s1: Reconstruct, iteration 10/100",
        "s1: Reconstruct, iteration 20/100",
        "s1: Reconstruct, iteration 30/100",
        "s1: SUCCEEDED, iteration 100/100",
    ]
    # Nothing changing: still a line every heartbeat, so waiting is never silent.
    progress = RunProgress(run, console)
    progress.heartbeat = 0.0
    out.truncate(0)
    out.seek(0)
    progress.update(seen[1])
    progress.update(seen[1])
    assert len(out.getvalue().splitlines()) == 2
