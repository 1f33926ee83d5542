"""What a new user reads in the terminal: messages printed as written (square brackets in
paths, errors and install hints kept), the verdict of every run (`runs list`, `runs show`),
usage lines that name arguments as they are typed (SCAN), `reconstruct --help` in sections
with its defaults, plain refusals of plain mistakes, and `init`'s next steps."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.cli.workspace import FIRST_STEPS
from beamflow.config import load_config
from beamflow.runs.records import RunStatus
from beamflow.runs.store import Store

runner = CliRunner()
BRACKETED = "[bold]day[red]1[/]"  # rich markup, if anything still read it


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    result = runner.invoke(app, ["init", str(tmp_path / "ws")])
    assert result.exit_code == 0, result.output
    return tmp_path / "ws"


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from beamflow.simulate import simulate_scan

    root = tmp_path_factory.mktemp("detector") / BRACKETED
    return simulate_scan(root, "s1", positions=24, probe_size=16, photons=1e4, seed=3,
                         frames_per_file=12)


def error_lines(text: str) -> list[str]:
    """What stderr says, less the note naming a configuration found elsewhere."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("config: ")]


# -- messages as written -----------------------------------------------------------------------
def test_a_missing_file_in_a_bracketed_directory_is_named_whole(tmp_path: Path) -> None:
    missing = tmp_path / BRACKETED / "nope.cxi"
    (tmp_path / "beamflow.toml").write_text("")
    result = runner.invoke(app, ["reconstruct", str(missing), "--out", str(tmp_path / "out"),
                                 "-c", str(tmp_path / "beamflow.toml")])
    assert result.exit_code == 1
    # The file and the problem, nothing between them (no "/:"), brackets kept.
    assert error_lines(result.stderr) == [f"error: {missing}: no such file or directory"]


