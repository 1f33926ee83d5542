"""The JSONPath subset and the safe expression evaluator of the local flow interpreter."""

from __future__ import annotations

import re

import pytest

from beamflow.local.expressions import ExpressionError, check_expression, evaluate
from beamflow.local.jsonpath import (
    JSONPathError,
    PathNotFound,
    get_value,
    parse_path,
    set_value,
)

STATE = {
    "foo": "bar",
    "list_val": [1, 2, 3],
    "object_val": {"sub_val1": "embedded", "sub_val2": "also_embedded"},
    "input": {
        "folder_list": ["/a", "/b", "/c"],
        "src": {"id": "c0ffee", "path": "/~/data/scan_001/"},
        "n": 7,
        "weird key": {"x": 1},
    },
}
CONTEXT = {"run_id": "run-123", "flow_id": "flow-9", "username": "ada"}


# -- JSONPath -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("$", STATE),
        ("$.foo", "bar"),
        ("$.list_val[0]", 1),
        ("$.object_val.sub_val2", "also_embedded"),
        ("$['input']['weird key'].x", 1),
        ('$["input"].src.id', "c0ffee"),
        ("$.input.folder_list[2]", "/c"),
        ("$._context.run_id", "run-123"),
    ],
)
def test_jsonpath_reads_values(path, expected):
    assert get_value(STATE, path, CONTEXT) == expected


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("foo", "must start with '$'"),
        ("$..foo", "recursive descent"),
        ("$.list_val[*]", "wildcards"),
        ("$.*", "wildcards"),
        ("$.list_val[?(@ > 1)]", "filter"),
        ("$.list_val[0:2]", "slices"),
        ("$.list_val[0,1]", "unions"),
        ("$.list_val[-1]", "negative"),
        ("$.", "expected a name"),
        ("$foo", "unexpected"),
    ],
)
def test_jsonpath_rejects_what_flows_do_not_support(path, reason):
    with pytest.raises(JSONPathError, match=re.escape(reason)):
        parse_path(path)


def test_jsonpath_missing_value_says_where_it_stopped():
    with pytest.raises(PathNotFound, match=r"\$\.object_val has no key 'nope'"):
        get_value(STATE, "$.object_val.nope.deeper")
    with pytest.raises(PathNotFound, match="index 5 is out of range"):
        get_value(STATE, "$.list_val[5]")


def test_set_value_creates_objects_and_root_replaces_everything():
    data = {"a": 1}
    out = set_value(data, "$.result.transfer", {"ok": True})
    assert out == {"a": 1, "result": {"transfer": {"ok": True}}}
    assert data == {"a": 1}, "the input must not be modified"
    assert set_value(data, "$", [1]) == [1]
    assert set_value({"l": [0, 0]}, "$.l[1]", 5) == {"l": [0, 5]}
    with pytest.raises(JSONPathError, match="read-only"):
        set_value(data, "$._context.x", 1)
    with pytest.raises(PathNotFound, match="not an object"):
        set_value({"a": 1}, "$.a.b", 2)


