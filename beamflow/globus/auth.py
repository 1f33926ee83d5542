"""Globus Auth for beamflow: who is acting, with which tokens, consented to what.

Two kinds of identity, chosen by configuration:

* a person (``globus.client_id`` of a *native* app, no secret): a :class:`globus_sdk.UserApp`
  with refresh tokens, so a login lasts until it is unused for six months or revoked;
  `beamflow login` prints a URL and reads the code back;
* the unattended agent (``globus.client_id`` + ``globus.client_secret`` of a confidential
  client, the secret best given as ``BEAMFLOW_GLOBUS__CLIENT_SECRET``): a
  :class:`globus_sdk.ClientApp` that gets its own tokens by the client-credentials grant and
  never needs a person.

Dependent scopes (a flow's run scope with Transfer and each mapped collection's
``data_access`` below it) are checked by the SDK's ``ScopeRequirementsValidator`` against the
consents Globus Auth holds for the identity whose tokens these are (``get_consents``; the
identity comes from the ``id_token`` that ``openid`` brings, for a client as for a person).
A person records those consents by logging in. A client records them by asking: a
client-credentials grant for a scope with dependencies makes Auth record the client
identity's consent to that whole tree (globus-cli relies on the same when it meets a
ConsentRequired as a client). So for the client a token that is missing, expired or short of
a dependent consent is answered by the grant again, for every required scope with its
dependencies (:meth:`GlobusAuth._renew_client_tokens`), and a consent Auth still does not
hold after that is an admin's problem, said as such (:class:`ClientConsentMissing`), never
"run `beamflow login`". A 403 asking for a consent in the middle of a call is met the same
way (the SDK's GARE redrive, which for a ClientApp is that grant). A refused secret says so,
naming the client (:class:`ClientSecretRejected`).

Tokens live in a SQLite file (``settings.token_path``) that only the owner may read: the file
is created 0600 before the SDK opens it, its directory 0700 when beamflow creates it, and the
mode is checked (and repaired) on every open.

No service call ever starts a login on its own (``token_validation_error_handler=None``):
missing or expired tokens raise, and :mod:`beamflow.globus.errors` turns that into
"run `beamflow login`". Only `beamflow login` talks to the user.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import globus_sdk
from globus_sdk import GlobusAppConfig
from globus_sdk.login_flows import CommandLineLoginFlowManager
from globus_sdk.scopes import (
    AuthScopes,
    ComputeScopes,
    FlowsScopes,
    GCSCollectionScopes,
    Scope,
    SpecificFlowScopes,
    TransferScopes,
)
from globus_sdk.token_storage import (
    ScopeRequirementsValidator,
    SQLiteTokenStorage,
    TokenStorageData,
    TokenValidationError,
)
from globus_sdk.token_storage.validating_token_storage import IdentityMismatchError
from globus_sdk.transport import RequestsTransport, RetryConfig

from beamflow.config import Settings, is_uuid
from beamflow.globus.errors import (
    ClientConsentMissing,
    ClientSecretRejected,
    ConfigIncomplete,
    LoginRequired,
    globus_errors,
    secret_rejected,
)
from beamflow.runs.backend import RunBackendError

log = logging.getLogger(__name__)

APP_NAME = "beamflow"
# Warn when an access token that cannot be refreshed has less than this left.
EXPIRY_WARNING_SECONDS = 24 * 3600

C = TypeVar("C", bound=globus_sdk.BaseClient)


# -- network policy ---------------------------------------------------------------------------
@dataclass(frozen=True)
class NetworkPolicy:
    """How hard a client tries. The SDK default (5 retries with back-off, 60 s timeout) suits
    the agent; interactive commands want a quick, clear answer (:data:`INTERACTIVE`)."""

    max_retries: int = 5
    max_sleep: float = 10.0
    http_timeout: float = 60.0

    def retry_config(self) -> RetryConfig:
        # One RetryConfig per client: clients register their retry checks into it.
        return RetryConfig(max_retries=self.max_retries, max_sleep=self.max_sleep)

    def transport(self) -> RequestsTransport:
        return RequestsTransport(http_timeout=self.http_timeout)


AGENT = NetworkPolicy()
INTERACTIVE = NetworkPolicy(max_retries=1, max_sleep=1.0, http_timeout=10.0)


# -- token file -------------------------------------------------------------------------------
def secure_token_file(path: Path) -> Path:
    """Make sure ``path`` exists, belongs to this user and is readable by no one else.

    Creates the directory (0700) and an empty file (0600) when missing, so the SDK never
    creates it under a looser umask; repairs a looser mode of an existing file.
    """
    path = Path(path)
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
        os.chmod(path.parent, 0o700)  # mkdir's mode is filtered by the umask
    if not path.exists():
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
    info = path.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise RunBackendError(
            f"{path}: the Globus token file belongs to another user (uid {info.st_uid}); "
            "set globus.token_storage to a file of your own"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        log.warning("%s: token file mode was %o, set to 600", path, mode)
        os.chmod(path, 0o600)
    return path


class SecureSQLiteTokenStorage(SQLiteTokenStorage):
    """globus-sdk's SQLite token storage, on a file that only its owner can read."""

    def __init__(self, filepath: Path | str, *, namespace: str = "DEFAULT") -> None:
        secure_token_file(Path(filepath))
        super().__init__(filepath, namespace=namespace)

    def file_exists(self) -> bool:
        # The file was just created empty (for its mode); the SDK creates its tables only
        # when it thinks the file is new, so an empty file counts as new.
        return os.path.exists(self.filepath) and os.path.getsize(self.filepath) > 0