def test_the_gpu_install_hint_keeps_its_brackets(
    master: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import beamflow.ptycho.arrays as arrays

    monkeypatch.setattr(arrays, "_import_cupy", lambda: None)  # a machine without CuPy
    (tmp_path / "beamflow.toml").write_text("")
    result = runner.invoke(app, ["reconstruct", str(master), "--out", str(tmp_path / "out"),
                                 "--device", "cuda", "-c", str(tmp_path / "beamflow.toml")])
    assert result.exit_code == 1
    (line,) = error_lines(result.stderr)
    assert "pip install 'beamflow[gpu]' for cupy-cuda12x" in line, line


def test_a_scan_written_in_a_bracketed_directory_is_named_whole(tmp_path: Path) -> None:
    (tmp_path / "beamflow.toml").write_text("")
    out = tmp_path / "det" / BRACKETED
    result = runner.invoke(app, ["simulate", str(out), "--name", "s[2]", "--positions", "12",
                                 "--probe-size", "16", "-c", str(tmp_path / "beamflow.toml")])
    assert result.exit_code == 0, result.output
    assert f"scan written: {out / 's[2]' / 's[2]_master.h5'}" in result.stdout


def test_runs_show_and_list_print_paths_and_errors_as_written(workspace: Path) -> None:
    config = str(workspace / "beamflow.toml")
    store = Store(load_config(workspace / "beamflow.toml").store_path)
    path = f"/data/{BRACKETED}/s1/s1_master.h5"
    run = store.create_run(scan_name="s1", scan_path=path, flow="ptycho_reconstruct",
                           backend="local")
    error = f"{path}: /entry/data/data: [bold]not[/] what [i]was[/i] expected"
    store.update_run(run.id, status="FAILED", error=error, error_step="Reconstruct",
                     error_kind="bad_input")
    shown = runner.invoke(app, ["runs", "show", run.id[:8], "-c", config])
    assert shown.exit_code == 0, shown.output
    assert f"  scan      {path}" in shown.stdout.splitlines()
    assert f"  error     {error}" in shown.stdout.splitlines()
    listed = runner.invoke(app, ["runs", "list", "-c", config])
    assert path in listed.stdout and error in listed.stdout


# -- the verdict -------------------------------------------------------------------------------
REASONS = ["The data look like near-field holograms (R² 0.99), but a far-field model was used: "
           "try --propagation near-field.", "The data misfit did not fall."]


def test_runs_list_and_show_give_each_runs_verdict(workspace: Path) -> None:
    config = str(workspace / "beamflow.toml")
    store = Store(load_config(workspace / "beamflow.toml").store_path)
    made = {}
    for name, verdict in (("s_trusted", "trusted"), ("s_suspect", "suspect"), ("s_none", None)):
        run = store.create_run(scan_name=name, scan_path=f"/data/{name}",
                               flow="ptycho_reconstruct", backend="local")
        made[name] = store.update_run(
            run.id, status=RunStatus.SUCCEEDED if verdict else RunStatus.ACTIVE,
            verdict=verdict, verdict_reasons=REASONS if verdict == "suspect" else [])
    listed = runner.invoke(app, ["runs", "list", "-c", config])
    assert listed.exit_code == 0, listed.output
    header = next(line for line in listed.stdout.splitlines() if "verdict" in line)
    assert header.index("status") < header.index("verdict") < header.index("step")
    rows = {name: next(line for line in listed.stdout.splitlines() if f" {name} " in line)
            for name in made}
    cells = {name: [c.strip() for c in re.split(r"[│┃]", row)] for name, row in rows.items()}
    column = [c.strip() for c in re.split(r"[│┃]", header)].index("verdict")
    assert {n: c[column] for n, c in cells.items()} == {
        "s_trusted": "trusted", "s_suspect": "SUSPECT", "s_none": "-"}

    suspect = runner.invoke(app, ["runs", "show", made["s_suspect"].id, "-c", config])
    lines = suspect.stdout.splitlines()
    assert f"  verdict   SUSPECT: {REASONS[0]}" in lines
    assert f"            {REASONS[1]}" in lines  # the detail view lists every reason
    trusted = runner.invoke(app, ["runs", "show", made["s_trusted"].id, "-c", config])
    assert "  verdict   trusted" in trusted.stdout.splitlines()
    unfinished = runner.invoke(app, ["runs", "show", made["s_none"].id, "-c", config])
    assert "verdict" not in unfinished.stdout
    as_json = json.loads(runner.invoke(app, ["runs", "list", "--json", "-c", config]).stdout)
    assert {r["scan_name"]: r["verdict"] for r in as_json} == {
        "s_trusted": "trusted", "s_suspect": "suspect", "s_none": None}


def test_strict_without_waiting_for_the_verdict_is_refused(tmp_path: Path) -> None:
    ws = tmp_path / "g"
    assert runner.invoke(app, ["init", str(ws), "--backend", "globus"]).exit_code == 0
    result = runner.invoke(app, ["runs", "start", str(ws / "beamline"), "--strict", "-c",
                                 str(ws / "beamflow.toml")])
    assert result.exit_code == 2
    assert error_lines(result.stderr) == [
        "error: --strict needs --wait: the verdict comes when the run has ended"]


# -- usage and help ----------------------------------------------------------------------------
def _commands(command, path=()):  # noqa: ANN001, ANN202
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path, command


@pytest.mark.parametrize("path", [p for p, _ in _commands(get_command(app))],
                         ids=" ".join)
def test_usage_lines_name_arguments_as_they_are_typed(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    usage = result.stdout.splitlines()[0]
    assert usage.startswith(f"Usage: beamflow {' '.join(path)} [OPTIONS]"), usage
    assert "{" not in usage and "}" not in usage, usage
    arguments = usage.split("[OPTIONS]", 1)[1].split()
    assert all(re.fullmatch(r"\[?[A-Z_]+(\.\.\.)?\]?", a) for a in arguments), usage
    if "Arguments:" in result.stdout:  # described by the same names
        described = result.stdout.split("Arguments:\n", 1)[1].split("\n\n", 1)[0]
        for argument in arguments:
            assert f"  {argument.strip('[].')}  " in described, described


def test_reconstruct_help_is_in_sections_with_defaults() -> None:
    text = runner.invoke(app, ["reconstruct", "--help"], terminal_width=100).stdout
    assert text.splitlines()[0] == "Usage: beamflow reconstruct [OPTIONS] SCAN"
    headings = [line[:-1] for line in text.splitlines() if re.fullmatch(r"[A-Z][\w ]+:", line)]
    assert headings == ["Arguments", "Input and geometry", "Algorithm", "Probe", "Output",
                        "Options"]
    sections = dict(zip(headings, re.split(r"\n[A-Z][\w ]+:\n", text)[1:], strict=True))

    def flat(section: str) -> str:
        return " ".join(sections[section].split())

    assert "--propagation" in flat("Input and geometry")
    assert "--position-correction" in flat("Input and geometry")
    assert "--algorithm" in flat("Algorithm") and "--iterations" in flat("Algorithm")
    assert "--probe-modes" in flat("Probe") and "--probe <path>" in flat("Probe")
    assert "--out" in flat("Output") and "--strict" in flat("Output")
    assert "--config" in flat("Options") and "--help" in flat("Options")
    # Where the value comes from when the option is not given.
    assert "[default: config iterations, else 100]" in flat("Algorithm")
    assert "[default: config algorithm, else auto]" in flat("Algorithm")
    assert "[default: config probe_modes, else unset]" in flat("Probe")
    assert "unset: 1, or 2 for a near" in flat("Probe")
    assert "[default: config checkpoint_every, else 10]" in flat("Output")


# -- plain mistakes ----------------------------------------------------------------------------
def test_no_iterations_is_refused_in_one_line(master: Path, tmp_path: Path) -> None:
    (tmp_path / "beamflow.toml").write_text("")
    out = tmp_path / "out"
    result = runner.invoke(app, ["reconstruct", str(master), "--out", str(out), "--iterations",
                                 "0", "-c", str(tmp_path / "beamflow.toml")])
    assert result.exit_code == 2
    assert error_lines(result.stderr) == [
        "error: --iterations 0: at least 1 iteration: 0 would write the blank starting guess "
        "as the product, reconstructing nothing"]
    assert not out.exists()  # nothing written


def test_no_iterations_is_refused_for_runs_and_in_the_config(workspace: Path) -> None:
    config = str(workspace / "beamflow.toml")
    scan = workspace / "beamline" / "detector" / "s1"
    scan.mkdir()
    (scan / "s1_master.h5").write_bytes(b"")  # refused before it is read
    result = runner.invoke(app, ["runs", "start", str(scan), "-p", "iterations=0", "-c", config])
    assert result.exit_code == 1
    assert error_lines(result.stderr) == [
        "error: parameter iterations=0: at least 1 iteration: 0 would write the blank starting "
        "guess as the product, reconstructing nothing"]
    assert Store(load_config(Path(config)).store_path).list_runs() == []
    text = (workspace / "beamflow.toml").read_text()
    (workspace / "beamflow.toml").write_text(text.replace("iterations = 100", "iterations = 0"))
    result = runner.invoke(app, ["runs", "list", "-c", config])
    assert result.exit_code == 1
    assert "reconstruction.iterations: at least 1 iteration" in result.stderr


def test_init_suggests_the_quickstarts_first_steps(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", str(tmp_path / "ws")])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    start = lines.index('  next (docs/quickstart.md, "Step by step"):')
    suggested = [line.split("#")[0].strip() for line in lines[start + 1:]]
    assert suggested == [f"cd {tmp_path / 'ws'}", *(command for command, _ in FIRST_STEPS)]
