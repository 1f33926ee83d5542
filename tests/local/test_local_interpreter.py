"""The local Globus Flows interpreter: every state type, actions, Catch, timeouts, cancel, logs."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from beamflow.local.actions import ActionStatus, ActionUnableToRunError, RunContext
from beamflow.local.clock import ManualClock, SystemClock
from beamflow.local.interpreter import FlowInputError, FlowRunner

TRANSFER_URL = "https://transfer.actions.globus.org/transfer"


class ScriptedProvider:
    """An action provider whose action goes through ``script``: the status returned by
    ``start`` is ``script[0]``, the n-th status poll returns ``script[n]`` (the last one
    repeats)."""

    def __init__(
        self,
        script: tuple[str, ...] = ("SUCCEEDED",),
        details: Any = None,
        start_error: Exception | None = None,
        status_error: Exception | None = None,
    ) -> None:
        self.script = script
        self.details = details if details is not None else {"done": True}
        self.start_error = start_error
        self.status_error = status_error
        self.bodies: list[dict[str, Any]] = []
        self.contexts: list[RunContext] = []
        self.cancelled: list[str] = []
        self.polls = 0
        self.polled = threading.Event()

    def _status(self, n: int) -> ActionStatus:
        status = self.script[min(n, len(self.script) - 1)]
        final = status in ("SUCCEEDED", "FAILED")
        return ActionStatus(
            action_id=f"act-{len(self.bodies)}",
            status=status,  # type: ignore[arg-type]
            start_time="2024-01-01T00:00:00+00:00",
            completion_time="2024-01-01T00:01:00+00:00" if final else None,
            details=self.details if final else {"progress": n},
        )

    def start(self, body: dict[str, Any], context: RunContext) -> ActionStatus:
        self.bodies.append(body)
        self.contexts.append(context)
        if self.start_error is not None:
            raise self.start_error
        return self._status(0)

    def status(self, action_id: str) -> ActionStatus:
        self.polls += 1
        self.polled.set()
        if self.status_error is not None:
            raise self.status_error
        return self._status(self.polls)

    def cancel(self, action_id: str) -> ActionStatus:
        self.cancelled.append(action_id)
        return ActionStatus(action_id=action_id, status="FAILED", details={"cancelled": True})


def flow(*states: tuple[str, dict[str, Any]], start: str | None = None) -> dict[str, Any]:
    return {"StartAt": start or states[0][0], "States": dict(states)}


def action(next_: str | None = None, **fields: Any) -> dict[str, Any]:
    state: dict[str, Any] = {
        "Type": "Action",
        "ActionUrl": TRANSFER_URL,
        "Parameters": {"x": 1},
        "ResultPath": "$.result",
    }
    state.update(fields)
    if next_:
        state["Next"] = next_
    else:
        state["End"] = True
    return state


def run(definition, providers=None, body=None, **kwargs):
    runner = FlowRunner(
        definition, providers or {}, flow_id="flow-1", clock=kwargs.pop("clock", ManualClock())
    )
    return runner.run(body if body is not None else {}, run_id="run-1", **kwargs)


def codes(result) -> list[str]:
    return [entry["code"] for entry in result.log]


# -- Pass / ExpressionEval -------------------------------------------------------------------
def test_pass_state_default_result_path_replaces_the_whole_state():
    result = run(flow(("P", {"Type": "Pass", "Result": {"only": 1}, "End": True})), body={"a": 1})
    assert result.status == "SUCCEEDED"
    assert result.output == {"only": 1}


def test_pass_with_input_path_parameters_and_result_path():
    definition = flow(
        (
            "P",
            {
                "Type": "Pass",
                "InputPath": "$.scan",
                # With InputPath, Parameters read the selected input (States Language).
                "Parameters": {"name.$": "$.name", "run.$": "$._context.run_id"},
                "ResultPath": "$.picked",
                "End": True,
            },
        )
    )
    result = run(definition, body={"scan": {"name": "s1", "size": 3}})
    assert result.output == {
        "scan": {"name": "s1", "size": 3},
        "picked": {"name": "s1", "run": "run-1"},
    }


def test_expression_eval_computes_values_with_context_and_functions():
    definition = flow(
        (
            "E",
            {
                "Type": "ExpressionEval",
                "Parameters": {
                    "label.=": "'scan ' + input.scan + ' run ' + _context.run_id",
                    "dir.=": "pathsplit(input.path)[0]",
                    "rest.=": "input.folders[1:]",
                    "count.=": "len(input.folders)",
                    "const": {"nested": [1, {"flow.$": "$._context.flow_id"}]},
                },
                "ResultPath": "$.computed",
                "End": True,
            },
        )
    )
    body = {"input": {"scan": "s7", "path": "/data/s7/master.h5", "folders": ["a", "b", "c"]}}
    result = run(definition, body=body)
    assert result.status == "SUCCEEDED", result.error
    assert result.output["computed"] == {
        "label": "scan s7 run run-1",
        "dir": "/data/s7",
        "rest": ["b", "c"],
        "count": 3,
        "const": {"nested": [1, {"flow": "flow-1"}]},
    }


# -- Action ----------------------------------------------------------------------------------
def test_action_gets_resolved_body_in_list_items_and_result_lands_at_result_path():
    provider = ScriptedProvider(("ACTIVE", "ACTIVE", "ACTIVE", "SUCCEEDED"), details={"n": 2})
    definition = flow(
        (
            "Transfer",
            action(
                Parameters={
                    "source_endpoint.$": "$.src",
                    "destination_endpoint": "dst-uuid",
                    "label.=": "'scan ' + scan",
                    "DATA": [
                        {
                            "DATA_TYPE": "transfer_item",
                            "source_path.$": "$.path",
                            "destination_path.=": "'/hpc/' + pathsplit(path)[1]",
                            "recursive": True,
                        }
                    ],
                },
                ResultPath="$.TransferResult",
            ),
        )
    )
    clock = ManualClock()
    # A trailing slash on the provider's URL does not matter.
    result = run(
        definition,
        {TRANSFER_URL + "/": provider},
        body={"src": "src-uuid", "scan": "s1", "path": "/det/s1"},
        clock=clock,
        label="try",
        tags=("t",),
    )
    assert result.status == "SUCCEEDED", result.error
    assert provider.bodies == [
        {
            "source_endpoint": "src-uuid",
            "destination_endpoint": "dst-uuid",
            "label": "scan s1",
            "DATA": [
                {
                    "DATA_TYPE": "transfer_item",
                    "source_path": "/det/s1",
                    "destination_path": "/hpc/s1",
                    "recursive": True,
                }
            ],
        }
    ]
    ctx = provider.contexts[0]
    assert (ctx.run_id, ctx.flow_id, ctx.state_name, ctx.label, ctx.tags) == (
        "run-1",
        "flow-1",
        "Transfer",
        "try",
        ("t",),
    )
    doc = result.output["TransferResult"]
    assert doc["status"] == "SUCCEEDED" and doc["details"] == {"n": 2}
    assert doc["state_name"] == "Transfer" and doc["action_id"] == "act-1"
    assert result.output["src"] == "src-uuid", "ResultPath keeps the rest of the state"
    # Polling backs off by doubling (poll_interval 1 s default).
    assert clock.sleeps == [1.0, 2.0, 4.0]
    assert codes(result) == ["FlowStarted", "ActionStarted", "ActionCompleted", "FlowSucceeded"]


def test_action_with_input_path_sends_that_value_as_the_body():
    provider = ScriptedProvider()
    definition = flow(
        ("A", {"Type": "Action", "ActionUrl": TRANSFER_URL, "InputPath": "$.req", "End": True})
    )
    result = run(definition, {TRANSFER_URL: provider}, body={"req": {"k": "v"}})
    assert provider.bodies == [{"k": "v"}]
    # No ResultPath: the action's status document replaces the whole state.
    assert set(result.output) >= {"action_id", "status", "details", "state_name"}


def test_failed_action_raises_action_failed_exception_by_default():
    provider = ScriptedProvider(("ACTIVE", "FAILED"), details={"error": "disk full"})
    result = run(flow(("T", action())), {TRANSFER_URL: provider})
    assert result.status == "FAILED"
    assert result.error["Error"] == "ActionFailedException"
    assert result.error["state_name"] == "T"
    cause = json.loads(result.error["Cause"])
    assert cause["status"] == "FAILED" and cause["details"] == {"error": "disk full"}
    assert result.details["code"] == "FlowFailed"
    assert codes(result) == ["FlowStarted", "ActionStarted", "ActionFailed", "FlowFailed"]


def test_exception_on_action_failure_false_stores_the_failed_status_and_goes_on():
    provider = ScriptedProvider(("FAILED",), details={"error": "nope"})
    definition = flow(
        ("T", action("After", ExceptionOnActionFailure=False)),
        ("After", {"Type": "Pass", "Result": "went on", "ResultPath": "$.after", "End": True}),
    )
    result = run(definition, {TRANSFER_URL: provider})
    assert result.status == "SUCCEEDED"
    assert result.output["result"]["status"] == "FAILED"
    assert result.output["result"]["details"] == {"error": "nope"}
    assert result.output["after"] == "went on"


def test_wait_time_exceeded_raises_action_timeout_and_cancels_the_action():
    provider = ScriptedProvider(("ACTIVE",))
    clock = ManualClock()
    result = run(flow(("T", action(WaitTime=30))), {TRANSFER_URL: provider}, clock=clock)
    assert result.status == "FAILED"
    assert result.error["Error"] == "ActionTimeout"
    assert json.loads(result.error["Cause"])["status"] == "ACTIVE"  # the last poll
    assert provider.cancelled == ["act-1"]
    assert sum(clock.sleeps) == pytest.approx(30)


def test_default_wait_time_is_300_seconds():
    clock = ManualClock()
    start = clock.time()
    result = run(flow(("T", action())), {TRANSFER_URL: ScriptedProvider(("ACTIVE",))}, clock=clock)
    assert result.error["Error"] == "ActionTimeout"
    assert clock.time() - start == pytest.approx(300)


def test_provider_that_refuses_to_start_gives_action_unable_to_run():
    refusing = ScriptedProvider(
        start_error=ActionUnableToRunError("bad", details={"code": "BadRequest", "why": "x"})
    )
    result = run(flow(("T", action())), {TRANSFER_URL: refusing})
    assert result.error["Error"] == "ActionUnableToRun"
    assert json.loads(result.error["Cause"]) == {"code": "BadRequest", "why": "x"}

    crashing = ScriptedProvider(start_error=RuntimeError("endpoint offline"))
    result = run(flow(("T", action())), {TRANSFER_URL: crashing})
    assert result.error["Error"] == "ActionUnableToRun"
    assert "endpoint offline" in result.error["Cause"]


def test_action_url_without_provider_fails_with_action_unable_to_run_naming_it():
    definition = flow(("T", action(ActionUrl="https://example.org/nothing/")))
    runner = FlowRunner(definition, {TRANSFER_URL: ScriptedProvider()}, clock=ManualClock())
    assert runner.missing_providers == ["https://example.org/nothing/"]
    result = runner.run({})
    assert result.error["Error"] == "ActionUnableToRun"
    assert "https://example.org/nothing/" in result.error["Cause"]


def test_status_polls_that_keep_failing_end_as_action_failed():
    provider = ScriptedProvider(("ACTIVE",), status_error=ConnectionError("gone"))
    result = run(flow(("T", action())), {TRANSFER_URL: provider})
    assert result.error["Error"] == "ActionFailedException"
    assert "gone" in result.error["Cause"]
    assert provider.polls == 5


# -- Catch -----------------------------------------------------------------------------------
def _provider_raising(kind: str) -> ScriptedProvider:
    if kind == "ActionFailedException":
        return ScriptedProvider(("FAILED",))
    if kind == "ActionTimeout":
        return ScriptedProvider(("ACTIVE",))
    return ScriptedProvider(start_error=RuntimeError("refused"))


@pytest.mark.parametrize("kind", ["ActionFailedException", "ActionTimeout", "ActionUnableToRun"])
@pytest.mark.parametrize("by_name", [True, False], ids=["by-name", "States.ALL"])
def test_catch_routes_each_error_kind_and_writes_the_error_at_result_path(kind, by_name):
    other = [
        e for e in ("ActionFailedException", "ActionTimeout", "ActionUnableToRun") if e != kind
    ]
    catch = [{"ErrorEquals": [other[0]], "Next": "Wrong", "ResultPath": "$.wrong"}]
    catch.append(
        {
            "ErrorEquals": [kind] if by_name else ["States.ALL"],
            "Next": "Handler",
            "ResultPath": "$.err",
        }
    )
    definition = flow(
        ("T", action("Wrong", WaitTime=10, Catch=catch)),
        ("Wrong", {"Type": "Fail", "Error": "WrongBranch"}),
        ("Handler", {"Type": "Pass", "End": True}),
    )
    result = run(definition, {TRANSFER_URL: _provider_raising(kind)}, body={"keep": 1})
    assert result.status == "SUCCEEDED", result.error
    assert result.output["keep"] == 1
    assert result.output["err"]["Error"] == kind
    assert isinstance(result.output["err"]["Cause"], str) and result.output["err"]["Cause"]
    assert "wrong" not in result.output


def test_catch_without_result_path_replaces_the_state_with_the_error():
    definition = flow(
        ("T", action("X", Catch=[{"ErrorEquals": ["States.ALL"], "Next": "X"}])),
        ("X", {"Type": "Pass", "End": True}),
    )
    result = run(definition, {TRANSFER_URL: ScriptedProvider(("FAILED",))}, body={"keep": 1})
    assert set(result.output) == {"Error", "Cause"}


def test_uncaught_kind_fails_the_run_even_with_other_catchers():
    definition = flow(
        ("T", action("X", Catch=[{"ErrorEquals": ["ActionTimeout"], "Next": "X"}])),
        ("X", {"Type": "Pass", "End": True}),
    )
    result = run(definition, {TRANSFER_URL: ScriptedProvider(("FAILED",))})
    assert result.status == "FAILED" and result.error["Error"] == "ActionFailedException"


def test_runtime_errors_are_not_caught_even_by_states_all():
    definition = flow(
        (
            "T",
            action(
                "X",
                Parameters={"p.$": "$.does.not.exist"},
                Catch=[{"ErrorEquals": ["States.ALL"], "Next": "X"}],
            ),
        ),
        ("X", {"Type": "Pass", "End": True}),
    )
    provider = ScriptedProvider()
    result = run(definition, {TRANSFER_URL: provider})
    assert result.status == "FAILED"
    assert result.error["Error"] == "States.Runtime"
    assert "'T'" in result.error["Cause"] and "does" in result.error["Cause"]
    assert provider.bodies == [], "the action must not start"


def test_failed_expression_fails_the_run_with_the_state_and_reason():
    definition = flow(
        ("E", {"Type": "ExpressionEval", "Parameters": {"v.=": "a / 0"}, "End": True})
    )
    result = run(definition, body={"a": 1})
    assert result.status == "FAILED"
    assert "State 'E'" in result.error["Cause"] and "division by zero" in result.error["Cause"]


# -- Choice ----------------------------------------------------------------------------------
def choice_flow(rule: dict[str, Any], default: bool = True) -> dict[str, Any]:
    choice: dict[str, Any] = {"Type": "Choice", "Choices": [{**rule, "Next": "Yes"}]}
    if default:
        choice["Default"] = "No"
    return flow(
        ("C", choice),
        ("Yes", {"Type": "Pass", "Result": "yes", "ResultPath": "$.branch", "End": True}),
        ("No", {"Type": "Pass", "Result": "no", "ResultPath": "$.branch", "End": True}),
    )


DATA = {
    "s": "scan_042",
    "s2": "scan_042",
    "n": 5,
    "n2": 7.5,
    "b": True,
    "t": "2024-05-01T12:00:00Z",
    "t2": "2024-05-01T13:00:00+01:00",  # the same instant as t
    "nothing": None,
    "star": "a*b",
}

CHOICES = [
    # String family
    ({"Variable": "$.s", "StringEquals": "scan_042"}, "yes"),
    ({"Variable": "$.s", "StringEquals": "scan_043"}, "no"),
    ({"Variable": "$.n", "StringEquals": "5"}, "no"),  # wrong type → false
    ({"Variable": "$.s", "StringLessThan": "scan_1"}, "yes"),
    ({"Variable": "$.s", "StringGreaterThan": "scan_1"}, "no"),
    ({"Variable": "$.s", "StringLessThanEquals": "scan_042"}, "yes"),
    ({"Variable": "$.s", "StringGreaterThanEquals": "scan_043"}, "no"),
    ({"Variable": "$.s", "StringEqualsPath": "$.s2"}, "yes"),
    ({"Variable": "$.s", "StringLessThanPath": "$.s2"}, "no"),
    ({"Variable": "$.s", "StringGreaterThanPath": "$.s2"}, "no"),
    ({"Variable": "$.s", "StringLessThanEqualsPath": "$.s2"}, "yes"),
    ({"Variable": "$.s", "StringGreaterThanEqualsPath": "$.s2"}, "yes"),
    ({"Variable": "$.s", "StringMatches": "scan_*"}, "yes"),
    ({"Variable": "$.s", "StringMatches": "*_04?"}, "no"),  # only * is special
    ({"Variable": "$.star", "StringMatches": "a\\*b"}, "yes"),
    ({"Variable": "$.s", "StringMatches": "scan\\*"}, "no"),
    # Numeric family
    ({"Variable": "$.n", "NumericEquals": 5}, "yes"),
    ({"Variable": "$.n", "NumericEquals": 5.0}, "yes"),
    ({"Variable": "$.s", "NumericEquals": 5}, "no"),
    ({"Variable": "$.b", "NumericEquals": 1}, "no"),  # booleans are not numbers
    ({"Variable": "$.n", "NumericLessThan": 7.5}, "yes"),
    ({"Variable": "$.n", "NumericGreaterThan": 5}, "no"),
    ({"Variable": "$.n", "NumericLessThanEquals": 5}, "yes"),
    ({"Variable": "$.n", "NumericGreaterThanEquals": 6}, "no"),
    ({"Variable": "$.n", "NumericEqualsPath": "$.n2"}, "no"),
    ({"Variable": "$.n", "NumericLessThanPath": "$.n2"}, "yes"),
    ({"Variable": "$.n", "NumericGreaterThanPath": "$.n2"}, "no"),
    ({"Variable": "$.n", "NumericLessThanEqualsPath": "$.n2"}, "yes"),
    ({"Variable": "$.n2", "NumericGreaterThanEqualsPath": "$.n"}, "yes"),
    # Boolean family
    ({"Variable": "$.b", "BooleanEquals": True}, "yes"),
    ({"Variable": "$.b", "BooleanEquals": False}, "no"),
    ({"Variable": "$.n", "BooleanEquals": True}, "no"),
    ({"Variable": "$.b", "BooleanEqualsPath": "$.b"}, "yes"),
    # Timestamp family (instants compared, offsets honoured)
    ({"Variable": "$.t", "TimestampEquals": "2024-05-01T12:00:00Z"}, "yes"),
    ({"Variable": "$.t", "TimestampEquals": "2024-05-01T14:00:00+02:00"}, "yes"),
    ({"Variable": "$.s", "TimestampEquals": "2024-05-01T12:00:00Z"}, "no"),
    ({"Variable": "$.t", "TimestampLessThan": "2024-05-01T12:00:01Z"}, "yes"),
    ({"Variable": "$.t", "TimestampGreaterThan": "2024-05-01T12:00:01Z"}, "no"),
    ({"Variable": "$.t", "TimestampLessThanEquals": "2024-05-01T12:00:00Z"}, "yes"),
    ({"Variable": "$.t", "TimestampGreaterThanEquals": "2025-01-01T00:00:00Z"}, "no"),
    ({"Variable": "$.t", "TimestampEqualsPath": "$.t2"}, "yes"),
    ({"Variable": "$.t", "TimestampLessThanPath": "$.t2"}, "no"),
    ({"Variable": "$.t", "TimestampGreaterThanPath": "$.t2"}, "no"),
    ({"Variable": "$.t", "TimestampLessThanEqualsPath": "$.t2"}, "yes"),
    ({"Variable": "$.t", "TimestampGreaterThanEqualsPath": "$.t2"}, "yes"),
    # Type tests
    ({"Variable": "$.nothing", "IsNull": True}, "yes"),
    ({"Variable": "$.s", "IsNull": True}, "no"),
    ({"Variable": "$.s", "IsPresent": True}, "yes"),
    ({"Variable": "$.absent", "IsPresent": True}, "no"),
    ({"Variable": "$.absent", "IsPresent": False}, "yes"),
    ({"Variable": "$.n", "IsNumeric": True}, "yes"),
    ({"Variable": "$.b", "IsNumeric": True}, "no"),
    ({"Variable": "$.s", "IsString": True}, "yes"),
    ({"Variable": "$.s", "IsString": False}, "no"),
    ({"Variable": "$.b", "IsBoolean": True}, "yes"),
    ({"Variable": "$.t", "IsTimestamp": True}, "yes"),
    ({"Variable": "$.s", "IsTimestamp": True}, "no"),
    # Combinators
    (
        {
            "And": [
                {"Variable": "$.n", "NumericGreaterThan": 1},
                {"Variable": "$.s", "StringMatches": "scan*"},
            ]
        },
        "yes",
    ),
    (
        {
            "And": [
                {"Variable": "$.n", "NumericGreaterThan": 1},
                {"Variable": "$.s", "StringMatches": "x*"},
            ]
        },
        "no",
    ),
    (
        {
            "Or": [
                {"Variable": "$.n", "NumericGreaterThan": 10},
                {"Variable": "$.b", "BooleanEquals": True},
            ]
        },
        "yes",
    ),
    ({"Not": {"Variable": "$.b", "BooleanEquals": True}}, "no"),
    (
        {
            "Not": {
                "Or": [
                    {"Variable": "$.absent", "IsPresent": True},
                    {"And": [{"Variable": "$.n", "NumericEquals": 4}]},
                ]
            }
        },
        "yes",
    ),
]


@pytest.mark.parametrize(("rule", "branch"), CHOICES, ids=[json.dumps(r) for r, _ in CHOICES])
def test_choice_operators(rule, branch):
    result = run(choice_flow(rule), body=DATA)
    assert result.status == "SUCCEEDED", result.error
    assert result.output["branch"] == branch


def test_choice_rules_are_tried_in_order_first_match_wins():
    definition = choice_flow({"Variable": "$.n", "NumericEquals": 5})
    definition["States"]["C"]["Choices"].insert(
        0, {"Variable": "$.n", "NumericGreaterThan": 0, "Next": "No"}
    )
    assert run(definition, body=DATA).output["branch"] == "no"


def test_choice_without_match_or_default_fails_with_no_choice_matched():
    result = run(choice_flow({"Variable": "$.n", "NumericEquals": 6}, default=False), body=DATA)
    assert result.status == "FAILED"
    assert result.error["Error"] == "States.NoChoiceMatched"
    assert result.error["state_name"] == "C"


def test_choice_on_a_missing_variable_is_a_runtime_error():
    result = run(choice_flow({"Variable": "$.absent", "StringEquals": "x"}), body=DATA)
    assert result.status == "FAILED" and result.error["Error"] == "States.Runtime"
    assert "absent" in result.error["Cause"]


# -- Wait ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("wait", "body", "seconds"),
    [
        ({"Seconds": 90}, {}, 90),
        ({"SecondsPath": "$.delay"}, {"delay": 12.5}, 12.5),
        ({"Timestamp": "2023-11-14T22:15:20Z"}, {}, 7200),  # ManualClock starts at 20:15:20Z
        ({"TimestampPath": "$.when"}, {"when": "2023-11-14T21:15:20+00:00"}, 3600),
        ({"Timestamp": "2020-01-01T00:00:00Z"}, {}, 0),  # in the past: no wait
    ],
)
def test_wait_state_waits_the_right_amount_of_flow_time(wait, body, seconds):
    clock = ManualClock(start=1_699_992_920.0)  # 2023-11-14T20:15:20Z
    definition = flow(
        ("W", {"Type": "Wait", **wait, "Next": "D"}), ("D", {"Type": "Pass", "End": True})
    )
    start = clock.time()
    result = run(definition, body=body, clock=clock)
    assert result.status == "SUCCEEDED", result.error
    assert clock.time() - start == pytest.approx(seconds)
    assert codes(result)[1:3] == ["WaitStarted", "WaitCompleted"]


def test_wait_with_a_bad_seconds_path_value_fails_the_run():
    definition = flow(("W", {"Type": "Wait", "SecondsPath": "$.delay", "End": True}))
    result = run(definition, body={"delay": "soon"})
    assert result.status == "FAILED" and "SecondsPath" in result.error["Cause"]


def test_system_clock_time_scale_shortens_real_waits():
    definition = flow(("W", {"Type": "Wait", "Seconds": 3600, "End": True}))
    clock = SystemClock(time_scale=1e-5)  # an hour of flow time in ~36 ms
    result = run(definition, clock=clock)
    assert result.status == "SUCCEEDED"


# -- Fail ------------------------------------------------------------------------------------
def test_fail_state_fails_the_run_with_error_and_cause():
    definition = flow(("F", {"Type": "Fail", "Error": "BadScan", "Cause": "no positions"}))
    result = run(definition, body={"x": 1})
    assert result.status == "FAILED"
    assert result.error == {"Error": "BadScan", "Cause": "no positions", "state_name": "F"}
    assert result.details["code"] == "FlowFailed"
    assert result.details["details"]["Cause"] == "no positions"
    assert result.output == {"x": 1}
    assert codes(result)[-1] == "FlowFailed"


def test_fail_state_paths_read_error_and_cause_from_the_state():
    definition = flow(
        ("F", {"Type": "Fail", "ErrorPath": "$.err.Error", "CausePath": "$.err.Cause"})
    )
    result = run(definition, body={"err": {"Error": "ActionTimeout", "Cause": "slow"}})
    assert (result.error["Error"], result.error["Cause"]) == ("ActionTimeout", "slow")


# -- run lifecycle ---------------------------------------------------------------------------
def test_run_log_entries_have_the_service_shape_and_reach_the_listener_live():
    seen: list[dict[str, Any]] = []

    def listener(entry):
        seen.append(entry)
        raise RuntimeError("a broken listener must not break the run")

    definition = flow(
        ("P", {"Type": "Pass", "Next": "T"}),
        ("T", action()),
    )
    result = run(definition, {TRANSFER_URL: ScriptedProvider()}, body={"a": 1}, on_log=listener)
    assert result.status == "SUCCEEDED"
    assert seen == result.log
    assert codes(result) == [
        "FlowStarted",
        "PassStarted",
        "PassCompleted",
        "ActionStarted",
        "ActionCompleted",
        "FlowSucceeded",
    ]
    for entry in result.log:
        assert set(entry) == {"time", "code", "description", "details"}
    started = result.log[3]
    assert started["description"] == "State T of type Action started"
    assert started["details"]["state_name"] == "T"
    assert started["details"]["state_type"] == "Action"
    assert started["details"]["input"] == {"x": 1}
    assert result.log[0]["details"] == {"input": {"a": 1}}
    assert result.details == {
        "code": "FlowSucceeded",
        "description": "The Flow run reached a successful completion state",
        "output": result.output,
    }
    assert result.start_time and result.completion_time


def test_context_values_are_available_and_not_stored_in_the_state():
    definition = flow(
        (
            "P",
            {
                "Type": "Pass",
                "Parameters": {"ctx.$": "$._context", "user.=": "_context.username"},
                "ResultPath": "$.seen",
                "End": True,
            },
        )
    )
    runner = FlowRunner(
        definition, flow_id="f-1", clock=ManualClock(), user={"username": "ada@example.org"}
    )
    result = runner.run({}, run_id="r-9")
    ctx = result.output["seen"]["ctx"]
    assert (ctx["run_id"], ctx["flow_id"], ctx["username"]) == ("r-9", "f-1", "ada@example.org")
    assert result.output["seen"]["user"] == "ada@example.org"
    assert "_context" not in result.output


def test_private_parameters_reach_the_action_but_not_the_log_or_output():
    provider = ScriptedProvider()
    definition = flow(
        (
            "T",
            action(
                Parameters={
                    "user": "beamline",
                    "password.$": "$._private_secret",
                    "__Private_Parameters": ["password"],
                }
            ),
        )
    )
    result = run(definition, {TRANSFER_URL: provider}, body={"_private_secret": "hunter2"})
    assert provider.bodies == [{"user": "beamline", "password": "hunter2"}]
    text = json.dumps(result.log) + json.dumps(result.output)
    assert "hunter2" not in text
    assert result.log[1]["details"]["input"] == {"user": "beamline"}


def test_input_is_checked_against_the_input_schema():
    schema = {
        "type": "object",
        "required": ["scan"],
        "properties": {"scan": {"type": "string"}},
        "additionalProperties": False,
    }
    runner = FlowRunner(flow(("P", {"Type": "Pass", "End": True})), input_schema=schema)
    with pytest.raises(FlowInputError) as info:
        runner.run({"scan": 3, "extra": True})
    text = str(info.value)
    assert "input.scan: 3 is not of type 'string'" in text
    assert "'extra' was unexpected" in text
    assert runner.run({"scan": "s1"}).status == "SUCCEEDED"


def test_cancel_a_running_action_ends_the_run_and_cancels_the_action():
    provider = ScriptedProvider(("ACTIVE",))
    runner = FlowRunner(
        flow(("T", action(WaitTime=3600))),
        {TRANSFER_URL: provider},
        poll_interval=0.01,
        max_poll_interval=0.01,
    )
    handle = runner.start({}, run_id="run-c")
    assert provider.polled.wait(5), "the action never got polled"
    assert handle.status == "ACTIVE"
    handle.cancel()
    result = handle.wait(5)
    assert result is not None and result.status == "ENDED"
    assert provider.cancelled == ["act-1"]
    assert result.details["code"] == "FlowCanceled"
    assert codes(result)[-1] == "FlowCanceled"
    assert runner.active_runs() == []


def test_cancel_from_another_thread_interrupts_a_long_wait():
    runner = FlowRunner(flow(("W", {"Type": "Wait", "Seconds": 86400, "End": True})))
    waiting = threading.Event()
    results = []

    def listener(entry):
        if entry["code"] == "WaitStarted":
            waiting.set()

    worker = threading.Thread(
        target=lambda: results.append(runner.run({}, run_id="run-w", on_log=listener))
    )
    worker.start()
    assert waiting.wait(5)
    assert runner.cancel("run-w") is True
    worker.join(5)
    assert results and results[0].status == "ENDED"
    assert runner.cancel("run-w") is False, "the run is over"


def test_the_same_runner_runs_several_flows_at_once_independently():
    runner = FlowRunner(
        flow(("E", {"Type": "ExpressionEval", "Parameters": {"v.=": "n * 2"}, "End": True})),
        clock=ManualClock(),
    )
    handles = [runner.start({"n": i}) for i in range(5)]
    results = [h.wait(5) for h in handles]
    assert [r.output for r in results] == [{"v": 2 * i} for i in range(5)]
    assert len({r.run_id for r in results}) == 5
