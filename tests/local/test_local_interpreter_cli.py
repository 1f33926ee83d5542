"""`beamflow flows validate` and `beamflow flows run`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from beamflow.cli import app

runner = CliRunner()

GREETING = {
    "StartAt": "Greet",
    "States": {
        "Greet": {
            "Type": "ExpressionEval",
            "Parameters": {"msg.=": "'hello ' + name", "run.$": "$._context.run_id"},
            "ResultPath": "$.greeting",
            "Next": "Check",
        },
        "Check": {
            "Type": "Choice",
            "Choices": [{"Variable": "$.name", "StringEquals": "error", "Next": "Boom"}],
            "Default": "Pause",
        },
        "Pause": {"Type": "Wait", "Seconds": 2, "End": True},
        "Boom": {"Type": "Fail", "Error": "Asked", "Cause": "name was error"},
    },
}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # no beamflow.toml around
    return tmp_path


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_validate_a_valid_definition(workdir):
    result = runner.invoke(app, ["flows", "validate", str(write(workdir / "g.json", GREETING))])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "valid"


def test_validate_prints_every_reason_one_per_line_and_exits_1(workdir):
    bad = json.loads(json.dumps(GREETING))
    bad["States"]["Pause"]["Type"] = "Parallel"
    bad["States"]["Greet"]["Next"] = "Nowhere"
    result = runner.invoke(app, ["flows", "validate", str(write(workdir / "b.json", bad))])
    assert result.exit_code == 1
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    assert any("'Pause'" in line and "'Parallel'" in line for line in lines)
    assert any("'Greet'" in line and "'Nowhere'" in line for line in lines)


def test_validate_names_the_file_when_it_is_not_json(workdir):
    path = workdir / "broken.json"
    path.write_text("{ not json")
    result = runner.invoke(app, ["flows", "validate", str(path)])
    assert result.exit_code == 1
    assert "broken.json" in result.output and "not valid JSON" in result.output


def test_run_prints_status_and_output_as_json(workdir):
    path = write(workdir / "g.json", GREETING)
    result = runner.invoke(
        app,
        [
            "flows",
            "run",
            str(path),
            "--input",
            '{"name": "ada"}',
            "--json",
            "--time-scale",
            "0.001",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "SUCCEEDED"
    assert doc["output"]["greeting"]["msg"] == "hello ada"
    assert doc["output"]["greeting"]["run"] == doc["run_id"]
    assert [e["code"] for e in doc["log"]][-1] == "FlowSucceeded"


def test_run_reads_input_from_a_file_and_reports_failure_with_exit_1(workdir):
    path = write(workdir / "g.json", GREETING)
    write(workdir / "in.json", {"name": "error"})
    result = runner.invoke(app, ["flows", "run", str(path), "--input", "@in.json"])
    assert result.exit_code == 1
    assert "FAILED" in result.stdout
    assert "Boom: Asked: name was error" in result.stdout


def test_run_checks_the_input_against_the_sibling_schema(workdir):
    path = write(workdir / "g.json", GREETING)
    write(
        workdir / "g.schema.json",
        {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
    )
    result = runner.invoke(app, ["flows", "run", str(path), "--input", '{"name": 3}'])
    assert result.exit_code == 1
    assert "input.name: 3 is not of type 'string'" in result.output


def test_run_refuses_bad_input_json(workdir):
    path = write(workdir / "g.json", GREETING)
    result = runner.invoke(app, ["flows", "run", str(path), "--input", "{name: x}"])
    assert result.exit_code == 1
    assert "--input is not valid JSON" in result.output


def test_run_names_the_action_url_that_has_no_provider(workdir):
    definition = {
        "StartAt": "A",
        "States": {
            "A": {
                "Type": "Action",
                "ActionUrl": "https://actions.example.org/nothing",
                "Parameters": {},
                "ResultPath": "$.a",
                "End": True,
            }
        },
    }
    result = runner.invoke(app, ["flows", "run", str(write(workdir / "a.json", definition))])
    assert result.exit_code == 1
    assert "https://actions.example.org/nothing" in result.output


def test_run_refuses_an_invalid_definition_with_the_reasons(workdir):
    bad = {"StartAt": "X", "States": {"X": {"Type": "Map", "End": True}}}
    result = runner.invoke(app, ["flows", "run", str(write(workdir / "m.json", bad))])
    assert result.exit_code == 1
    assert "'Map'" in result.output


TRANSFER_URL = "https://transfer.actions.globus.org/transfer"


def transfer_definition(workdir: Path) -> Path:
    """A flow that copies beamline/scan.txt to the HPC collection of `beamflow init`'s
    workspace (its collection ids)."""
    from beamflow.config import load_config

    settings = load_config(workdir / "ws" / "beamflow.toml")
    definition = {
        "StartAt": "Copy",
        "States": {
            "Copy": {
                "Type": "Action",
                "ActionUrl": TRANSFER_URL,
                "Parameters": {
                    "source_endpoint": settings.beamline.collection_id,
                    "destination_endpoint": settings.hpc.collection_id,
                    "DATA": [{"source_path": "/scan.txt", "destination_path": "/scan.txt"}],
                },
                "ResultPath": "$.copy",
                "End": True,
            }
        },
    }
    return write(workdir / "copy.json", definition)


def test_run_moves_data_with_the_workspace_providers_and_closes_them(workdir, monkeypatch):
    from beamflow.local import flowtool

    assert runner.invoke(app, ["init", "ws"]).exit_code == 0
    (workdir / "ws/beamline/scan.txt").write_text("frames")
    closed = []
    real = flowtool.providers_for

    def spied(settings):  # noqa: ANN001, ANN202
        providers = real(settings)
        for p in providers.values():
            monkeypatch.setattr(p, "close", lambda p=p, c=p.close: (closed.append(p.url), c()))
        return providers

    monkeypatch.setattr(flowtool, "providers_for", spied)
    result = runner.invoke(app, ["flows", "run", str(transfer_definition(workdir)), "--json",
                                 "--time-scale", "0.01", "--config", "ws/beamflow.toml"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "SUCCEEDED"
    assert (workdir / "ws/hpc/scan.txt").read_text() == "frames"
    assert len(closed) == 2 and TRANSFER_URL in closed


def test_run_says_why_there_is_no_provider_when_the_config_does_not_load(workdir):
    assert runner.invoke(app, ["init", "ws"]).exit_code == 0
    path = transfer_definition(workdir)
    broken = workdir / "broken.toml"
    broken.write_text('backend = "local"\n[reconstruction]\niterations = "many"\n')
    result = runner.invoke(app, ["flows", "run", str(path), "--config", str(broken)])
    assert result.exit_code == 1
    assert f"no local action provider for {TRANSFER_URL}" in result.output
    assert "the configuration did not load" in result.output and "broken.toml" in result.output
