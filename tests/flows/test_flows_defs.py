"""The shipped flow definitions: valid for the service, strict input schemas, and the
behaviour they promise (step and cause recorded on failure, results paths built right)."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from flow_kit import FUNCTION_ID, scan_workspace

import flows
from beamflow.local.actions import ActionStatus, RunContext
from beamflow.local.clock import ManualClock
from beamflow.local.interpreter import FlowRunner
from beamflow.local.validation import (
    ACTION_ERRORS,
    definition_warnings,
    validate_definition,
    validate_input,
)
from beamflow.runs.flow_input import flow_input_for

TRANSFER = "https://transfer.actions.globus.org/transfer"
COMPUTE = "https://compute.actions.globus.org/v3"


@pytest.fixture
def settings(tmp_path: Path):  # noqa: ANN201
    return scan_workspace(tmp_path)


def inputs(settings, flow: str) -> dict[str, Any]:  # noqa: ANN001
    scan = settings.beamline.detector_dir / "s1"
    return flow_input_for(settings, scan, {}, "s1-abcdef12", flow=flow, function_id=FUNCTION_ID)


def test_the_shipped_flows() -> None:
    assert flows.flow_names() == ["ptycho_reconstruct", "ptycho_shared_fs", "retention_cleanup"]
    with pytest.raises(flows.FlowNotFound, match="known: ptycho_reconstruct"):
        flows.load_definition("nope")
    with pytest.raises(flows.FlowNotFound):
        flows.load_schema("../pyproject")


@pytest.mark.parametrize("name", ["ptycho_reconstruct", "ptycho_shared_fs", "retention_cleanup"])
def test_definitions_are_valid_and_every_action_is_guarded(name: str) -> None:
    definition = flows.load_definition(name)
    assert validate_definition(definition) == []
    assert definition_warnings(definition) == []
    actions = {k: s for k, s in definition["States"].items() if s["Type"] == "Action"}
    assert actions
    for state_name, state in actions.items():
        assert state["ActionUrl"] in (TRANSFER, COMPUTE)
        assert state["ResultPath"].startswith("$.")  # never the default "$" (replaces all)
        assert state["WaitTime"] >= 3600, f"{state_name}: WaitTime too short for real scans"
        caught = {e for c in state["Catch"] for e in c["ErrorEquals"]}
        assert caught == set(ACTION_ERRORS), state_name
        # The catch leads to a state that records the step, then a Fail naming it.
        record = definition["States"][state["Catch"][0]["Next"]]
        assert record["Parameters"]["step"] == state_name
        fail = definition["States"][record["Next"]]
        assert fail["Type"] == "Fail" and state_name in fail["Error"]
        assert state_name in fail["Cause"]
        assert set(fail) <= {"Type", "Error", "Cause", "Comment"}  # static: what Globus takes


def test_big_actions_wait_hours() -> None:
    states = flows.load_definition("ptycho_reconstruct")["States"]
    assert states["TransferScanToHPC"]["WaitTime"] >= 6 * 3600
    assert states["Reconstruct"]["WaitTime"] >= 12 * 3600


@pytest.mark.parametrize("name", ["ptycho_reconstruct", "ptycho_shared_fs"])
def test_schemas_are_strict_json_schemas(name: str) -> None:
    schema = flows.load_schema(name)
    jsonschema.Draft7Validator.check_schema(schema)

    def objects(node: Any) -> list[dict[str, Any]]:
        found = []
        if isinstance(node, dict):
            if node.get("type") == "object":
                found.append(node)
            for value in node.values():
                found += objects(value)
        elif isinstance(node, list):
            for value in node:
                found += objects(value)
        return found

    for obj in objects(schema):
        assert obj["additionalProperties"] is False
        # The endpoint's template variables are all optional ({}: the template's defaults).
        assert obj["required"] or obj.get("title") == "Endpoint template variables", obj


@pytest.mark.parametrize("name", ["ptycho_reconstruct", "ptycho_shared_fs"])
def test_the_input_beamflow_builds_is_accepted(settings, name: str) -> None:  # noqa: ANN001
    assert validate_input(inputs(settings, name), flows.load_schema(name)) == []


def _set(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(body)
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return body


class _Deleted:
    """The key is removed. Its repr names it in the test ids, the same in every process
    (the parallel workers must collect the same ids)."""

    def __repr__(self) -> str:
        return "<deleted>"


_DELETE = _Deleted()
BAD = [
    ("surprise", "extra top-level key"),
    ("beamline.surprise", "extra nested key"),
    ("reconstruction.colour", "unknown parameter"),
    ("beamline.collection_id", "not-a-uuid"),
    ("compute.function_id", "1234"),
    ("beamline.scan_path", "detector/s1"),  # relative
    ("hpc.scan_path", "/raw/../../etc"),  # climbs out
    ("compute.output_dir", "/x/.."),
    ("compute.allowed_roots", []),
    ("reconstruction.algorithm", "magic"),
    ("reconstruction.iterations", -1),
    ("reconstruction.device", "tpu"),
    ("reconstruction.probe_modes", 65),
    ("reconstruction.batch", 8),  # the old name of batch_size
    ("reconstruction.noise_model", "magic"),
    ("reconstruction.position_correction", "yes"),
    ("run_name", "a/b"),
    ("run_name", ""),
    ("raw_is_directory", "yes"),
    ("run_name", _DELETE),
    ("compute", _DELETE),
    ("reconstruction.iterations", _DELETE),
]


@pytest.mark.parametrize(("path", "value"), BAD, ids=[f"{p}={v!r}" for p, v in BAD])
def test_bad_inputs_are_rejected(settings, path: str, value: Any) -> None:  # noqa: ANN001
    body = _set(inputs(settings, "ptycho_reconstruct"), path, value)
    problems = validate_input(body, flows.load_schema("ptycho_reconstruct"))
    assert problems, f"{path}={value!r} was accepted"


class Recorder:
    """A provider that records bodies and ends each action as scripted."""

    def __init__(self, outcome: str = "SUCCEEDED", details: Any = None) -> None:
        self.outcome = outcome
        self.details = details if details is not None else {}
        self.bodies: list[dict[str, Any]] = []

    def start(self, body: dict[str, Any], context: RunContext) -> ActionStatus:
        self.bodies.append(body)
        return ActionStatus(action_id=str(uuid.uuid4()), status=self.outcome, details=self.details)

    def status(self, action_id: str) -> ActionStatus:  # pragma: no cover - never ACTIVE
        raise AssertionError

    def cancel(self, action_id: str) -> ActionStatus:  # pragma: no cover
        raise AssertionError


def run_flow(settings, transfer: Recorder, compute: Recorder):  # noqa: ANN001, ANN201
    runner = FlowRunner(
        flows.load_definition("ptycho_reconstruct"),
        {TRANSFER: transfer, COMPUTE: compute},
        input_schema=flows.load_schema("ptycho_reconstruct"),
        clock=ManualClock(),
    )
    return runner.run(inputs(settings, "ptycho_reconstruct"))


def test_the_flow_moves_the_scan_and_the_results(settings) -> None:  # noqa: ANN001
    transfer, compute = Recorder(), Recorder(details={"result": [{"iterations": 5}]})
    result = run_flow(settings, transfer, compute)
    assert result.status == "SUCCEEDED", result.error
    body = inputs(settings, "ptycho_reconstruct")
    raw, back = transfer.bodies
    assert raw["source_endpoint"] == body["beamline"]["collection_id"]
    assert raw["destination_endpoint"] == body["hpc"]["collection_id"]
    assert raw["DATA"] == [
        {
            "source_path": "/detector/s1",
            "destination_path": body["hpc"]["raw_path"],
            "recursive": True,
        }
    ]
    assert raw["verify_checksum"] is True and raw["label"] == "beamflow s1-abcdef12 scan to HPC"
    assert len(raw["label"]) <= 128
    assert back["source_endpoint"] == body["hpc"]["collection_id"]
    results = body["beamline"]["results_path"]
    assert results == "/previews/s1-abcdef12"
    assert [(d["destination_path"], d["recursive"]) for d in back["DATA"]] == [
        (results + "/product.h5", False),
        (results + "/previews", True),
    ]
    task = compute.bodies[0]["tasks"][0]
    assert task["function_id"] == FUNCTION_ID
    assert task["kwargs"]["parameters"] == body["reconstruction"]
    assert task["kwargs"]["scan_path"] == body["compute"]["scan_path"]
    assert result.output["reconstruct"]["details"]["result"] == [{"iterations": 5}]


def test_a_failed_step_is_named_with_its_cause(settings) -> None:  # noqa: ANN001
    error = {"type": "ValueError", "message": "scan s1: no positions"}
    transfer = Recorder()
    compute = Recorder("FAILED", details={"error": error})
    result = run_flow(settings, transfer, compute)
    assert result.status == "FAILED"
    assert result.error["Error"] == "ReconstructFailed"
    failure = result.output["failure"]
    assert failure["step"] == "Reconstruct"
    assert failure["error"]["Error"] == "ActionFailedException"
    assert json.loads(failure["error"]["Cause"])["details"]["error"] == error
    assert len(transfer.bodies) == 1  # results were not transferred


@pytest.mark.parametrize("name", ["ptycho_reconstruct", "ptycho_shared_fs"])
def test_the_function_gets_each_input_by_its_own_name(name: str) -> None:
    """One name per meaning from the agent to the function: the compute step passes the
    function its every argument, each from the input's key of the same name."""
    import inspect

    from functions.reconstruct import reconstruct

    (task,) = flows.load_definition(name)["States"]["Reconstruct"]["Parameters"]["tasks"]
    kwargs = {key.removesuffix(".$"): path for key, path in task["kwargs"].items()}
    assert set(kwargs) == set(inspect.signature(reconstruct).parameters)
    renamed = {"run_name": "$.run_name", "parameters": "$.reconstruction"}
    assert kwargs == {key: renamed.get(key, f"$.compute.{key}") for key in kwargs}


