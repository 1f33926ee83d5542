"""Globus Compute: register the functions of functions/, check the endpoint, submit directly.

``globus_compute_sdk`` takes a while to import and is only needed to register or submit, so
it is imported inside those functions; the status check uses globus-sdk's own Compute client.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import globus_sdk

from beamflow.globus.auth import GlobusAuth
from beamflow.globus.errors import RunBackendError, exists_on_service, globus_errors


def function_source(function: Callable[..., Any]) -> str:
    """The function's source text (what is hashed to decide on re-registration)."""
    try:
        return inspect.getsource(function)
    except (OSError, TypeError) as exc:
        raise RunBackendError(f"cannot read the source of {function!r}: {exc}") from None


def compute_client(auth: GlobusAuth) -> Any:
    """A globus_compute_sdk Client on beamflow's app (no version-check call).

    Functions travel as their source text (``PureSourceTextInspect``), not as a dill pickle:
    a pickle of a module-level function is only a reference to ``functions.NAME``, which
    would run whatever copy the endpoint has installed instead of the registered code. The
    endpoint ``exec``s the source in an empty namespace, so the function must be
    self-contained (imports inside the body)."""
    from globus_compute_sdk import Client  # slow import: only when registering or submitting
    from globus_compute_sdk.serialize import PureSourceTextInspect

    return Client(
        app=auth.app,
        do_version_check=False,
        code_serialization_strategy=PureSourceTextInspect(),
    )


def register_function(
    auth: GlobusAuth, function: Callable[..., Any], *, description: str | None = None
) -> str:
    """Register ``function`` with the Compute service; returns its new id."""
    name = getattr(function, "__name__", repr(function))
    with globus_errors(f"register the function {name!r} with Globus Compute", step="register"):
        client = compute_client(auth)
        return str(client.register_function(function, description=description))


def endpoint_status(auth: GlobusAuth, endpoint_id: str) -> dict[str, Any]:
    """The endpoint's status document (``status``: online/offline, ``details``)."""
    client = auth.client(globus_sdk.ComputeClientV2)
    with globus_errors(f"read the status of Compute endpoint {endpoint_id}"):
        return dict(client.get_endpoint_status(endpoint_id).data)


def endpoint_metadata(auth: GlobusAuth, endpoint_id: str) -> dict[str, Any]:
    """What the endpoint reported when it registered: ``endpoint_version`` (its
    globus-compute-endpoint), ``python_version``, ``hostname``, ``local_user``..."""
    client = auth.client(globus_sdk.ComputeClientV2)
    with globus_errors(f"read Compute endpoint {endpoint_id}"):
        return dict(client.get_endpoint(endpoint_id).data)


def function_exists(auth: GlobusAuth, function_id: str) -> bool:
    """Whether the Compute service knows the function id (False on 404)."""
    client = auth.client(globus_sdk.ComputeClientV2)
    return exists_on_service(f"look up Compute function {function_id}",
                             lambda: client.get_function(function_id))  # fmt: skip


def run_direct(
    auth: GlobusAuth,
    endpoint_id: str,
    function_id: str,
    kwargs: dict[str, Any],
    *,
    timeout: float | None = None,
    poll_seconds: float = 5.0,
    user_endpoint_config: dict[str, Any] | None = None,
) -> Any:
    """Run a registered function on the endpoint without a flow (no transfers) and wait for
    its result.

    Submits a one-task batch and polls the task over HTTPS (the SDK's ``Executor`` would
    wait on an AMQPS result queue instead: port 5671, often closed at facilities)."""
    from globus_compute_sdk.errors import TaskExecutionFailed

    client = compute_client(auth)
    action = f"run function {function_id} on Compute endpoint {endpoint_id}"
    try:
        with globus_errors(action, step="compute"):
            return _submit_and_wait(client, endpoint_id, function_id, kwargs, timeout,
                                    poll_seconds, user_endpoint_config)  # fmt: skip
    except TaskExecutionFailed as exc:  # the function raised on the endpoint
        raise RunBackendError(
            f"the function failed on endpoint {endpoint_id}: {exc}", step="compute"
        ) from None


def _submit_and_wait(
    client: Any,
    endpoint_id: str,
    function_id: str,
    kwargs: dict[str, Any],
    timeout: float | None,
    poll_seconds: float,
    user_endpoint_config: dict[str, Any] | None = None,
) -> Any:
    """Submit one task and poll it until it is no longer pending (or ``timeout``); the
    endpoint renders its template with ``user_endpoint_config`` (None or {}: its defaults)."""
    batch = client.create_batch(user_endpoint_config=user_endpoint_config or None)
    batch.add(function_id, kwargs=kwargs)
    submitted = client.batch_run(endpoint_id, batch)
    task_id = submitted["tasks"][function_id][0]
    start = time.monotonic()
    task = client.get_task(task_id)
    while task.get("pending", True):
        if timeout is not None and time.monotonic() - start > timeout:
            raise RunBackendError(
                f"function {function_id} gave no result within {timeout} s (task "
                f"{task_id}; endpoint {endpoint_id} busy or offline?)",
                transient=True,
                step="compute",
            )
        time.sleep(poll_seconds)
        task = client.get_task(task_id)
    if "result" in task:
        return task["result"]
    raise RunBackendError(
        f"the function gave no result on endpoint {endpoint_id} (task {task_id}): "
        f"{task.get('reason') or task.get('status')}",
        step="compute",
    )

