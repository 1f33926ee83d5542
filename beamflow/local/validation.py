"""Checks a Globus Flows definition (and a run's input) the way the service does at deploy
and run time, so a definition that Globus would reject is rejected here too, with the state
and the reason.

Sources for the rules (see also the interpreter module docstring):

* Globus Flows "Authoring Flows" (docs.globus.org/api/flows/authoring-flows/ and the older
  copy in globus-automate-client ``docs/source/authoring_flows.rst``): six state types only;
  ``OutputPath`` not allowed; Action fields, ``InputPath`` or ``Parameters`` (mutually
  exclusive, one required), ``WaitTime``, ``ExceptionOnActionFailure``, ``RunAs``,
  ``ActionScope``, ``Catch``; ExpressionEval requires ``Parameters`` and has no
  ``InputPath``; Fail has ``Error``/``Cause`` or ``ErrorPath``/``CausePath``; Choice rules
  carry ``Next`` only at the top level.
* The service's schema as shipped in globus-automate-client ``flows_schema.json`` and its
  pydantic model ``flow_model.py`` (field lists per state type, ``Catch`` entries need
  ``ErrorEquals`` (≥1, unique) and ``Next``; Wait ``Seconds`` at most one year).
* The service's own error text for a state with neither Next nor End, as recorded in
  globus-sdk's ``testing/data/flows/validate_flow.py``.
* The Amazon States Language spec (states-language.net) for what Globus inherits:
  ``States.ALL`` must stand alone in the last catcher; choice operators and their types.

:func:`validate_definition` returns problems (errors: the service would refuse the flow);
:func:`definition_warnings` returns things worth a look that the service may accept (states
not reachable from ``StartAt``: Globus's own client model rejects states that are never
referenced, but whether the service does is unverified, so here it is a warning).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import jsonschema
from jsonschema.validators import validator_for

from beamflow.local.expressions import check_expression
from beamflow.local.jsonpath import check_path, is_context_path

STATE_TYPES = ("Action", "Pass", "Choice", "Wait", "Fail", "ExpressionEval")
# Types from the Amazon States Language that Globus Flows refuses, for a clearer message.
ASL_ONLY_TYPES = ("Task", "Parallel", "Map", "Succeed")

TOP_LEVEL_FIELDS = {"StartAt", "States", "Comment"}
COMMON = {"Type", "Comment"}
FIELDS: dict[str, set[str]] = {
    "Action": COMMON
    | {
        "ActionUrl",
        "ActionScope",
        "RunAs",
        "InputPath",
        "Parameters",
        "ResultPath",
        "WaitTime",
        "ExceptionOnActionFailure",
        "Catch",
        "Next",
        "End",
    },
    "Pass": COMMON | {"InputPath", "Parameters", "Result", "ResultPath", "Next", "End"},
    "ExpressionEval": COMMON | {"Parameters", "ResultPath", "Next", "End"},
    "Wait": COMMON | {"Seconds", "Timestamp", "SecondsPath", "TimestampPath", "Next", "End"},
    "Fail": COMMON | {"Error", "Cause", "ErrorPath", "CausePath"},
    "Choice": COMMON | {"Choices", "Default"},
}
CATCH_FIELDS = {"ErrorEquals", "Next", "ResultPath"}
ACTION_ERRORS = ("ActionUnableToRun", "ActionFailedException", "ActionTimeout")
ALL_ERRORS = "States.ALL"
MAX_WAIT_SECONDS = 31_536_000  # one year, as in the service's schema

# Choice rule operators and the JSON type of their comparison value.
_COMPARISONS = ("Equals", "LessThan", "GreaterThan", "LessThanEquals", "GreaterThanEquals")
CHOICE_OPERATORS: dict[str, str] = {}
for _family in ("String", "Numeric", "Timestamp"):
    for _cmp in _COMPARISONS:
        CHOICE_OPERATORS[f"{_family}{_cmp}"] = _family.lower()
        CHOICE_OPERATORS[f"{_family}{_cmp}Path"] = "path"
CHOICE_OPERATORS["StringMatches"] = "string"
CHOICE_OPERATORS["BooleanEquals"] = "boolean"
CHOICE_OPERATORS["BooleanEqualsPath"] = "path"
for _test in ("IsNull", "IsPresent", "IsNumeric", "IsString", "IsBoolean", "IsTimestamp"):
    CHOICE_OPERATORS[_test] = "boolean"

_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


class FlowDefinitionError(ValueError):
    """A flow definition the service would reject; ``problems`` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            "invalid flow definition:\n" + "\n".join(f"  - {p}" for p in self.problems)
        )


