"""The strict JSONPath subset that Globus Flows definitions use.

Accepted: ``$`` (the whole flow state), ``.name``, ``['name']`` / ``["name"]`` and ``[index]``
(a non-negative integer), e.g. ``$.input.files[0]`` or ``$['odd key'].x``. Everything else in
the JSONPath family (wildcards ``*``, recursive descent ``..``, filters ``[?(...)]``, slices,
unions, negative indexes) is rejected with a message saying what is not supported: the
Amazon States Language ("Reference Paths", which Globus Flows follows) allows only single,
definite values, and a flow must behave the same here as on the service.

``$._context`` is the run context (run_id, flow_id, username, ...): read-only and virtual,
it is served from the ``context`` argument of :func:`get_value`, never stored in the state.
"""

from __future__ import annotations

import copy
import re
from typing import Any

Segment = str | int

CONTEXT_KEY = "_context"

_NAME = re.compile(r"[^.\[\]'\"\s*?@()$,:]+")
_INDEX = re.compile(r"\[(\d+)\]")
_QUOTED = re.compile(r"""\[(?:'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)")\]""")
_UNESCAPE = re.compile(r"\\(.)")

_MISSING = object()


class JSONPathError(ValueError):
    """A path is not in the JSONPath subset Globus Flows accepts."""


class PathNotFound(LookupError):
    """A well-formed path names nothing in the flow state."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def parse_path(path: object) -> tuple[Segment, ...]:
    """The segments of ``path`` (names and list indexes), or :class:`JSONPathError`."""
    if not isinstance(path, str):
        raise JSONPathError(f"a JSONPath must be a string, not {type(path).__name__}")
    if not path.startswith("$"):
        raise JSONPathError(f"{path!r} must start with '$' (e.g. '$.input.name')")
    segments: list[Segment] = []
    pos = 1
    n = len(path)
    while pos < n:
        ch = path[pos]
        if path.startswith("..", pos):
            raise JSONPathError(f"{path!r}: recursive descent '..' is not supported")
        if ch == ".":
            m = _NAME.match(path, pos + 1)
            if m is None:
                rest = path[pos + 1 : pos + 2]
                if rest == "*":
                    raise JSONPathError(f"{path!r}: wildcards '*' are not supported")
                raise JSONPathError(
                    f"{path!r}: expected a name after '.' at position {pos + 1}"
                    + (f" (found {rest!r})" if rest else "")
                )
            segments.append(m.group(0))
            pos = m.end()
            continue
        if ch == "[":
            m = _INDEX.match(path, pos)
            if m is not None:
                segments.append(int(m.group(1)))
                pos = m.end()
                continue
            m = _QUOTED.match(path, pos)
            if m is not None:
                raw = m.group(1) if m.group(1) is not None else m.group(2)
                segments.append(_UNESCAPE.sub(r"\1", raw))
                pos = m.end()
                continue
            inner = path[pos + 1 : path.find("]", pos) if "]" in path[pos:] else n]
            if inner.startswith("?") or inner.startswith("("):
                what = "filter and script expressions"
            elif inner.strip() == "*":
                what = "wildcards '*'"
            elif ":" in inner:
                what = "slices"
            elif "," in inner:
                what = "unions"
            elif inner.lstrip().startswith("-"):
                what = "negative indexes"
            else:
                what = f"the bracket expression [{inner}]"
            raise JSONPathError(f"{path!r}: {what} are not supported in flow paths")
        raise JSONPathError(f"{path!r}: unexpected {ch!r} at position {pos}")
    return tuple(segments)


def check_path(path: object) -> str | None:
    """None if ``path`` is acceptable, else the reason it is not."""
    try:
        parse_path(path)
    except JSONPathError as exc:
        return str(exc)
    return None


def is_context_path(path: str) -> bool:
    """Whether ``path`` points into the read-only ``$._context``."""
    try:
        segments = parse_path(path)
    except JSONPathError:
        return False
    return bool(segments) and segments[0] == CONTEXT_KEY


def format_path(segments: tuple[Segment, ...]) -> str:
    out = "$"
    for seg in segments:
        if isinstance(seg, int):
            out += f"[{seg}]"
        elif _NAME.fullmatch(seg):
            out += f".{seg}"
        else:
            escaped = seg.replace("\\", "\\\\").replace("'", "\\'")
            out += f"['{escaped}']"
    return out


def _step(value: Any, seg: Segment) -> Any:
    if isinstance(seg, int):
        if isinstance(value, list) and seg < len(value):
            return value[seg]
        return _MISSING
    if isinstance(value, dict) and seg in value:
        return value[seg]
    return _MISSING


def get_value(data: Any, path: str, context: dict[str, Any] | None = None) -> Any:
    """The value at ``path`` in ``data``; ``$._context...`` reads ``context``.

    Raises :class:`JSONPathError` for a bad path and :class:`PathNotFound` when it names
    nothing (the message says how far it got).
    """
    segments = parse_path(path)
    value = data
    start = 0
    if segments and segments[0] == CONTEXT_KEY and context is not None:
        value = context
        start = 1
    for i in range(start, len(segments)):
        seg = segments[i]
        nxt = _step(value, seg)
        if nxt is _MISSING:
            where = format_path(segments[:i])
            if isinstance(seg, int):
                if isinstance(value, list):
                    reason = f"index {seg} is out of range ({where} has {len(value)} items)"
                else:
                    reason = f"{where} is not a list"
            elif isinstance(value, dict):
                reason = f"{where} has no key {seg!r}"
            else:
                reason = f"{where} is not an object"
            raise PathNotFound(path, reason)
        value = nxt
    return value


def has_value(data: Any, path: str, context: dict[str, Any] | None = None) -> bool:
    try:
        get_value(data, path, context)
    except PathNotFound:
        return False
    return True


def set_value(data: Any, path: str, value: Any) -> Any:
    """``data`` with ``value`` written at ``path`` (ResultPath semantics); returns the new root.

    ``$`` replaces the whole state. Missing objects along the way are created; an existing
    non-object in the way, or an index past the end of a list, is an error (the States
    Language does not invent list items). ``data`` is not modified.
    """
    segments = parse_path(path)
    if not segments:
        return copy.deepcopy(value)
    if segments[0] == CONTEXT_KEY:
        raise JSONPathError(f"{path!r}: $._context is read-only")
    root = copy.deepcopy(data) if isinstance(data, dict | list) else {}
    if isinstance(segments[0], int) and not isinstance(root, list):
        raise PathNotFound(path, "$ is not a list")
    if isinstance(segments[0], str) and not isinstance(root, dict):
        root = {}
    node: Any = root
    for i, seg in enumerate(segments[:-1]):
        nxt_seg = segments[i + 1]
        where = format_path(segments[: i + 1])
        if isinstance(seg, int):
            if not isinstance(node, list) or seg >= len(node):
                raise PathNotFound(path, f"{where} does not exist (lists are not extended)")
            child = node[seg]
        else:
            child = node.get(seg)
            if child is None:
                child = [] if isinstance(nxt_seg, int) else {}
                node[seg] = child
        if isinstance(nxt_seg, int) and not isinstance(child, list):
            raise PathNotFound(path, f"{where} is not a list")
        if isinstance(nxt_seg, str) and not isinstance(child, dict):
            raise PathNotFound(path, f"{where} is not an object")
        node = child
    last = segments[-1]
    if isinstance(last, int):
        if last >= len(node):
            raise PathNotFound(path, f"index {last} is out of range (lists are not extended)")
        node[last] = copy.deepcopy(value)
    else:
        node[last] = copy.deepcopy(value)
    return root
