"""What a local flow run ends with, and how its states fail: the :class:`RunResult` the
interpreter hands back, the States Language's ``Error``/``Cause`` pair
(:class:`StateFailure`), a cancelled run (:class:`RunCanceled`), and the values the service
keeps out of logs and outputs (``_private*`` keys)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field

RunStatus = Literal["ACTIVE", "INACTIVE", "SUCCEEDED", "FAILED", "ENDED"]
LogListener = Callable[[dict[str, Any]], None]


class RunResult(BaseModel):
    run_id: str
    flow_id: str
    status: RunStatus
    output: Any = None
    log: list[dict[str, Any]] = Field(default_factory=list)
    error: dict[str, Any] | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None
    tags: list[str] = Field(default_factory=list)
    start_time: str
    completion_time: str | None = None


class StateFailure(Exception):
    """An error raised by a state: ``Error``/``Cause`` as the States Language has them."""

    def __init__(self, error: str, cause: str, *, catchable: bool = True) -> None:
        super().__init__(f"{error}: {cause}")
        self.error = error
        self.cause = cause
        self.catchable = catchable

    def error_object(self) -> dict[str, str]:
        return {"Error": self.error, "Cause": self.cause}


class RunCanceled(Exception):
    """The run was asked to stop; it ends ENDED."""


def runtime_failure(message: str) -> StateFailure:
    """A fault in the definition's own plumbing (``States.Runtime``): no Catch handles it."""
    return StateFailure("States.Runtime", message, catchable=False)


def strip_private(value: Any) -> Any:
    """The value without ``_private*`` keys (hidden from introspection, per Globus)."""
    if isinstance(value, dict):
        return {
            k: strip_private(v)
            for k, v in value.items()
            if not (isinstance(k, str) and k.startswith("_private"))
        }
    if isinstance(value, list):
        return [strip_private(v) for v in value]
    return value


def cause_text(value: Any) -> str:
    """A Cause as the States Language holds it: a string (JSON for anything else)."""
    return value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