class FlowInputError(ValueError):
    """A run's input does not satisfy the flow's input schema."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            "flow input does not match the input schema:\n"
            + "\n".join(f"  - {p}" for p in self.problems)
        )


def parse_timestamp(value: object) -> datetime | None:
    """An RFC 3339 timestamp (with its offset) as an aware datetime, else None."""
    if not isinstance(value, str) or not _TIMESTAMP.match(value):
        return None
    try:
        return datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _where(name: str) -> str:
    return f"State {name!r}"


# The keys whose value is evaluated, not copied: a path (``.$``) or an expression (``.=``).
_EVALUATED: dict[str, tuple[str, Callable[[str], str | None]]] = {
    ".$": ("a JSONPath string", check_path),
    ".=": ("an expression string", check_expression),
}


def iter_parameter_problems(value: Any, where: str, trail: str = "Parameters") -> Iterator[str]:
    """Problems with ``.$`` paths and ``.=`` expressions anywhere in a Parameters value."""
    if isinstance(value, dict):
        for key, sub in value.items():
            here = f"{trail}.{key}"
            if not isinstance(key, str):
                continue
            if key[-2:] in _EVALUATED:
                what, check = _EVALUATED[key[-2:]]
                if not isinstance(sub, str):
                    yield f"{where}: {here} must be {what}, not {type(sub).__name__}"
                elif reason := check(sub):
                    yield f"{where}: {here}: {reason}"
            elif key == "__Private_Parameters":
                if not (isinstance(sub, list) and all(isinstance(s, str) for s in sub)):
                    yield f"{where}: {here} must be a list of parameter names"
            else:
                yield from iter_parameter_problems(sub, where, here)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from iter_parameter_problems(item, where, f"{trail}[{i}]")


def _path_field(state: dict[str, Any], field: str, where: str, *, writable: bool = False):
    if field not in state:
        return
    value = state[field]
    reason = check_path(value)
    if reason:
        yield f"{where}: {field}: {reason}"
    elif writable and is_context_path(value):
        yield f"{where}: {field} {value!r} points into $._context, which is read-only"


def _next_or_end(state: dict[str, Any], name: str, names: set[str]) -> Iterator[str]:
    where = _where(name)
    has_next = "Next" in state
    end = state.get("End")
    if "End" in state and not isinstance(end, bool):
        yield f"{where}: End must be true or false"
    if has_next and end is True:
        yield (
            f'{where}: has both Next and "End": true; a state is either terminal or transitional'
        )
    elif not has_next and end is not True:
        yield (
            f"{where}: a state of type {state.get('Type')!r} must be defined as either terminal "
            '("End": true) or transitional ("Next": "NextStateId")'
        )
    if has_next:
        nxt = state["Next"]
        if not isinstance(nxt, str):
            yield f"{where}: Next must be a state name (a string)"
        elif nxt not in names:
            yield f"{where}: Next names {nxt!r}, which is not a state of this flow"


def _check_catch(state: dict[str, Any], name: str, names: set[str]) -> Iterator[str]:
    where = _where(name)
    catch = state["Catch"]
    if not isinstance(catch, list) or not catch:
        yield f"{where}: Catch must be a non-empty list of catchers"
        return
    seen: set[str] = set()
    for i, catcher in enumerate(catch):
        here = f"{where}: Catch[{i}]"
        if not isinstance(catcher, dict):
            yield f"{here} must be an object"
            continue
        for extra in sorted(set(catcher) - CATCH_FIELDS):
            yield f"{here}: unknown field {extra!r} (allowed: {', '.join(sorted(CATCH_FIELDS))})"
        errors = catcher.get("ErrorEquals")
        if "ErrorEquals" not in catcher:
            yield f"{here}: ErrorEquals is required"
        elif (
            not isinstance(errors, list)
            or not errors
            or not all(isinstance(e, str) for e in errors)
        ):
            yield f"{here}: ErrorEquals must be a non-empty list of error names"
        else:
            if len(set(errors)) != len(errors):
                yield f"{here}: ErrorEquals lists an error more than once"
            again = seen.intersection(errors)
            if again:
                yield f"{here}: {sorted(again)} already handled by an earlier catcher"
            seen.update(errors)
            if ALL_ERRORS in errors and (len(errors) != 1 or i != len(catch) - 1):
                yield f"{here}: States.ALL must be alone in the last catcher"
        if "Next" not in catcher:
            yield f"{here}: Next is required"
        elif not isinstance(catcher["Next"], str) or catcher["Next"] not in names:
            yield f"{here}: Next names {catcher['Next']!r}, which is not a state of this flow"
        yield from _path_field(catcher, "ResultPath", here, writable=True)


def _check_choice_rule(rule: Any, where: str, names: set[str], *, top: bool) -> Iterator[str]:
    if not isinstance(rule, dict):
        yield f"{where} must be an object"
        return
    combinators = [k for k in ("And", "Or", "Not") if k in rule]
    operators = [k for k in rule if k in CHOICE_OPERATORS]
    allowed = {"Next", "Comment"} if top else {"Comment"}
    if top and "Next" not in rule:
        yield f"{where}: a top-level choice rule needs Next"
    if not top and "Next" in rule:
        yield f"{where}: nested choice rules may not have Next (only top-level rules do)"
    if top and "Next" in rule and (not isinstance(rule["Next"], str) or rule["Next"] not in names):
        yield f"{where}: Next names {rule['Next']!r}, which is not a state of this flow"
    if combinators:
        if len(combinators) > 1 or operators or "Variable" in rule:
            yield f"{where}: a rule is either one of And/Or/Not or one Variable test, not both"
            return
        comb = combinators[0]
        extra = set(rule) - allowed - {comb}
        for field in sorted(extra):
            yield f"{where}: unknown field {field!r}"
        sub = rule[comb]
        if comb == "Not":
            yield from _check_choice_rule(sub, f"{where}.Not", names, top=False)
        elif not isinstance(sub, list) or not sub:
            yield f"{where}: {comb} must be a non-empty list of rules"
        else:
            for i, item in enumerate(sub):
                yield from _check_choice_rule(item, f"{where}.{comb}[{i}]", names, top=False)
        return
    if "Variable" not in rule:
        yield f"{where}: needs Variable and one comparison operator, or And/Or/Not"
        return
    reason = check_path(rule["Variable"])
    if reason:
        yield f"{where}: Variable: {reason}"
    if len(operators) != 1:
        yield (
            f"{where}: needs exactly one comparison operator "
            f"(found {', '.join(operators) if operators else 'none'})"
        )
    for field in sorted(set(rule) - allowed - {"Variable"} - set(CHOICE_OPERATORS)):
        yield f"{where}: unknown field {field!r} in a choice rule"
    for op in operators:
        kind = CHOICE_OPERATORS[op]
        value = rule[op]
        if kind == "path":
            reason = check_path(value)
            if reason:
                yield f"{where}: {op}: {reason}"
        elif kind == "string" and not isinstance(value, str):
            yield f"{where}: {op} needs a string"
        elif kind == "numeric" and not _is_number(value):
            yield f"{where}: {op} needs a number"
        elif kind == "boolean" and not isinstance(value, bool):
            yield f"{where}: {op} needs true or false"
        elif kind == "timestamp" and parse_timestamp(value) is None:
            yield f"{where}: {op} needs an RFC 3339 timestamp such as '2024-01-31T12:00:00Z'"


def _check_state(name: str, state: Any, names: set[str]) -> Iterator[str]:
    where = _where(name)
    if not isinstance(state, dict):
        yield f"{where}: a state must be an object"
        return
    kind = state.get("Type")
    if kind not in STATE_TYPES:
        if "Type" not in state:
            yield f"{where}: Type is required (one of {', '.join(STATE_TYPES)})"
        elif kind in ASL_ONLY_TYPES:
            yield (
                f"{where}: state type {kind!r} is not supported by Globus Flows "
                f"(only {', '.join(STATE_TYPES)})"
            )
        else:
            yield f"{where}: unknown state type {kind!r} (only {', '.join(STATE_TYPES)})"
        return
    for field in sorted(set(state) - FIELDS[kind]):
        hint = " (Globus Flows uses ResultPath instead)" if field == "OutputPath" else ""
        yield f"{where}: unknown field {field!r} for a {kind} state{hint}"
    if "Comment" in state and not isinstance(state["Comment"], str):
        yield f"{where}: Comment must be a string"

    if kind in ("Action", "Pass", "ExpressionEval", "Wait"):
        yield from _next_or_end(state, name, names)
    if kind in ("Action", "Pass", "ExpressionEval"):
        yield from _path_field(state, "ResultPath", where, writable=True)
        if "Parameters" in state:
            params = state["Parameters"]
            if not isinstance(params, dict):
                yield f"{where}: Parameters must be an object"
            else:
                yield from iter_parameter_problems(params, where)
    if kind in ("Action", "Pass"):
        yield from _path_field(state, "InputPath", where)

    if kind == "Action":
        url = state.get("ActionUrl")
        if "ActionUrl" not in state:
            yield f"{where}: an Action state needs ActionUrl"
        elif not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
            yield f"{where}: ActionUrl must be an http(s) URL, not {url!r}"
        has_params, has_input = "Parameters" in state, "InputPath" in state
        if has_params and has_input:
            yield f"{where}: Parameters and InputPath are mutually exclusive; use one"
        elif not has_params and not has_input:
            yield f"{where}: an Action state needs Parameters or InputPath (the action's body)"
        if "WaitTime" in state:
            wait = state["WaitTime"]
            if not isinstance(wait, int) or isinstance(wait, bool) or wait <= 0:
                yield f"{where}: WaitTime must be a positive whole number of seconds"
        if "ExceptionOnActionFailure" in state and not isinstance(
            state["ExceptionOnActionFailure"], bool
        ):
            yield f"{where}: ExceptionOnActionFailure must be true or false"
        for field in ("RunAs", "ActionScope"):
            if field in state and not isinstance(state[field], str):
                yield f"{where}: {field} must be a string"
        if "Catch" in state:
            yield from _check_catch(state, name, names)

    elif kind == "ExpressionEval":
        if "Parameters" not in state:
            yield f"{where}: an ExpressionEval state needs Parameters"

    elif kind == "Wait":
        given = [k for k in ("Seconds", "Timestamp", "SecondsPath", "TimestampPath") if k in state]
        if len(given) != 1:
            yield (
                f"{where}: a Wait state needs exactly one of Seconds, Timestamp, SecondsPath, "
                f"TimestampPath (found {', '.join(given) if given else 'none'})"
            )
        if "Seconds" in state:
            sec = state["Seconds"]
            if not _is_number(sec) or sec < 0 or sec > MAX_WAIT_SECONDS:
                yield f"{where}: Seconds must be a number from 0 to {MAX_WAIT_SECONDS}"
        if "Timestamp" in state and parse_timestamp(state["Timestamp"]) is None:
            yield f"{where}: Timestamp must be an RFC 3339 timestamp such as '2024-01-31T12:00:00Z'"
        yield from _path_field(state, "SecondsPath", where)
        yield from _path_field(state, "TimestampPath", where)

    elif kind == "Fail":
        for plain, path in (("Error", "ErrorPath"), ("Cause", "CausePath")):
            if plain in state and path in state:
                yield f"{where}: {plain} and {path} are mutually exclusive"
            if plain in state and not isinstance(state[plain], str):
                yield f"{where}: {plain} must be a string"
            yield from _path_field(state, path, where)

    elif kind == "Choice":
        choices = state.get("Choices")
        if "Choices" not in state:
            yield f"{where}: a Choice state needs Choices"
        elif not isinstance(choices, list) or not choices:
            yield f"{where}: Choices must be a non-empty list of rules"
        else:
            for i, rule in enumerate(choices):
                yield from _check_choice_rule(rule, f"{where}: Choices[{i}]", names, top=True)
        if "Default" in state and (
            not isinstance(state["Default"], str) or state["Default"] not in names
        ):
            yield f"{where}: Default names {state['Default']!r}, which is not a state of this flow"


def validate_definition(definition: Any) -> list[str]:
    """Every reason the service would refuse ``definition`` (empty if it is fine)."""
    if not isinstance(definition, dict):
        return ["Definition: a flow definition must be a JSON object"]
    problems: list[str] = []
    for field in sorted(set(definition) - TOP_LEVEL_FIELDS):
        problems.append(
            f"Definition: unknown top-level field {field!r} (allowed: Comment, StartAt, States)"
        )
    states = definition.get("States")
    if "States" not in definition:
        problems.append("Definition: States is required")
        states = {}
    elif not isinstance(states, dict) or not states:
        problems.append("Definition: States must be a non-empty object of named states")
        states = {}
    names = set(states)
    if "StartAt" not in definition:
        problems.append("Definition: StartAt is required")
    elif not isinstance(definition["StartAt"], str) or definition["StartAt"] not in names:
        problems.append(
            f"Definition: StartAt names {definition['StartAt']!r}, which is not a state of "
            "this flow"
        )
    if "Comment" in definition and not isinstance(definition["Comment"], str):
        problems.append("Definition: Comment must be a string")
    for name, state in states.items():
        problems.extend(_check_state(name, state, names))
    return problems


def successors(state: dict[str, Any]) -> list[str]:
    """The states a state can pass control to."""
    out: list[str] = []
    if isinstance(state.get("Next"), str):
        out.append(state["Next"])
    if isinstance(state.get("Default"), str):
        out.append(state["Default"])
    for rule in state.get("Choices") or []:
        if isinstance(rule, dict) and isinstance(rule.get("Next"), str):
            out.append(rule["Next"])
    for catcher in state.get("Catch") or []:
        if isinstance(catcher, dict) and isinstance(catcher.get("Next"), str):
            out.append(catcher["Next"])
    return out


def unreachable_states(definition: dict[str, Any]) -> list[str]:
    states = definition.get("States")
    start = definition.get("StartAt")
    if not isinstance(states, dict) or start not in states:
        return []
    seen = {start}
    todo = [start]
    while todo:
        state = states.get(todo.pop())
        if not isinstance(state, dict):
            continue
        for nxt in successors(state):
            if nxt in states and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return [name for name in states if name not in seen]


def definition_warnings(definition: Any) -> list[str]:
    """Things the service may accept but that are probably mistakes."""
    if not isinstance(definition, dict):
        return []
    warnings = [
        f"{_where(name)}: not reachable from StartAt (Globus may refuse states that are "
        "never referenced)"
        for name in unreachable_states(definition)
    ]
    for name, state in (definition.get("States") or {}).items():
        if not isinstance(state, dict):
            continue
        for i, catcher in enumerate(state.get("Catch") or []):
            if not isinstance(catcher, dict):
                continue
            for err in catcher.get("ErrorEquals") or []:
                if isinstance(err, str) and err not in (*ACTION_ERRORS, ALL_ERRORS):
                    warnings.append(
                        f"{_where(name)}: Catch[{i}] names error {err!r}, which an Action "
                        f"never raises (known: {', '.join((*ACTION_ERRORS, ALL_ERRORS))})"
                    )
        if (
            state.get("Type") in ("Action", "Pass", "ExpressionEval")
            and state.get("ResultPath", "$") == "$"
            and state.get("Type") != "Pass"
        ):
            warnings.append(
                f"{_where(name)}: no ResultPath, so its result replaces the whole flow state"
            )
    return warnings


def check_definition(definition: Any) -> None:
    """Raise :class:`FlowDefinitionError` if the service would refuse ``definition``."""
    problems = validate_definition(definition)
    if problems:
        raise FlowDefinitionError(problems)


def validate_input(body: Any, schema: dict[str, Any] | None) -> list[str]:
    """Problems with a run's input against the flow's input schema (JSON Schema; the
    ``$schema`` it declares, else Draft 7 as Globus's own tooling uses)."""
    if schema is None:
        return [] if isinstance(body, dict) else ["input: the run input must be a JSON object"]
    cls = validator_for(schema, default=jsonschema.Draft7Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return [f"input schema is not a valid JSON Schema: {exc.message}"]
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    problems = []
    for error in sorted(validator.iter_errors(body), key=lambda e: list(map(str, e.path))):
        where = "input" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.path)
        problems.append(f"{where}: {error.message}")
    if not problems and not isinstance(body, dict):
        problems.append("input: the run input must be a JSON object")
    return problems
