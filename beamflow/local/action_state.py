"""The Action state of a local flow run, as Globus Flows runs it: start the provider's action,
poll it with doubling back-off until it ends, cancel it at its ``WaitTime`` (default 300 s,
``ActionTimeout``), and raise ``ActionFailedException`` for a FAILED action unless
``ExceptionOnActionFailure`` is false. An action that cannot start is ``ActionUnableToRun``.
The service caps its back-off at 10 minutes; here ``max_poll_interval`` (10 s by default) so
local runs notice completion quickly."""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from typing import Any

from beamflow.local.actions import ActionProvider, ActionUnableToRunError, RunContext
from beamflow.local.clock import Clock
from beamflow.local.flow_run import RunCanceled, RunStatus, StateFailure, cause_text

log = logging.getLogger(__name__)

DEFAULT_WAIT_TIME = 300
MAX_STATUS_ERRORS = 5  # consecutive failed status polls before the action counts as failed


def run_action(
    state: dict[str, Any],
    body: Any,
    context: RunContext,
    provider: ActionProvider | None,
    *,
    clock: Clock,
    cancelled: threading.Event,
    poll_interval: float,
    max_poll_interval: float,
    on_status: Callable[[RunStatus], None],
) -> dict[str, Any]:
    """Run the action of ``state`` (named ``context.state_name``) with ``body`` to its end;
    return its final status document (with ``state_name``), what lands at the ResultPath.

    ``on_status`` hears the run's status while the action goes on (INACTIVE while the action
    waits on a person). Raises :class:`StateFailure` (the Error and its Cause) or
    :class:`RunCanceled` when ``cancelled`` is set (the action is cancelled first)."""
    name = context.state_name
    url = state["ActionUrl"]
    if provider is None:
        raise StateFailure("ActionUnableToRun", cause_text(
            {"code": "NoActionProvider", "description": f"no action provider for {url}"}))
    if not isinstance(body, dict):
        raise StateFailure("ActionUnableToRun", cause_text(
            {"code": "BadRequest", "description": "the action body must be a JSON object"}))
    started = clock.time()
    try:
        status = provider.start(copy.deepcopy(body), context)
    except ActionUnableToRunError as exc:
        details = exc.details if exc.details is not None else {"description": str(exc)}
        raise StateFailure("ActionUnableToRun", cause_text(details)) from None
    except Exception as exc:  # noqa: BLE001 - any refusal to start is ActionUnableToRun
        raise StateFailure("ActionUnableToRun", cause_text(
            {"code": type(exc).__name__, "description": str(exc)})) from None
    deadline = started + state.get("WaitTime", DEFAULT_WAIT_TIME)
    interval = poll_interval
    errors = 0
    while status.status in ("ACTIVE", "INACTIVE"):
        on_status("INACTIVE" if status.status == "INACTIVE" else "ACTIVE")
        if cancelled.is_set():
            _cancel(provider, status.action_id, context)
            raise RunCanceled
        now = clock.time()
        if now >= deadline:
            _cancel(provider, status.action_id, context)
            doc = status.document()
            doc["state_name"] = name
            raise StateFailure("ActionTimeout", cause_text(doc))
        if clock.sleep(min(interval, deadline - now), cancelled):
            continue
        interval = min(interval * 2, max_poll_interval)
        try:
            status = provider.status(status.action_id)
            errors = 0
        except Exception as exc:  # noqa: BLE001 - a provider fault is retried a few times
            errors += 1
            log.warning("run %s: status of %s failed: %s", context.run_id, name, exc)
            if errors >= MAX_STATUS_ERRORS:
                doc = status.document()
                doc.update(status="FAILED", display_status="FAILED", state_name=name)
                doc["details"] = {"error": f"status polling failed: {exc}"}
                raise StateFailure("ActionFailedException", cause_text(doc)) from None
    on_status("ACTIVE")
    doc = status.document()
    doc["state_name"] = name
    if status.status == "FAILED" and state.get("ExceptionOnActionFailure", True):
        raise StateFailure("ActionFailedException", cause_text(doc))
    return doc


def _cancel(provider: ActionProvider, action_id: str, context: RunContext) -> None:
    try:
        provider.cancel(action_id)
    except Exception as exc:  # noqa: BLE001 - best effort, the run ends either way
        log.warning("run %s: cancelling action %s failed: %s", context.run_id, action_id, exc)
