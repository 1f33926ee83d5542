"""Choice-rule tests of the States Language (states-language.net), as Globus Flows runs them:
the type tests (``IsNull``, ``IsNumeric``, ...) and the comparisons of the String, Numeric,
Boolean and Timestamp families. A value of the wrong type makes a comparison false."""

from __future__ import annotations

import re
from typing import Any

from beamflow.local.validation import parse_timestamp

_FAMILIES = ("String", "Numeric", "Boolean", "Timestamp")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _string_matches(value: str, pattern: str) -> bool:
    """ASL StringMatches: ``*`` matches any run of characters; ``\\*`` and ``\\\\`` are a
    literal star and backslash."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern) and pattern[i + 1] in "*\\":
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "*" else re.escape(ch))
        i += 1
    return re.fullmatch("".join(out), value, flags=re.DOTALL) is not None


def type_test(op: str, value: Any) -> bool:
    """``IsNull``, ``IsNumeric``, ``IsString``, ``IsBoolean`` or ``IsTimestamp`` of ``value``."""
    return {
        "IsNull": value is None,
        "IsNumeric": _is_number(value),
        "IsString": isinstance(value, str),
        "IsBoolean": isinstance(value, bool),
        "IsTimestamp": parse_timestamp(value) is not None,
    }[op]


def compare(op: str, value: Any, expected: Any) -> bool:
    """A comparison operator without its ``Path`` suffix, e.g. ``NumericLessThan``."""
    family = next(f for f in _FAMILIES if op.startswith(f))
    comparison = op[len(family) :]
    if family == "String":
        if not isinstance(value, str) or not isinstance(expected, str):
            return False
        if comparison == "Matches":
            return _string_matches(value, expected)
        left, right = value, expected
    elif family == "Numeric":
        if not _is_number(value) or not _is_number(expected):
            return False
        left, right = value, expected
    elif family == "Boolean":
        return isinstance(value, bool) and isinstance(expected, bool) and value == expected
    else:
        left, right = parse_timestamp(value), parse_timestamp(expected)
        if left is None or right is None:
            return False
    return {
        "Equals": left == right,
        "LessThan": left < right,
        "GreaterThan": left > right,
        "LessThanEquals": left <= right,
        "GreaterThanEquals": left >= right,
    }[comparison]
