"""Globus failures, said in one sentence that names the service, the action and the fix.

Everything the SDKs raise (token validation, API errors, network errors, the login prompt
reading EOF) is turned into a :class:`~beamflow.runs.backend.RunBackendError` here, so the
agent can decide on a retry (``transient``) and the CLI can print a sentence instead of a traceback.
A fault a person must fix by logging in again is a :class:`LoginRequired`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import globus_sdk
from globus_sdk.gare import to_gare
from globus_sdk.login_flows import CommandLineLoginFlowEOFError
from globus_sdk.token_storage import TokenValidationError
from globus_sdk.token_storage.validating_token_storage import (
    ExpiredTokenError,
    IdentityMismatchError,
    MissingIdentityError,
    MissingTokenError,
    UnmetScopeRequirementsError,
)

from beamflow.config import is_uuid
from beamflow.runs.backend import RunBackendError

LOGIN = "run `beamflow login`"


class LoginRequired(RunBackendError):
    """Tokens are missing, expired or lack a consent: a person must run `beamflow login`."""


class ConfigIncomplete(RunBackendError):
    """A Globus id the configuration needs is not filled in."""


ROTATION = 'docs/deployment.md, "Rotating the client secret"'


class ClientSecretRejected(RunBackendError):
    """Globus Auth refused the confidential client's secret (revoked, rotated or mistyped):
    no login helps; an admin must give the agent a current secret."""

    def __init__(self, client_id: str, detail: str = "") -> None:
        said = f" ({detail})" if detail else ""
        super().__init__(
            f"Globus Auth rejected the client secret for {client_id}{said}: it was revoked, "
            "rotated or mistyped. Put a current secret of that client into "
            "BEAMFLOW_GLOBUS__CLIENT_SECRET (/etc/beamflow/agent.env) and restart the agent "
            f"and the status page ({ROTATION})",
            step="auth",
        )
        self.client_id = client_id


class ClientConsentMissing(RunBackendError):
    """Globus Auth holds no consent of the agent's client identity for a dependent scope it
    needs, even right after a client-credentials grant that asked for it: an admin must act
    (the message says what); logging in cannot help a client."""


def secret_rejected(exc: globus_sdk.AuthAPIError) -> bool:
    """Whether Auth's answer to a client-credentials grant refuses the client itself (OAuth2
    ``invalid_client``, RFC 6749 5.2), not what it asked for."""
    raw = exc.raw_json or {}
    oauth_error = raw.get("error") if isinstance(raw.get("error"), str) else None
    return "invalid_client" in (exc.code, oauth_error) or exc.http_status == 401


def _service_of(exc: globus_sdk.GlobusAPIError) -> str:
    for cls, name in (
        (globus_sdk.AuthAPIError, "Auth"),
        (globus_sdk.TransferAPIError, "Transfer"),
        (globus_sdk.FlowsAPIError, "Flows"),
        (globus_sdk.ComputeAPIError, "Compute"),
    ):
        if isinstance(exc, cls):
            return name
    return "service"


def _login_problem(exc: BaseException, action: str) -> str | None:
    """What a token or login problem means for a person, and what to do; None when ``exc``
    is not one."""
    if isinstance(exc, MissingTokenError) and is_uuid(exc.resource_server):
        # A flow is its own resource server: logged in, but not yet consented to run it.
        return (f"no consent yet to run flow {exc.resource_server} (registered after the last "
                f"login?) while trying to {action}: {LOGIN}")
    if isinstance(exc, MissingTokenError):
        return (f"not logged in to Globus (no token for {exc.resource_server}) "
                f"while trying to {action}: {LOGIN}")
    if isinstance(exc, ExpiredTokenError):
        return (f"the Globus login expired at {exc.expiration:%Y-%m-%d %H:%M} "
                f"while trying to {action}: {LOGIN}")
    if isinstance(exc, UnmetScopeRequirementsError):
        return (f"a Globus consent is missing (a newly registered flow, or data access to a "
                f"collection) while trying to {action}: {LOGIN} to grant it")
    if isinstance(exc, IdentityMismatchError | MissingIdentityError):
        return (f"the stored Globus tokens belong to another identity ({exc}): "
                "run `beamflow logout`, then `beamflow login`")
    if isinstance(exc, TokenValidationError):
        return f"the Globus tokens are not usable ({exc}): {LOGIN}"
    if isinstance(exc, CommandLineLoginFlowEOFError):
        return ("Globus login needs an interactive terminal to paste the code into: run "
                "`beamflow login` in a terminal (an unattended agent uses a client secret, "
                "see deploy/README.md)")
    return None


def explain(exc: BaseException, *, action: str, step: str | None = None) -> RunBackendError:
    """The RunBackendError that says what went wrong while doing ``action`` (e.g. "start the
    run")."""
    if isinstance(exc, RunBackendError):
        return exc
    why = _login_problem(exc, action)
    if why is not None:
        return LoginRequired(why, step=step)
    if isinstance(exc, globus_sdk.GlobusAPIError):
        return _explain_api(exc, action=action, step=step)
    if isinstance(exc, globus_sdk.NetworkError):
        reason = _short_network_reason(exc)
        return RunBackendError(
            f"cannot reach Globus while trying to {action} ({reason}); check the network "
            "and proxy settings, then retry",
            transient=True,
            step=step,
        )
    return RunBackendError(f"could not {action}: {type(exc).__name__}: {exc}", step=step)


def _explain_api(
    exc: globus_sdk.GlobusAPIError, *, action: str, step: str | None
) -> RunBackendError:
    service = _service_of(exc)
    status = exc.http_status
    message = exc.message or exc.text[:200] or ""
    raw = exc.raw_json or {}
    oauth_error = raw.get("error") if isinstance(raw.get("error"), str) else None
    if isinstance(exc, globus_sdk.AuthAPIError) and "invalid_grant" in (exc.code, oauth_error):
        # The refresh token was revoked, or unused for six months.
        return LoginRequired(
            f"the Globus login is no longer valid (Auth refused to refresh the token) "
            f"while trying to {action}: {LOGIN}",
            step=step,
        )
    if status == 401:
        return LoginRequired(
            f"Globus {service} rejected the login token (revoked or expired) while trying "
            f"to {action}: {LOGIN}",
            step=step,
        )
    if status == 403 and (
        exc.info.consent_required or exc.code == "MISSING_SCOPE" or to_gare(exc) is not None
    ):
        scopes = exc.info.consent_required.required_scopes if exc.info.consent_required else []
        extra = f" (needs {', '.join(scopes)})" if scopes else ""
        return LoginRequired(
            f"Globus {service} needs a new consent or a fresh session{extra} "
            f"while trying to {action}: {LOGIN}",
            step=step,
        )
    transient = status in (408, 409, 429) or status >= 500
    what = f"Globus {service} answered {status} {exc.code}"
    return RunBackendError(
        f"could not {action}: {what}: {message}".rstrip(": "), transient=transient, step=step
    )


def _short_network_reason(exc: BaseException) -> str:
    text = str(exc)
    for needle, reason in (
        ("Name or service not known", "name resolution failed: offline?"),
        ("Temporary failure in name resolution", "name resolution failed: offline?"),
        ("Failed to resolve", "name resolution failed: offline?"),
        ("timed out", "timed out"),
        ("Connection refused", "connection refused"),
    ):
        if needle in text:
            return reason
    return type(exc).__name__


@contextlib.contextmanager
def globus_errors(action: str, *, step: str | None = None) -> Iterator[None]:
    """Translate what the Globus SDKs raise inside the block (see :func:`explain`)."""
    try:
        yield
    except RunBackendError:
        raise
    except (globus_sdk.GlobusError, TokenValidationError) as exc:
        raise explain(exc, action=action, step=step) from exc


def exists_on_service(action: str, lookup: Callable[[], object]) -> bool:
    """Whether the service still has an item: ``lookup()`` (a GET of it) answered, or the
    service said 404 or 403 (gone, or not shared with this identity: either way not usable)."""
    with globus_errors(action):
        try:
            lookup()
        except globus_sdk.GlobusAPIError as exc:
            if exc.http_status in (403, 404):
                return False
            raise
    return True
