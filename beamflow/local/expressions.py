"""A safe evaluator for Globus Flows expressions (``"key.=": "<expression>"``).

The language is the Python-like one the Globus Flows documentation describes ("Expressions";
globus-automate-client ``docs/source/authoring_flows.rst``, "Expressions in Parameters"):

* state values are bare names, with ``.`` for object keys and ``[i]`` / ``['k']`` / slices
  for items: ``input.folder_list[1:]``, ``object_val.sub_val1``, ``_context.run_id``;
* constants: strings in single or double quotes, numbers, ``True``/``False``/``None``,
  list and dict literals (``{'id': input.src.id, 'path': p}``);
* operators: ``+ - * / // % **``, comparisons (``== != < <= > >= in not in``),
  ``and`` / ``or`` / ``not``, ``x if c else y``; ``+`` also joins strings and lists;
* functions: ``pathsplit(p)`` → ``[dir, last]`` (aware of the Transfer root ``/~/``),
  ``is_present('a.b')``, ``getattr('a.b', default)`` (the ones Globus documents), and
  ``len``, ``str``, ``int``, ``float``.

Safety: the text is parsed with :func:`ast.parse` only to get a syntax tree, which this
module walks itself over an allow-list of node types. Nothing is ever compiled to a code
object, passed to ``eval``/``exec``, or looked up with Python's ``getattr``: ``a.b`` is a
dictionary lookup in the flow state, so there are no objects whose attributes could leak.
Dunder names, lambdas, comprehensions, f-strings, starred arguments, keyword arguments,
method calls and calls to anything but the functions above are rejected when the
expression is parsed (so ``flows validate`` reports them before anything runs). Sizes are
bounded (source length, string and list results, exponents) so a definition cannot make
the interpreter burn memory or CPU.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from typing import Any

from beamflow.local.jsonpath import (
    CONTEXT_KEY,
    JSONPathError,
    PathNotFound,
    get_value,
    has_value,
)

MAX_SOURCE_LENGTH = 10_000
MAX_SEQUENCE_LENGTH = 1_000_000  # characters of a string / items of a list built by an operator
MAX_EXPONENT = 10_000
MAX_INT_DIGITS = 4_300  # Python's own str<->int conversion limit


class ExpressionError(ValueError):
    """An expression is malformed, uses something not allowed, or failed to evaluate."""


_BINOPS: dict[type, str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_CMPOPS: dict[type, str] = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
}
FUNCTIONS = ("pathsplit", "is_present", "getattr", "len", "str", "int", "float")

_REJECTED_NODES: dict[type, str] = {
    ast.Lambda: "lambda functions",
    ast.ListComp: "comprehensions",
    ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions",
    ast.GeneratorExp: "generator expressions",
    ast.NamedExpr: "assignment expressions (:=)",
    ast.JoinedStr: "f-strings",
    ast.FormattedValue: "f-strings",
    ast.Starred: "starred arguments",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield",
    ast.Set: "set literals",
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _describe(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - only for messages
        return type(node).__name__


class Expression:
    """A parsed, checked expression; :meth:`evaluate` it against a flow state."""

    def __init__(self, source: str) -> None:
        if not isinstance(source, str):
            raise ExpressionError(f"an expression must be a string, not {type(source).__name__}")
        if len(source) > MAX_SOURCE_LENGTH:
            raise ExpressionError(f"expression longer than {MAX_SOURCE_LENGTH} characters")
        self.source = source
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(f"syntax error in {source!r}: {exc.msg}") from None
        except (RecursionError, MemoryError, ValueError) as exc:
            raise ExpressionError(f"cannot parse {source!r}: {exc}") from None
        self._tree = tree.body
        try:
            self._check(self._tree)
        except RecursionError:
            raise ExpressionError(f"expression {source!r} is nested too deeply") from None

    # -- static check ----------------------------------------------------------------------
    def _reject(self, node: ast.AST, what: str) -> None:
        raise ExpressionError(f"{what} not allowed in expressions: {_describe(node)!r}")

    def _check(self, node: ast.AST) -> None:
        for kind, what in _REJECTED_NODES.items():
            if isinstance(node, kind):
                self._reject(node, what)
        if isinstance(node, ast.Constant):
            if not (node.value is None or isinstance(node.value, bool | int | float | str)):
                self._reject(node, f"{type(node.value).__name__} constants")
            return
        if isinstance(node, ast.Name):
            if node.id.startswith("__"):
                self._reject(node, "double-underscore names")
            return
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("__"):
                self._reject(node, "double-underscore attributes")
            self._check(node.value)
            return
        if isinstance(node, ast.Subscript):
            self._check(node.value)
            self._check(node.slice)
            return
        if isinstance(node, ast.Slice):
            for part in (node.lower, node.upper, node.step):
                if part is not None:
                    self._check(part)
            return
        if isinstance(node, ast.List | ast.Tuple):
            for elt in node.elts:
                self._check(elt)
            return
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if key is None:
                    self._reject(node, "'**' unpacking")
                self._check(key)  # type: ignore[arg-type]
                self._check(value)
            return
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                self._reject(node, f"the operator {type(node.op).__name__}")
            self._check(node.left)
            self._check(node.right)
            return
        if isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.USub | ast.UAdd | ast.Not):
                self._reject(node, f"the operator {type(node.op).__name__}")
            self._check(node.operand)
            return
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self._check(value)
            return
        if isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _CMPOPS:
                    self._reject(node, f"the comparison {type(op).__name__}")
            self._check(node.left)
            for comp in node.comparators:
                self._check(comp)
            return
        if isinstance(node, ast.IfExp):
            self._check(node.test)
            self._check(node.body)
            self._check(node.orelse)
            return
        if isinstance(node, ast.Call):
            # Check the callee first, so `x.__class__.f()` is reported for its dunder.
            self._check(node.func)
            if not isinstance(node.func, ast.Name):
                self._reject(node, "method calls")
            name = node.func.id  # type: ignore[union-attr]
            if name not in FUNCTIONS:
                self._reject(node, f"calls to {name!r} (only {', '.join(FUNCTIONS)} may be called)")
            if node.keywords:
                self._reject(node, "keyword arguments")
            for arg in node.args:
                self._check(arg)
            return
        self._reject(node, type(node).__name__)

    # -- evaluation ------------------------------------------------------------------------
    def evaluate(self, state: Any, context: Mapping[str, Any] | None = None) -> Any:
        """The value of the expression; names resolve in ``state`` (``_context`` in
        ``context``). Raises :class:`ExpressionError` with the reason on failure."""
        env = _Env(state, dict(context) if context is not None else None)
        try:
            return env.eval(self._tree)
        except ExpressionError as exc:
            raise ExpressionError(f"{self.source!r}: {exc}") from None
        except RecursionError:
            raise ExpressionError(f"{self.source!r}: nested too deeply") from None


class _Env:
    def __init__(self, state: Any, context: dict[str, Any] | None) -> None:
        self.state = state
        self.context = context
        self.functions: dict[str, Callable[..., Any]] = {
            "pathsplit": _pathsplit,
            "is_present": self._is_present,
            "getattr": self._getattr,
            "len": _len,
            "str": _str,
            "int": _int,
            "float": _float,
        }

    def _lookup_path(self, path: str) -> str:
        if not isinstance(path, str):
            raise ExpressionError(f"a state path must be a string, not {type(path).__name__}")
        return path if path.startswith("$") else "$." + path

    def _is_present(self, *args: Any) -> bool:
        if len(args) != 1:
            raise ExpressionError(f"is_present() takes 1 argument ({len(args)} given)")
        try:
            return has_value(self.state, self._lookup_path(args[0]), self.context)
        except JSONPathError as exc:
            raise ExpressionError(f"is_present(): {exc}") from None

    def _getattr(self, *args: Any) -> Any:
        if len(args) not in (1, 2):
            raise ExpressionError(f"getattr() takes 1 or 2 arguments ({len(args)} given)")
        default = args[1] if len(args) == 2 else None
        try:
            return get_value(self.state, self._lookup_path(args[0]), self.context)
        except PathNotFound:
            return default
        except JSONPathError as exc:
            raise ExpressionError(f"getattr(): {exc}") from None

    def eval(self, node: ast.AST) -> Any:  # noqa: C901 - one branch per node type
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.Attribute):
            base = self.eval(node.value)
            if not isinstance(base, dict):
                raise ExpressionError(
                    f"{_describe(node.value)!r} is {_typename(base)}, so it has no key "
                    f"{node.attr!r}"
                )
            if node.attr not in base:
                raise ExpressionError(f"{_describe(node.value)!r} has no key {node.attr!r}")
            return base[node.attr]
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, ast.List | ast.Tuple):
            return [self.eval(elt) for elt in node.elts]
        if isinstance(node, ast.Dict):
            out: dict[Any, Any] = {}
            for key_node, value_node in zip(node.keys, node.values, strict=True):
                key = self.eval(key_node)  # type: ignore[arg-type]
                if not isinstance(key, str):
                    raise ExpressionError(f"dict keys must be strings, not {_typename(key)}")
                out[key] = self.eval(value_node)
            return out
        if isinstance(node, ast.BinOp):
            return _binop(type(node.op), self.eval(node.left), self.eval(node.right))
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(node.operand)
            if isinstance(node.op, ast.Not):
                return not operand
            if not _is_number(operand):
                raise ExpressionError(f"unary minus/plus needs a number, not {_typename(operand)}")
            return -operand if isinstance(node.op, ast.USub) else +operand
        if isinstance(node, ast.BoolOp):
            # Short-circuit, Python-style: the deciding value is returned.
            value: Any = None
            for sub in node.values:
                value = self.eval(sub)
                if isinstance(node.op, ast.And) and not value:
                    return value
                if isinstance(node.op, ast.Or) and value:
                    return value
            return value
        if isinstance(node, ast.Compare):
            left = self.eval(node.left)
            for op, comp_node in zip(node.ops, node.comparators, strict=True):
                right = self.eval(comp_node)
                if not _compare(type(op), left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.eval(node.body) if self.eval(node.test) else self.eval(node.orelse)
        if isinstance(node, ast.Call):
            func = self.functions[node.func.id]  # type: ignore[union-attr]
            return func(*[self.eval(arg) for arg in node.args])
        raise ExpressionError(f"cannot evaluate {_describe(node)!r}")  # checked earlier

    def _name(self, name: str) -> Any:
        if name == CONTEXT_KEY and self.context is not None:
            return self.context
        if isinstance(self.state, dict) and name in self.state:
            return self.state[name]
        if name in ("True", "False", "None"):  # pragma: no cover - parsed as constants
            return {"True": True, "False": False, "None": None}[name]
        raise ExpressionError(f"{name!r} is not present in the flow state")

    def _subscript(self, node: ast.Subscript) -> Any:
        base = self.eval(node.value)
        if isinstance(node.slice, ast.Slice):
            if not isinstance(base, list | str):
                raise ExpressionError(f"cannot slice {_typename(base)}")
            parts = []
            for part in (node.slice.lower, node.slice.upper, node.slice.step):
                value = None if part is None else self.eval(part)
                if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                    raise ExpressionError(f"slice bounds must be integers, not {_typename(value)}")
                parts.append(value)
            if parts[2] == 0:
                raise ExpressionError("slice step cannot be zero")
            return base[slice(*parts)]
        key = self.eval(node.slice)
        if isinstance(base, dict):
            if not isinstance(key, str):
                raise ExpressionError(f"object keys are strings, not {_typename(key)}")
            if key not in base:
                raise ExpressionError(f"{_describe(node.value)!r} has no key {key!r}")
            return base[key]
        if isinstance(base, list | str):
            if not isinstance(key, int) or isinstance(key, bool):
                raise ExpressionError(f"list indexes must be integers, not {_typename(key)}")
            try:
                return base[key]
            except IndexError:
                raise ExpressionError(
                    f"index {key} out of range for {_describe(node.value)!r} ({len(base)} items)"
                ) from None
        raise ExpressionError(f"{_describe(node.value)!r} is {_typename(base)}; cannot index it")


def _typename(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _check_size(value: Any) -> Any:
    if isinstance(value, str | list) and len(value) > MAX_SEQUENCE_LENGTH:
        raise ExpressionError(f"result longer than {MAX_SEQUENCE_LENGTH} items")
    return value


def _binop(op: type, left: Any, right: Any) -> Any:
    sym = _BINOPS[op]
    if op is ast.Add:
        if _is_number(left) and _is_number(right):
            return left + right
        if isinstance(left, str) and isinstance(right, str):
            return _check_size(left + right)
        if isinstance(left, list) and isinstance(right, list):
            return _check_size(left + right)
        raise ExpressionError(f"cannot add {_typename(left)} and {_typename(right)}")
    if op is ast.Mult:
        for seq, times in ((left, right), (right, left)):
            if (
                isinstance(seq, str | list)
                and isinstance(times, int)
                and not isinstance(times, bool)
            ):
                if len(seq) * max(times, 0) > MAX_SEQUENCE_LENGTH:
                    raise ExpressionError(f"result longer than {MAX_SEQUENCE_LENGTH} items")
                return seq * times
    if not (_is_number(left) and _is_number(right)):
        raise ExpressionError(
            f"'{sym}' needs numbers, not {_typename(left)} and {_typename(right)}"
        )
    try:
        if op is ast.Sub:
            return left - right
        if op is ast.Mult:
            return left * right
        if op is ast.Div:
            return left / right
        if op is ast.FloorDiv:
            return left // right
        if op is ast.Mod:
            return left % right
        if op is ast.Pow:
            if abs(right) > MAX_EXPONENT:
                raise ExpressionError(f"exponent larger than {MAX_EXPONENT}")
            result = left**right
            if isinstance(result, complex):
                raise ExpressionError("result is not a real number")
            if isinstance(result, int) and result.bit_length() > MAX_INT_DIGITS * 4:
                raise ExpressionError("result too large")
            return result
    except ZeroDivisionError:
        raise ExpressionError("division by zero") from None
    except OverflowError:
        raise ExpressionError("numeric overflow") from None
    raise ExpressionError(f"unsupported operator {sym}")  # pragma: no cover


def _compare(op: type, left: Any, right: Any) -> bool:
    if op is ast.Eq:
        return bool(left == right)
    if op is ast.NotEq:
        return bool(left != right)
    if op in (ast.In, ast.NotIn):
        if isinstance(right, str):
            if not isinstance(left, str):
                raise ExpressionError(f"'in <string>' needs a string, not {_typename(left)}")
            found = left in right
        elif isinstance(right, list | dict):
            found = left in right
        else:
            raise ExpressionError(f"'in' needs a list, object or string, not {_typename(right)}")
        return found if op is ast.In else not found
    ordered = (_is_number(left) and _is_number(right)) or (
        type(left) is type(right) and isinstance(left, str | list)
    )
    if not ordered:
        raise ExpressionError(
            f"cannot compare {_typename(left)} and {_typename(right)} with '{_CMPOPS[op]}'"
        )
    try:
        if op is ast.Lt:
            return bool(left < right)
        if op is ast.LtE:
            return bool(left <= right)
        if op is ast.Gt:
            return bool(left > right)
        return bool(left >= right)
    except TypeError as exc:  # lists of mixed items
        raise ExpressionError(str(exc)) from None


def _pathsplit(*args: Any) -> list[str]:
    """``/foo/bar/blech`` → ``['/foo/bar', 'blech']``; ``/~/path`` → ``['/~/', 'path']``:
    the Transfer home ``/~/`` is never split (Globus "Using Functions in Expressions")."""
    if len(args) != 1 or not isinstance(args[0], str):
        raise ExpressionError("pathsplit() takes one string argument")
    path = args[0]
    if path in ("/", "/~/", "~/", ""):
        return [path, ""]
    trimmed = path.rstrip("/") or "/"
    head, sep, tail = trimmed.rpartition("/")
    if not sep:
        return ["", tail]
    if head == "/~" or head == "~":
        return [head + "/", tail]
    return [head or "/", tail]


def _len(*args: Any) -> int:
    if len(args) != 1 or not isinstance(args[0], str | list | dict):
        raise ExpressionError("len() takes one string, list or object")
    return len(args[0])


def _str(*args: Any) -> str:
    if len(args) != 1:
        raise ExpressionError("str() takes one argument")
    value = args[0]
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 14_000:
        raise ExpressionError("number too large to convert to a string")
    return _check_size(str(value))


def _int(*args: Any) -> int:
    if len(args) != 1:
        raise ExpressionError("int() takes one argument")
    value = args[0]
    if isinstance(value, str) and len(value) > MAX_INT_DIGITS:
        raise ExpressionError("string too long to convert to a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError(f"cannot convert {value} to an integer")
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ExpressionError(f"int() needs a string or number, not {_typename(value)}")
    try:
        return int(value)
    except ValueError:
        raise ExpressionError(f"int(): {value!r} is not an integer") from None


def _float(*args: Any) -> float:
    if len(args) != 1:
        raise ExpressionError("float() takes one argument")
    value = args[0]
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ExpressionError(f"float() needs a string or number, not {_typename(value)}")
    if isinstance(value, str) and len(value) > MAX_INT_DIGITS:
        raise ExpressionError("string too long to convert to a number")
    try:
        return float(value)
    except (ValueError, OverflowError):
        raise ExpressionError(f"float(): {value!r} is not a number") from None


_CACHE: dict[str, Expression] = {}


def parse_expression(source: str) -> Expression:
    """Parse and check ``source`` (cached); raises :class:`ExpressionError`."""
    expr = _CACHE.get(source) if isinstance(source, str) else None
    if expr is None:
        expr = Expression(source)
        if len(_CACHE) < 4096:
            _CACHE[source] = expr
    return expr


def check_expression(source: object) -> str | None:
    """None if ``source`` is an acceptable expression, else the reason it is not."""
    try:
        parse_expression(source)  # type: ignore[arg-type]
    except ExpressionError as exc:
        return str(exc)
    return None


def evaluate(source: str, state: Any, context: Mapping[str, Any] | None = None) -> Any:
    """Evaluate ``source`` against ``state`` (and ``_context``)."""
    return parse_expression(source).evaluate(state, context)
