"""Rejection of every kind of invalid flow definition, each with the state and the reason."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from beamflow.local.interpreter import FlowRunner
from beamflow.local.validation import (
    FlowDefinitionError,
    definition_warnings,
    validate_definition,
    validate_input,
)

URL = "https://transfer.actions.globus.org/transfer"

GOOD: dict[str, Any] = {
    "Comment": "transfer, decide, finish",
    "StartAt": "Transfer",
    "States": {
        "Transfer": {
            "Type": "Action",
            "ActionUrl": URL,
            "Parameters": {
                "source_endpoint.$": "$.src",
                "DATA": [{"source_path.$": "$.path", "destination_path.=": "'/x/' + name"}],
            },
            "ResultPath": "$.TransferResult",
            "WaitTime": 600,
            "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Failed", "ResultPath": "$.err"}],
            "Next": "Check",
        },
        "Check": {
            "Type": "Choice",
            "Choices": [
                {
                    "And": [
                        {"Variable": "$.TransferResult.status", "StringEquals": "SUCCEEDED"},
                        {"Not": {"Variable": "$.skip", "IsPresent": True}},
                    ],
                    "Next": "Pause",
                }
            ],
            "Default": "Failed",
        },
        "Pause": {"Type": "Wait", "Seconds": 1, "Next": "Done"},
        "Done": {
            "Type": "ExpressionEval",
            "Parameters": {"msg.=": "'ok ' + _context.run_id"},
            "ResultPath": "$.done",
            "End": True,
        },
        "Failed": {"Type": "Fail", "Error": "TransferFailed", "CausePath": "$.err.Cause"},
    },
}


def test_a_well_formed_definition_has_no_problems():
    assert validate_definition(GOOD) == []
    assert definition_warnings(GOOD) == []


def mutate(path: str, value: Any = None, *, delete: bool = False) -> dict[str, Any]:
    """GOOD with one change; ``path`` like 'States/Transfer/Next'."""
    definition = copy.deepcopy(GOOD)
    *parents, last = path.split("/")
    node = definition
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if delete:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return definition


INVALID = [
    # (description, definition, words the problem must contain)
    ("no StartAt", mutate("StartAt", delete=True), ["StartAt is required"]),
    ("StartAt names nothing", mutate("StartAt", "Nope"), ["StartAt", "'Nope'"]),
    ("no States", mutate("States", delete=True), ["States is required"]),
    ("unknown top-level field", mutate("Version", "1.0"), ["'Version'"]),
    ("Task type", mutate("States/Pause/Type", "Task"), ["'Pause'", "'Task'", "not supported"]),
    ("Parallel type", mutate("States/Pause/Type", "Parallel"), ["'Pause'", "'Parallel'"]),
    ("Map type", mutate("States/Pause/Type", "Map"), ["'Pause'", "'Map'"]),
    ("Succeed type", mutate("States/Pause/Type", "Succeed"), ["'Pause'", "'Succeed'"]),
    ("made-up type", mutate("States/Pause/Type", "Sleep"), ["'Pause'", "unknown state type"]),
    ("no type", mutate("States/Pause/Type", delete=True), ["'Pause'", "Type is required"]),
    ("Retry field", mutate("States/Transfer/Retry", []), ["'Transfer'", "'Retry'"]),
    ("OutputPath", mutate("States/Done/OutputPath", "$.x"), ["'Done'", "'OutputPath'"]),
    ("ResultSelector", mutate("States/Transfer/ResultSelector", {}), ["'ResultSelector'"]),
    ("InputPath on ExpressionEval", mutate("States/Done/InputPath", "$"), ["'Done'", "InputPath"]),
    ("Next and End", mutate("States/Pause/End", True), ["'Pause'", "both Next"]),
    (
        "neither Next nor End",
        mutate("States/Pause/Next", delete=True),
        ["'Pause'", "either terminal", "transitional"],
    ),
    ("End false, no Next", mutate("States/Done/End", False), ["'Done'", "either terminal"]),
    ("dangling Next", mutate("States/Pause/Next", "Gone"), ["'Pause'", "'Gone'"]),
    ("dangling Default", mutate("States/Check/Default", "Gone"), ["'Check'", "Default", "'Gone'"]),
    (
        "dangling choice Next",
        mutate("States/Check/Choices/0/Next", "Gone"),
        ["'Check'", "Choices[0]", "'Gone'"],
    ),
    (
        "dangling Catch Next",
        mutate("States/Transfer/Catch/0/Next", "Gone"),
        ["'Transfer'", "Catch[0]", "'Gone'"],
    ),
    ("Action without ActionUrl", mutate("States/Transfer/ActionUrl", delete=True), ["ActionUrl"]),
    ("ActionUrl not a URL", mutate("States/Transfer/ActionUrl", "transfer"), ["http(s) URL"]),
    (
        "Action with Parameters and InputPath",
        mutate("States/Transfer/InputPath", "$.body"),
        ["'Transfer'", "mutually exclusive"],
    ),
    (
        "Action with neither Parameters nor InputPath",
        mutate("States/Transfer/Parameters", delete=True),
        ["'Transfer'", "Parameters or InputPath"],
    ),
    ("WaitTime not positive", mutate("States/Transfer/WaitTime", 0), ["'Transfer'", "WaitTime"]),
    (
        "ExceptionOnActionFailure not boolean",
        mutate("States/Transfer/ExceptionOnActionFailure", "yes"),
        ["ExceptionOnActionFailure"],
    ),
    ("Wait with nothing", mutate("States/Pause/Seconds", delete=True), ["'Pause'", "exactly one"]),
    (
        "Wait with two",
        mutate("States/Pause/SecondsPath", "$.s"),
        ["'Pause'", "exactly one", "Seconds, SecondsPath"],
    ),
    ("Wait Seconds negative", mutate("States/Pause/Seconds", -1), ["'Pause'", "Seconds"]),
    (
        "Wait bad Timestamp",
        mutate("States/Pause", {"Type": "Wait", "Timestamp": "tomorrow", "Next": "Done"}),
        ["'Pause'", "Timestamp", "RFC 3339"],
    ),
    (
        "bad JSONPath in .$",
        mutate("States/Transfer/Parameters/source_endpoint.$", "src"),
        ["'Transfer'", "source_endpoint.$", "must start with '$'"],
    ),
    (
        "bad JSONPath in a list item",
        mutate("States/Transfer/Parameters/DATA/0/source_path.$", "$.path[*]"),
        ["'Transfer'", "DATA[0]", "wildcards"],
    ),
    (
        "bad expression",
        mutate("States/Transfer/Parameters/DATA/0/destination_path.=", "'/x/' +"),
        ["'Transfer'", "destination_path.=", "syntax error"],
    ),
    (
        "malicious expression",
        mutate("States/Done/Parameters/msg.=", "__import__('os').system('rm -rf /')"),
        ["'Done'", "double-underscore"],
    ),
    ("bad ResultPath", mutate("States/Done/ResultPath", "done"), ["'Done'", "ResultPath"]),
    (
        "ResultPath into _context",
        mutate("States/Done/ResultPath", "$._context.x"),
        ["'Done'", "read-only"],
    ),
    ("bad Variable", mutate("States/Check/Choices/0/And/0/Variable", "$..status"), ["recursive"]),
    (
        "bad *Path operator",
        mutate("States/Check/Choices/0/And/0", {"Variable": "$.a", "StringEqualsPath": "b"}),
        ["'Check'", "StringEqualsPath"],
    ),
    (
        "two operators in one rule",
        mutate(
            "States/Check/Choices/0/And/0",
            {"Variable": "$.a", "StringEquals": "x", "IsPresent": True},
        ),
        ["'Check'", "exactly one comparison operator"],
    ),
    (
        "unknown operator",
        mutate("States/Check/Choices/0/And/0", {"Variable": "$.a", "StringContains": "x"}),
        ["'Check'", "'StringContains'"],
    ),
    (
        "wrong operand type",
        mutate("States/Check/Choices/0/And/0", {"Variable": "$.a", "NumericEquals": "5"}),
        ["'Check'", "NumericEquals needs a number"],
    ),
    (
        "bad timestamp operand",
        mutate("States/Check/Choices/0/And/0", {"Variable": "$.a", "TimestampEquals": "today"}),
        ["'Check'", "RFC 3339"],
    ),
    (
        "nested rule with Next",
        mutate("States/Check/Choices/0/And/0/Next", "Done"),
        ["'Check'", "nested choice rules may not have Next"],
    ),
    (
        "top rule without Next",
        mutate("States/Check/Choices/0/Next", delete=True),
        ["'Check'", "needs Next"],
    ),
    ("empty And", mutate("States/Check/Choices/0/And", []), ["'Check'", "And must be"]),
    ("Choice without Choices", mutate("States/Check/Choices", delete=True), ["'Check'", "Choices"]),
    ("Choice with Next", mutate("States/Check/Next", "Done"), ["'Check'", "'Next'"]),
    (
        "Catch without ErrorEquals",
        mutate("States/Transfer/Catch/0/ErrorEquals", delete=True),
        ["'Transfer'", "Catch[0]", "ErrorEquals is required"],
    ),
    (
        "Catch with empty ErrorEquals",
        mutate("States/Transfer/Catch/0/ErrorEquals", []),
        ["'Transfer'", "non-empty list"],
    ),
    (
        "Catch without Next",
        mutate("States/Transfer/Catch/0/Next", delete=True),
        ["'Transfer'", "Next is required"],
    ),
    (
        "States.ALL not alone",
        mutate("States/Transfer/Catch/0/ErrorEquals", ["States.ALL", "ActionTimeout"]),
        ["'Transfer'", "States.ALL must be alone"],
    ),
    (
        "Catch bad ResultPath",
        mutate("States/Transfer/Catch/0/ResultPath", "err"),
        ["'Transfer'", "Catch[0]", "ResultPath"],
    ),
    ("Catch on a Pass", mutate("States/Done/Catch", []), ["'Done'", "'Catch'"]),
    (
        "Fail with Cause and CausePath",
        mutate("States/Failed/Cause", "x"),
        ["'Failed'", "mutually exclusive"],
    ),
    ("Fail with Next", mutate("States/Failed/Next", "Done"), ["'Failed'", "'Next'"]),
]


@pytest.mark.parametrize(("what", "definition", "words"), INVALID, ids=[i[0] for i in INVALID])
def test_invalid_definitions_are_rejected_with_state_and_reason(what, definition, words):
    problems = validate_definition(definition)
    assert problems, f"{what}: not rejected"
    assert any(all(w in p for w in words) for p in problems), problems
    with pytest.raises(FlowDefinitionError) as info:
        FlowRunner(definition)
    assert info.value.problems == problems


def test_every_problem_is_reported_not_just_the_first():
    definition = mutate("States/Pause/Next", "Gone")
    definition["States"]["Done"]["Type"] = "Task"
    del definition["States"]["Transfer"]["ActionUrl"]
    problems = validate_definition(definition)
    assert len(problems) >= 3
    assert {p.split(":")[0] for p in problems} >= {
        "State 'Pause'",
        "State 'Done'",
        "State 'Transfer'",
    }


def test_non_object_definition_is_rejected():
    assert validate_definition([]) == ["Definition: a flow definition must be a JSON object"]


def test_unreachable_states_are_a_warning_not_an_error():
    definition = copy.deepcopy(GOOD)
    definition["States"]["Orphan"] = {"Type": "Pass", "End": True}
    assert validate_definition(definition) == []
    assert any("'Orphan'" in w and "not reachable" in w for w in definition_warnings(definition))


def test_catch_of_an_error_no_action_raises_is_a_warning():
    definition = mutate("States/Transfer/Catch/0/ErrorEquals", ["ActionFailed"])
    assert validate_definition(definition) == []
    assert any("'ActionFailed'" in w for w in definition_warnings(definition))


def test_input_schema_problems_name_the_field():
    schema = {
        "type": "object",
        "properties": {"scan": {"type": "object", "required": ["name"]}},
        "required": ["scan"],
    }
    assert validate_input({"scan": {"name": "x"}}, schema) == []
    assert validate_input({"scan": {}}, schema) == ["input.scan: 'name' is a required property"]
    assert validate_input({}, schema) == ["input: 'scan' is a required property"]
    assert validate_input({}, {"type": "bogus"})[0].startswith("input schema is not a valid")


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parents[2] / "flows").glob("*.json")), ids=lambda p: p.name
)
def test_the_projects_flow_definitions_are_valid(path):
    if path.name.endswith(".schema.json"):
        pytest.skip("an input schema")
    assert validate_definition(json.loads(path.read_text())) == []