# -- the agent's confidential client ---------------------------------------------------------
CLIENT_DOMAIN = "clients.auth.globus.org"


def client_identity_urn(client_id: str) -> str:
    """The Globus principal of a confidential client's own identity (its identity id is its
    client id), as Flows roles name it."""
    return f"urn:globus:auth:identity:{client_id}"


class AgentAuthClient(globus_sdk.ConfidentialAppAuthClient):
    """The SDK's confidential client, saying which client Auth refused when the secret is
    wrong (:class:`ClientSecretRejected`) instead of a bare 401."""

    def oauth2_client_credentials_tokens(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().oauth2_client_credentials_tokens(*args, **kwargs)
        except globus_sdk.AuthAPIError as exc:
            if secret_rejected(exc):
                raw = exc.raw_json or {}
                error = raw.get("error") if isinstance(raw.get("error"), str) else exc.code
                raise ClientSecretRejected(str(self.client_id), f"{exc.http_status} {error}"
                                           ) from exc  # fmt: skip
            raise


def missing_consent_trees(forest: Any, requirements: dict[str, list[Scope]]) -> list[Scope]:
    """The required scopes with dependencies whose whole tree the consent forest lacks."""
    return [
        scope
        for scopes in requirements.values()
        for scope in scopes
        if scope.dependencies and not forest.meets_scope_requirements([scope])
    ]


def _collections_in(scope: Scope) -> list[str]:
    """The collection ids of the data_access scopes inside ``scope``."""
    found = []
    for dep in scope.dependencies:
        if dep.scope_string.endswith("/data_access"):
            found.append(dep.scope_string.rsplit("/", 2)[-2])
        found += _collections_in(dep)
    return found


# -- scopes -----------------------------------------------------------------------------------
def data_access_collections(settings: Settings) -> list[str]:
    """Collections whose data_access consent the flows and Transfer need.

    GCS v5 *mapped* collections require a per-collection ``data_access`` consent; guest
    collections must not get one (Auth answers "unknown scope"). beamflow.toml has no field
    for the collection type yet, so both configured collections count as mapped (the common
    case at a facility), unless ``globus.data_access_collections`` exists and says otherwise.
    """
    explicit = getattr(settings.globus, "data_access_collections", None)
    ids = (
        explicit
        if explicit is not None
        else [
            settings.beamline.collection_id,
            settings.hpc.collection_id,
        ]
    )
    return sorted({c for c in ids if c and is_uuid(c)})


def transfer_scope(collections: Sequence[str]) -> Scope:
    """Transfer's ``all`` scope with an (optional) data_access dependency per collection."""
    return TransferScopes.all.with_dependencies(
        GCSCollectionScopes(c).data_access.with_optional(True) for c in collections
    )


def flow_run_scope(flow_id: str, collections: Sequence[str]) -> Scope:
    """The scope to run one flow, with Transfer data access to the mapped collections,
    built as :meth:`globus_sdk.SpecificFlowClient.add_app_transfer_data_access_scope` does."""
    user = SpecificFlowScopes(flow_id).user
    if not collections:
        return user
    return user.with_dependency(transfer_scope(collections).with_optional(True))


def scope_requirements(settings: Settings, flow_ids: Iterable[str] = ()) -> dict[str, list[Scope]]:
    """Everything beamflow asks consent for, by resource server."""
    collections = data_access_collections(settings)
    required: dict[str, list[Scope]] = {
        AuthScopes.resource_server: [AuthScopes.openid, AuthScopes.profile, AuthScopes.email],
        TransferScopes.resource_server: [transfer_scope(collections)],
        FlowsScopes.resource_server: [FlowsScopes.all],
        ComputeScopes.resource_server: [ComputeScopes.all],
    }
    for flow_id in flow_ids:
        if flow_id and is_uuid(flow_id):
            scopes = SpecificFlowScopes(flow_id)
            required[scopes.resource_server] = [scopes.user, flow_run_scope(flow_id, collections)]
    return required


def registered_flow_ids(settings: Settings) -> list[str]:
    """Ids of the flows registered for the Globus backend (their run scopes are required)."""
    from beamflow import registry as reg

    try:
        return [
            e.id for e in reg.Registry(settings.registry_path, "globus").entries("flow").values()
        ]
    except reg.RegistryError as exc:
        raise RunBackendError(str(exc)) from None


# -- the login prompt -------------------------------------------------------------------------
class TerminalLoginFlowManager(CommandLineLoginFlowManager):
    """The SDK's command-line login, refusing at once (instead of hanging on a pipe) when
    there is no terminal to read the code from."""

    @staticmethod
    def has_terminal() -> bool:
        return bool(sys.stdin) and sys.stdin.isatty()

    def run_login_flow(self, auth_parameters: Any) -> globus_sdk.OAuthTokenResponse:
        if not self.has_terminal():
            raise LoginRequired(
                "Globus login needs an interactive terminal to paste the code into: run "
                "`beamflow login` in a terminal (an unattended agent uses a client secret: "
                "BEAMFLOW_GLOBUS__CLIENT_SECRET, see deploy/README.md)"
            )
        return super().run_login_flow(auth_parameters)

    def print_authorize_url(self, authorize_url: str) -> None:
        print(
            "\nOpen this URL in a browser, log in with your Globus identity and grant "
            f"beamflow access:\n\n  {authorize_url}\n",
            flush=True,
        )


# -- token summary ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenInfo:
    """What is stored for one resource server (no secrets)."""

    resource_server: str
    scopes: list[str]
    expires_at: float
    refreshable: bool
    identity_id: str | None

    @property
    def expires_in(self) -> float:
        return self.expires_at - time.time()

    @property
    def expired(self) -> bool:
        return self.expires_in <= 0


def expiry_warnings(
    infos: Sequence[TokenInfo], within: float = EXPIRY_WARNING_SECONDS
) -> list[str]:
    """Warnings for tokens that will stop working soon and cannot renew themselves."""
    out = []
    for info in infos:
        if info.refreshable:
            continue  # renewed on use; Auth does not say when a refresh token will lapse
        if info.expired:
            out.append(
                f"the Globus token for {info.resource_server} has expired: run `beamflow login`"
            )
        elif info.expires_in < within:
            hours = info.expires_in / 3600
            out.append(
                f"the Globus token for {info.resource_server} expires in {hours:.1f} h "
                f"({time.strftime('%Y-%m-%d %H:%M', time.localtime(info.expires_at))}) and "
                "cannot be refreshed: run `beamflow login` before then"
            )
    return out


# -- the session ------------------------------------------------------------------------------
def _filled(value: str) -> bool:
    return bool(value) and not value.upper().startswith("FILL")


class GlobusAuth:
    """A GlobusApp for beamflow's configuration, plus the clients made from it.

    ``flow_ids``: flows whose run scope to require (default: none; the backend passes the
    registered flows). Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        flow_ids: Iterable[str] = (),
        network: NetworkPolicy = AGENT,
    ) -> None:
        client_id = settings.globus.client_id
        if not _filled(client_id) or not is_uuid(client_id):
            where = settings.source or "beamflow.toml"
            raise ConfigIncomplete(
                f"{where}: globus.client_id is not set to a Globus app's client id "
                f"(got {client_id!r}); register an app at app.globus.org/settings/developers "
                "(see deploy/README.md) or set BEAMFLOW_GLOBUS__CLIENT_ID"
            )
        self.settings = settings
        self.network = network
        self.token_path = Path(settings.token_path)
        secret = settings.globus.client_secret
        self.client_secret = secret.get_secret_value() if secret else None
        self.is_service = bool(self.client_secret)
        self.client_id = client_id
        self._transports: list[RequestsTransport] = []
        self._warned_at = -float("inf")
        try:
            self.storage = SecureSQLiteTokenStorage(self.token_path)
        except (OSError, ValueError, sqlite3.Error) as exc:
            raise RunBackendError(
                f"{self.token_path}: cannot open the Globus token file ({exc}); fix its "
                "permissions, or set globus.token_storage to another path"
            ) from None
        requirements = scope_requirements(settings, flow_ids)
        try:
            self.app = self._make_app(client_id, requirements)
        except sqlite3.Error as exc:
            self.storage.close()
            raise RunBackendError(
                f"{self.token_path}: the Globus token file is damaged ({exc}); delete it and "
                "run `beamflow login`"
            ) from None
        except BaseException:
            self.storage.close()
            raise

    def _make_app(
        self, client_id: str, requirements: dict[str, list[Scope]]
    ) -> globus_sdk.GlobusApp:
        client_options: dict[str, Any] = {"app_name": APP_NAME, "transport": self._transport(),
                                          "retry_config": self.network.retry_config()}
        login_client: globus_sdk.AuthLoginClient
        app_type: type[globus_sdk.GlobusApp]
        if self.is_service:
            login_client = AgentAuthClient(client_id, self.client_secret, **client_options)
            # No person to ask: a token problem is met by the grant again (which records the
            # client's consents to what it asks), a 403 asking for a consent likewise.
            app_type, config = globus_sdk.ClientApp, GlobusAppConfig(
                token_storage=self.storage,
                token_validation_error_handler=self._renew_client_tokens,
                auto_redrive_gares=True,
            )
        else:
            login_client = globus_sdk.NativeAppAuthClient(client_id, **client_options)
            app_type, config = globus_sdk.UserApp, GlobusAppConfig(
                token_storage=self.storage,
                request_refresh_tokens=True,
                login_flow_manager=TerminalLoginFlowManager,
                token_validation_error_handler=None,
            )
        app = app_type(APP_NAME, login_client=login_client, scope_requirements=requirements,
                       config=config)
        # The consent check (dependent scopes) has its own Auth client inside the app; give
        # it the same patience as ours, so an offline check fails as quickly.
        for validator in app.token_storage.validators:
            if isinstance(validator, ScopeRequirementsValidator):
                validator.consent_client.retry_config.max_retries = self.network.max_retries
                validator.consent_client.retry_config.max_sleep = self.network.max_sleep
                validator.consent_client.transport.http_timeout = self.network.http_timeout
        self._login_client = login_client
        return app

    def _transport(self) -> RequestsTransport:
        transport = self.network.transport()
        self._transports.append(transport)
        return transport

    # -- clients -----------------------------------------------------------------------
    def client(self, cls: type[C], *args: Any, **kwargs: Any) -> C:
        """A service client of ``cls`` on this app, with this session's network policy."""
        return cls(
            *args,
            app=self.app,
            transport=self._transport(),
            retry_config=self.network.retry_config(),
            **kwargs,
        )

    def add_flow(self, flow_id: str) -> None:
        """Require the run scope of one more flow (e.g. one registered just now)."""
        collections = data_access_collections(self.settings)
        scopes = SpecificFlowScopes(flow_id)
        self.app.add_scope_requirements(
            {scopes.resource_server: [scopes.user, flow_run_scope(flow_id, collections)]}
        )

    # -- state -------------------------------------------------------------------------
    def tokens(self) -> list[TokenInfo]:
        """What is stored, read locally (no network, no validation)."""
        data: dict[str, TokenStorageData] = self.storage.get_token_data_by_resource_server()
        return [
            TokenInfo(
                resource_server=rs,
                scopes=sorted(td.scope.split()),
                expires_at=float(td.expires_at_seconds),
                refreshable=bool(td.refresh_token),
                identity_id=td.identity_id,
            )
            for rs, td in sorted(data.items())
        ]

    def logged_in(self) -> bool:
        """Whether any tokens are stored (a service client needs none: it fetches its own)."""
        return self.is_service or bool(self.storage.get_token_data_by_resource_server())

    def require_login(self) -> None:
        """Raise :class:`LoginRequired` unless tokens are stored (no network). A client with
        no tokens at all gets them now, every scope in one grant with ``openid``: Auth then
        records its consents to every dependency, and the id_token names the identity whose
        consents the SDK checks from then on (a grant of one resource server's scopes, which
        an authorizer makes on its own, carries no id_token)."""
        if self.is_service and not self.storage.get_token_data_by_resource_server():
            self.login()
            return
        if not self.logged_in():
            raise LoginRequired(
                f"not logged in to Globus (no tokens in {self.token_path}): run `beamflow login`"
            )
        # The agent calls this on every poll: say each warning at most once an hour.
        now = time.monotonic()
        if now - self._warned_at >= 3600:
            warnings = [] if self.is_service else expiry_warnings(self.tokens())
            for warning in warnings:
                log.warning(warning)
            if warnings:
                self._warned_at = now

    # -- the agent's client: tokens and consents --------------------------------------
    def _renew_client_tokens(self, app: globus_sdk.GlobusApp, error: TokenValidationError) -> None:
        """The ClientApp's answer to a token that is missing, expired or short of a consent:
        the client-credentials grant for every required scope with its dependencies, then
        the consents checked, naming what Auth still does not hold."""
        if isinstance(error, IdentityMismatchError):
            raise error  # the token file of another identity: nothing to renew
        log.info("Globus tokens of client %s: %s; asking Auth again", self.client_id, error)
        app.login(force=True)
        missing = self.consent_gaps()
        if missing:
            raise ClientConsentMissing(self.consent_gap_text(missing), step="auth")

    def consent_gaps(self) -> list[Scope]:
        """The required scope trees that Globus Auth holds no consent of this identity for
        (network: Auth's consents of the identity the stored tokens belong to)."""
        identity = self.app.token_storage.identity_id or (
            self.client_id if self.is_service else None)  # fmt: skip
        if identity is None:
            return []  # no id_token: the SDK cannot check either
        with globus_errors(f"read the Globus consents of identity {identity}"):
            forest = self._consent_client().get_consents(identity).to_forest()
        return missing_consent_trees(forest, self.app.scope_requirements)

    def _consent_client(self) -> globus_sdk.AuthClient:
        for validator in self.app.token_storage.validators:
            if isinstance(validator, ScopeRequirementsValidator):
                return validator.consent_client
        return self.client(globus_sdk.AuthClient)

    def consent_gap_text(self, missing: Sequence[Scope]) -> str:
        """What the agent's client lacks and what an admin does about it."""
        collections = sorted({c for scope in missing for c in _collections_in(scope)})
        who = f"{self.client_id}@{CLIENT_DOMAIN}"
        scopes = "; ".join(str(s) for s in missing)
        text = (
            f"Globus Auth holds no consent of the agent's client identity {who} for {scopes}, "
            "even right after a client-credentials grant that asked for it (Auth records a "
            "client's consent to exactly what its grant asks, dependencies included)"
        )
        if collections:
            text += (
                f". It is the data_access of collection(s) {', '.join(collections)}: a guest "
                "collection has none (list only mapped collections in "
                "globus.data_access_collections); a mapped collection grants it only to "
                f"identities its storage gateway admits (let {who} in, through the gateway's "
                "identity mapping or a guest collection shared with it)"
            )
        return text + "; then run `sudo beamflow-as-agent doctor` to check"

    def login(self, *, force: bool = False) -> bool:
        """Log in (a person: URL and code; a service: client credentials). Returns whether a
        login flow ran (False: the stored tokens already cover every scope)."""
        with globus_errors("log in to Globus"):
            if self.is_service:
                self.app.login(force=True)
                missing = self.consent_gaps()
                if missing:
                    raise ClientConsentMissing(self.consent_gap_text(missing), step="auth")
                return True
            if not force and self.logged_in() and not self.app.login_required():
                return False
            self.app.login(force=True)
            return True

    def logout(self) -> tuple[int, list[str]]:
        """Revoke and remove every stored token. Returns (tokens removed, problems); tokens
        are removed locally even when the revocation cannot reach Auth."""
        login_client = self._login_client
        problems: list[str] = []
        removed = 0
        reachable = True
        for rs, td in sorted(self.storage.get_token_data_by_resource_server().items()):
            for token in filter(None, (td.access_token, td.refresh_token)):
                if not reachable:
                    break
                try:
                    with globus_errors(f"revoke the token for {rs}"):
                        login_client.oauth2_revoke_token(token)
                except RunBackendError as exc:  # report; the tokens are removed here anyway
                    problems.append(str(exc))
                    reachable = not exc.transient  # offline: do not wait once per token
                    break
            self.storage.remove_token_data(rs)
            removed += 1
        return removed, problems

    def userinfo(self) -> dict[str, Any]:
        """Who is logged in, as Globus Auth says (network)."""
        self.require_login()
        auth = self.client(globus_sdk.AuthClient)
        with globus_errors("ask Globus Auth who is logged in"):
            return dict(auth.userinfo().data)

    def close(self) -> None:
        self.app.close()
        self.storage.close()
        for transport in self._transports:
            transport.close()

    def __enter__(self) -> GlobusAuth:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def interactive_auth(settings: Settings) -> GlobusAuth:
    """The Globus login of ``settings`` for a person at a terminal (`beamflow login`,
    `logout`, `whoami`): every registered flow's run scope required, a quick answer on a bad
    network (:data:`INTERACTIVE`). Raises :class:`RunBackendError` with what to fix."""
    return GlobusAuth(settings, flow_ids=registered_flow_ids(settings), network=INTERACTIVE)
