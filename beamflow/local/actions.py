"""The action-provider interface of the local flow interpreter: what a provider (compute,
transfer, the flow tool) implements and what it returns. The service behind Globus Flows
speaks the Action Provider HTTP API; locally the same documents pass as Python calls::

    start(body: dict, context: RunContext) -> ActionStatus
    status(action_id: str) -> ActionStatus
    cancel(action_id: str) -> ActionStatus

A provider that cannot start an action raises (:class:`ActionUnableToRunError` to pass a
structured error, or any exception).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ValidationError

from beamflow.validation_text import validation_text

Request = TypeVar("Request", bound=BaseModel)


def iso_time(ts: float | None) -> str | None:
    """A POSIX time as the ISO 8601 UTC string the Globus services write (None stays None)."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


class ActionStatus(BaseModel):
    """An action's status document, as the Action Provider API returns it."""

    action_id: str
    status: Literal["ACTIVE", "INACTIVE", "SUCCEEDED", "FAILED"]
    start_time: str | None = None
    completion_time: str | None = None
    details: Any = None
    display_status: str | None = None
    creator_id: str | None = None
    label: str | None = None

    def document(self) -> dict[str, Any]:
        doc = self.model_dump(mode="json")
        if doc["display_status"] is None:
            doc["display_status"] = self.status
        # Through JSON, so the flow state stays plain JSON whatever a provider put in details.
        return json.loads(json.dumps(doc, default=str))


@dataclass(frozen=True)
class RunContext:
    """What a provider learns about the run that starts an action."""

    run_id: str
    flow_id: str
    state_name: str
    label: str | None = None
    tags: tuple[str, ...] = ()
    username: str | None = None
    user_id: str | None = None


class ActionUnableToRunError(Exception):
    """Raised by a provider's ``start`` when it refuses the action; ``details`` is the error
    structure that becomes the ``Cause`` of ``ActionUnableToRun``."""

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.details = details


def bad_request(message: str) -> ActionUnableToRunError:
    """A refusal of the request itself: the ``BadRequest`` error Globus's providers return."""
    return ActionUnableToRunError(message, {"code": "BadRequest", "description": message})


def parse_request(model: type[Request], body: dict[str, Any], what: str) -> Request:
    """A provider's request body as its model; every problem in one ``BadRequest`` refusal
    ("invalid transfer request: body.DATA: ...")."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = validation_text(exc, root="body")
        raise bad_request(f"invalid {what} request: {problems}") from None


@runtime_checkable
class ActionProvider(Protocol):
    def start(self, body: dict[str, Any], context: RunContext) -> ActionStatus: ...

    def status(self, action_id: str) -> ActionStatus: ...

    def cancel(self, action_id: str) -> ActionStatus: ...


def normalize_action_url(url: str) -> str:
    """ActionUrls with and without a trailing slash name the same provider."""
    return url.rstrip("/")