# -- expressions ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("foo + ' ' + object_val.sub_val1", "bar embedded"),  # the Globus docs' example
        ("'Run ' + _context.run_id", "Run run-123"),
        ("list_val + [4]", [1, 2, 3, 4]),
        ("input.folder_list[1:]", ["/b", "/c"]),
        ("input.folder_list[-1]", "/c"),
        ("input['weird key']['x']", 1),
        ("{'id': input.src.id, 'path': input.folder_list[0]}", {"id": "c0ffee", "path": "/a"}),
        ("input.n * 2 - 1", 13),
        ("input.n / 2", 3.5),
        ("input.n // 2", 3),
        ("input.n % 4", 3),
        ("2 ** 10", 1024),
        ("-input.n", -7),
        ("input.n > 5 and foo == 'bar'", True),
        ("not (input.n > 5)", False),
        ("input.n < 5 or 'fallback'", "fallback"),
        ("1 < input.n <= 7", True),
        ("'b' in foo", True),
        ("'z' in foo", False),
        ("2 in list_val", True),
        ("'x' not in object_val", True),
        ("'big' if input.n > 5 else 'small'", "big"),
        ("x if is_present('x') else 10", 10),  # documented pattern: no error for missing x
        ("is_present('object_val.sub_val1')", True),
        ("is_present('input.folder_list[9]')", False),
        ("getattr('x', 10)", 10),
        ("getattr('missing_property')", None),
        ("getattr('input.src.id', 'none')", "c0ffee"),
        ("pathsplit('/foo/bar/blech')", ["/foo/bar", "blech"]),
        ("pathsplit('/~/path')", ["/~/", "path"]),
        ("pathsplit(input.src.path)[1]", "scan_001"),
        ("len(list_val)", 3),
        ("str(input.n) + 's'", "7s"),
        ("int('42') + 1", 43),
        ("float('2.5')", 2.5),
        ("None", None),
        ("True", True),
        ("[1, 'a', None]", [1, "a", None]),
    ],
)
def test_expressions_evaluate_like_globus(source, expected):
    assert evaluate(source, STATE, CONTEXT) == expected


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("__import__('os')", "double-underscore"),
        ("__import__('os').system('true')", "double-underscore"),
        ("foo.__class__", "double-underscore"),
        ("foo.__class__.__mro__[1].__subclasses__()", "double-underscore"),
        ("().__class__", "double-underscore"),
        ("lambda: 1", "lambda"),
        ("[x for x in list_val]", "comprehension"),
        ("{k: 1 for k in list_val}", "comprehension"),
        ("(x for x in list_val)", "generator"),
        ("eval('1')", "calls to 'eval'"),
        ("exec('1')", "calls to 'exec'"),
        ("open('/etc/passwd')", "calls to 'open'"),
        ("foo.upper()", "method calls"),
        ("getattr('foo', default=1)", "keyword arguments"),
        ("len(*list_val)", "starred"),
        ("f'{foo}'", "f-strings"),
        ("(y := 1)", "assignment"),
        ("{1, 2}", "set literals"),
        ("b'bytes'", "bytes constants"),
        ("foo = 1", "syntax error"),
        ("foo +", "syntax error"),
        ("import os", "syntax error"),
    ],
)
def test_malicious_or_unsupported_expressions_are_rejected_when_parsed(source, reason):
    problem = check_expression(source)
    assert problem is not None and reason in problem
    with pytest.raises(ExpressionError, match=re.escape(reason)):
        evaluate(source, STATE, CONTEXT)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("missing + 1", "'missing' is not present in the flow state"),
        ("object_val.nope", "has no key 'nope'"),
        ("foo.bar", "is a string, so it has no key"),
        ("list_val[7]", "out of range"),
        ("1 / 0", "division by zero"),
        ("foo + 1", "cannot add a string and a number"),
        ("foo - 1", "needs numbers"),
        ("'a' * 10000000", "longer than"),
        ("9 ** 9 ** 9", "exponent larger"),
        ("int('x')", "not an integer"),
        ("foo < 1", "cannot compare"),
        ("pathsplit(1)", "one string"),
    ],
)
def test_expression_runtime_errors_are_clear(source, reason):
    assert check_expression(source) is None  # well-formed; fails only when evaluated
    with pytest.raises(ExpressionError, match=reason):
        evaluate(source, STATE, CONTEXT)


def test_attribute_access_is_a_dictionary_lookup_not_python_getattr():
    # `object_val.keys` would be a bound method in Python; in a flow it is a missing key.
    with pytest.raises(ExpressionError, match="has no key 'keys'"):
        evaluate("object_val.keys", STATE)
    assert evaluate("o.keys", {"o": {"keys": 3}}) == 3


def test_expressions_do_not_modify_the_state():
    state = {"l": [1, 2]}
    assert evaluate("l + [3]", state) == [1, 2, 3]
    assert state == {"l": [1, 2]}
