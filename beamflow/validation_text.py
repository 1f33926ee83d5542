"""How a pydantic ``ValidationError`` is told to a user: one short line per problem, naming
the field as the user wrote it (``reconstruction.iterations``), the problem, and, where it
helps, the value that was given. The one way every boundary (config, run parameters, files,
flow actions, the compute function) words a validation failure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

__all__ = ["field_path", "validation_text"]


def field_path(error: Any, *, skip: Iterable[str] = (), root: str = "value") -> str:
    """The dotted field name of one of ``exc.errors()`` (``root`` when it has none)."""
    hidden = set(skip)
    return ".".join(str(part) for part in error["loc"] if part not in hidden) or root


def validation_text(
    exc: ValidationError,
    *,
    skip: Iterable[str] = (),
    root: str = "value",
    show_input: bool = False,
    first_only: bool = False,
) -> str:
    """``field: problem`` for each error (``(got X)`` with ``show_input``), joined by ``; ``.
    ``skip`` hides wrapper fields the user never wrote (e.g. ``params``). A check of several
    fields together (a model's validator) names its fields in its own words: it is told
    without a field, and without pydantic's "Value error, " prefix."""
    skip = tuple(skip)
    errors = exc.errors()[:1] if first_only else exc.errors()
    parts = []
    for error in errors:
        problem = error["msg"].removeprefix("Value error, ")
        path = field_path(error, skip=skip, root="")
        if not path and error["type"] == "value_error":
            text = problem
        else:
            text = f"{path or root}: {problem}"
        if show_input and "input" in error:
            text += f" (got {error['input']!r})"
        parts.append(text)
    return "; ".join(parts)
