"""Globus Compute: register the functions of functions/, check the endpoint, submit directly.

``globus_compute_sdk`` takes a while to import and is only needed to register or submit, so
it is imported inside those functions; the status check uses globus-sdk's own Compute client.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any

import globus_sdk

from beamflow.globus.auth import GlobusAuth
from beamflow.globus.errors import BackendError, globus_errors


def function_source(function: Callable[..., Any]) -> str:
    """The function's source text (what is hashed to decide on re-registration)."""
    try:
        return inspect.getsource(function)
    except (OSError, TypeError) as exc:
        raise BackendError(f"cannot read the source of {function!r}: {exc}") from None


def source_checksum(function: Callable[..., Any]) -> str:
    return hashlib.sha256(function_source(function).encode()).hexdigest()


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


def function_exists(auth: GlobusAuth, function_id: str) -> bool:
    """Whether the Compute service knows the function id (False on 404)."""
    client = auth.client(globus_sdk.ComputeClientV2)
    with globus_errors(f"look up Compute function {function_id}"):
        try:
            client.get_function(function_id)
        except globus_sdk.GlobusAPIError as exc:
            if exc.http_status in (403, 404):
                return False
            raise
    return True


def run_direct(
    auth: GlobusAuth,
    endpoint_id: str,
    function_id: str,
    kwargs: dict[str, Any],
    *,
    timeout: float | None = None,
) -> Any:
    """Run a registered function on the endpoint without a flow (no transfers) and wait for
    its result. Results come back over AMQPS (port 5671, outbound)."""
    from concurrent.futures import TimeoutError as FutureTimeout

    from globus_compute_sdk import Executor

    action = f"run function {function_id} on Compute endpoint {endpoint_id}"
    with (
        globus_errors(action, step="compute"),
        Executor(endpoint_id=endpoint_id, client=compute_client(auth)) as executor,
    ):
        future = executor.submit_to_registered_function(function_id, kwargs=kwargs)
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            future.cancel()
            raise BackendError(
                f"function {function_id} gave no result within {timeout} s "
                f"(endpoint {endpoint_id} busy or offline?)",
                transient=True,
                step="compute",
            ) from None
        except (globus_sdk.GlobusError, BackendError):
            raise
        except Exception as exc:  # the function's own exception, re-raised by the SDK
            raise BackendError(
                f"the function failed on endpoint {endpoint_id}: {type(exc).__name__}: {exc}",
                step="compute",
            ) from exc