# -- the inputs beamflow builds (beamflow.runs.flow_input) ---------------------------------------
def test_flow_input_maps_local_paths_to_collection_paths(settings, tmp_path: Path) -> None:  # noqa: ANN001
    from beamflow.runs.request import RunInputError, parse_param

    master = settings.beamline.detector_dir / "s1" / "s1_master.h5"
    body = flow_input_for(settings, master, {}, "r1", function_id=FUNCTION_ID)
    # A master file moves with its directory (the data files sit next to it).
    assert body["raw_is_directory"] is True
    assert body["beamline"]["raw_path"] == "/detector/s1"
    assert body["hpc"]["raw_path"].endswith("/raw/s1")
    hpc_root = str(settings.hpc.collection_root)
    # The function reads the scan's file in the copy, by the one name scan_path.
    assert body["compute"]["scan_path"] == hpc_root + body["hpc"]["raw_path"] + "/s1_master.h5"
    assert body["compute"]["output_dir"] == hpc_root + body["hpc"]["results_path"]
    assert body["compute"]["allowed_roots"] == [str(settings.hpc.scratch_dir)]
    # Runs of one scan share its checkpoints; each has its own results.
    other = flow_input_for(settings, master, {}, "r2", function_id=FUNCTION_ID)
    assert other["compute"]["checkpoint_dir"] == body["compute"]["checkpoint_dir"]
    assert other["compute"]["output_dir"] != body["compute"]["output_dir"]

    cxi = settings.beamline.detector_dir / "one.cxi"
    cxi.write_bytes(b"")
    single = flow_input_for(settings, cxi, {}, "r3", function_id=FUNCTION_ID)
    assert single["raw_is_directory"] is False
    assert single["hpc"]["raw_path"].endswith("/raw/one.cxi")
    assert single["compute"]["scan_path"] == hpc_root + single["hpc"]["raw_path"]

    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    with pytest.raises(RunInputError, match="outside the beamline collection root"):
        flow_input_for(settings, outside, {}, "r4", function_id=FUNCTION_ID)
    with pytest.raises(RunInputError, match="register functions"):
        flow_input_for(settings, master, {}, "r5")
    with pytest.raises(RunInputError, match="unknown parameter 'colour'"):
        flow_input_for(settings, master, {"colour": 1}, "r6", function_id=FUNCTION_ID)
    with pytest.raises(RunInputError, match="iterations"):
        flow_input_for(settings, master, {"iterations": -1}, "r7", function_id=FUNCTION_ID)

    assert parse_param("iterations=50") == ("iterations", 50)
    assert parse_param("resume=false") == ("resume", False)
    assert parse_param("device=cuda") == ("device", "cuda")
    with pytest.raises(RunInputError, match="KEY=VALUE"):
        parse_param("iterations")
