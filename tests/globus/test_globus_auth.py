"""Globus Auth: token file permissions, scopes, login/logout/whoami/doctor through the CLI.

No network: every request is answered by ``responses`` (globus_sdk.testing fixtures where
the SDK ships them, our own RegisteredResponse otherwise).
"""

from __future__ import annotations

import json
import os
import stat
import time
import urllib.parse

import globus_sdk
import pytest
import responses
from globus_sdk.testing import get_last_request, load_response
from globus_sdk.token_storage import TokenStorageData
from globus_sdk.token_storage.validating_token_storage import ExpiredTokenError
from globus_testkit import (
    BEAMLINE,
    CLIENT_ID,
    ENDPOINT,
    HPC,
    IDENTITY,
    NO_RETRY,
    globus_workspace,
    make_settings,
    register,
    store_tokens,
    userinfo,
)
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.globus.auth import (
    GlobusAuth,
    SecureSQLiteTokenStorage,
    TokenInfo,
    expiry_warnings,
    flow_run_scope,
    scope_requirements,
)
from beamflow.globus.errors import LoginRequired, explain

FLOW_ID = "24bc4997-b483-4c25-a19c-64b0afc00743"


# Every request goes to `responses` (the `mocked` fixture in conftest.py), never the network.
pytestmark = pytest.mark.usefixtures("mocked")


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    return globus_workspace(tmp_path, monkeypatch)


def cli(*args: str, input: str | None = None):
    result = CliRunner().invoke(app, [*args, "--config", "beamflow.toml"], input=input)
    return result


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- token storage ---------------------------------------------------------------------------
def test_token_file_is_created_private_and_usable(tmp_path):
    path = tmp_path / "secrets" / "tokens.db"
    storage = SecureSQLiteTokenStorage(path)
    try:
        storage.store_token_data_by_resource_server(
            {
                "transfer.api.globus.org": TokenStorageData(
                    resource_server="transfer.api.globus.org",
                    identity_id=None,
                    scope="urn:globus:auth:scope:transfer.api.globus.org:all",
                    access_token="a",
                    refresh_token="r",
                    expires_at_seconds=int(time.time()) + 60,
                    token_type="Bearer",
                )
            }
        )
        assert storage.get_token_data("transfer.api.globus.org").refresh_token == "r"
    finally:
        storage.close()
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700


def test_token_file_with_loose_mode_is_repaired_on_open(tmp_path):
    path = tmp_path / "tokens.db"
    SecureSQLiteTokenStorage(path).close()
    os.chmod(path, 0o644)
    storage = SecureSQLiteTokenStorage(path)
    storage.close()
    assert _mode(path) == 0o600


# -- scopes ----------------------------------------------------------------------------------
def test_flow_scope_asks_data_access_for_both_collections_as_the_sdk_does(tmp_path):
    settings = make_settings(tmp_path)
    required = scope_requirements(settings, [FLOW_ID])
    transfer = str(required["transfer.api.globus.org"][0])
    assert f"{BEAMLINE}/data_access" in transfer and f"{HPC}/data_access" in transfer
    # The run scope is the one globus-sdk builds for mapped collections.
    app_ = globus_sdk.UserApp(
        "t", client_id=CLIENT_ID, config=globus_sdk.GlobusAppConfig(token_storage="memory")
    )
    globus_sdk.SpecificFlowClient(FLOW_ID, app=app_).add_app_transfer_data_access_scope(
        [BEAMLINE, HPC]
    )
    sdk_scopes = {str(s) for s in app_.scope_requirements[FLOW_ID]}
    assert str(flow_run_scope(FLOW_ID, [BEAMLINE, HPC])) in sdk_scopes
    assert {str(s) for s in required[FLOW_ID]} <= sdk_scopes


# -- whoami ----------------------------------------------------------------------------------
def test_whoami_not_logged_in_says_so_without_network(workspace, mocked):
    result = cli("whoami")
    assert result.exit_code == 1
    assert "not logged in" in result.output and "beamflow login" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an escaped error
    assert len(mocked.calls) == 0


def test_whoami_shows_the_identity(workspace):
    settings = make_settings(workspace)
    store_tokens(settings)
    userinfo("ada@anl.gov")
    result = cli("whoami")
    assert result.exit_code == 0, result.output
    assert "ada@anl.gov" in result.output and IDENTITY in result.output
    assert get_last_request().headers["Authorization"] == "Bearer access-auth.globus.org"


def test_whoami_with_an_expired_login_asks_for_login(workspace):
    # Access token expired; Auth refuses the refresh token (revoked, or unused 6 months).
    settings = make_settings(workspace)
    store_tokens(settings, expires_in=-60)
    register("auth", "/v2/oauth2/token", {"error": "invalid_grant"}, method="POST", status=400)
    result = cli("whoami")
    assert result.exit_code == 1
    assert "no longer valid" in result.output and "beamflow login" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an escaped error


def test_whoami_offline_fails_fast_with_a_sentence(workspace, mocked):
    store_tokens(make_settings(workspace))
    result = cli("whoami")  # nothing registered: every request fails to connect
    assert result.exit_code == 1
    assert "cannot reach Globus" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an escaped error


def test_expired_access_token_message_names_the_fix():
    err = explain(ExpiredTokenError(int(time.time()) - 10), action="start the run")
    assert isinstance(err, LoginRequired)
    assert "expired" in str(err) and "beamflow login" in str(err)


def test_expiry_warning_only_for_tokens_that_cannot_renew():
    soon = time.time() + 3600
    infos = [
        TokenInfo("transfer.api.globus.org", [], soon, refreshable=False, identity_id=None),
        TokenInfo("flows.globus.org", [], soon, refreshable=True, identity_id=None),
    ]
    warnings = expiry_warnings(infos)
    assert len(warnings) == 1 and "transfer.api.globus.org" in warnings[0]
    assert "beamflow login" in warnings[0]


# -- login / logout --------------------------------------------------------------------------
def test_login_without_a_terminal_refuses_instead_of_hanging(workspace, mocked):
    result = cli("login", input="")
    assert result.exit_code == 1
    assert "interactive terminal" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an escaped error
    assert len(mocked.calls) == 0


def test_login_asks_consent_for_every_service_and_the_flows_data_access(workspace, monkeypatch):
    from beamflow.globus.auth import TerminalLoginFlowManager
    from beamflow.registry import Registry, flow_checksum

    settings = make_settings(workspace)
    Registry(settings.registry_path, "globus").record(
        "flow", "ptycho_reconstruct", FLOW_ID, flow_checksum("ptycho_reconstruct")
    )
    monkeypatch.setattr(TerminalLoginFlowManager, "has_terminal", staticmethod(lambda: True))
    result = cli("login", input="")  # a terminal, but the code is never pasted (EOF)
    assert result.exit_code == 1 and "interactive terminal" in result.output
    url = next(w for w in result.output.split() if w.startswith("https://auth.globus.org/"))
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    assert query["client_id"] == [CLIENT_ID]
    scopes = query["scope"][0]
    for expected in (
        "transfer.api.globus.org:all",
        "eec9b274-0c81-4334-bdc2-54e90e689b9a/all",  # Flows
        "facd7ccc-c5f4-42aa-916b-a0e270e2c2a9/all",  # Compute
        f"{BEAMLINE}/data_access",
        f"{HPC}/data_access",
        globus_sdk.SpecificFlowClient(FLOW_ID).scopes.user.scope_string,
    ):
        assert expected in scopes, expected
    assert query["access_type"] == ["offline"]  # refresh tokens: the login lasts


def test_login_as_a_service_client_stores_tokens(workspace, monkeypatch):
    from globus_testkit import AuthKeys, client_grant, consents

    monkeypatch.setenv("BEAMFLOW_GLOBUS__CLIENT_SECRET", "s3cret")
    settings = make_settings(workspace)
    required = scope_requirements(settings)
    client_grant(AuthKeys(), required)
    consents(CLIENT_ID, [s for scopes in required.values() for s in scopes])
    result = cli("login")
    assert result.exit_code == 0, result.output
    (grant,) = [c.request for c in responses.calls if c.request.url.endswith("/oauth2/token")]
    sent = urllib.parse.parse_qs(grant.body)
    assert sent["grant_type"] == ["client_credentials"]
    assert "transfer.api.globus.org:all" in sent["scope"][0]
    assert _mode(settings.token_path) == 0o600
    with GlobusAuth(settings, network=NO_RETRY) as auth:
        assert {t.resource_server for t in auth.tokens()} == set(required)
        assert {t.identity_id for t in auth.tokens()} == {CLIENT_ID}  # from the id_token


def test_logout_revokes_and_removes_tokens(workspace, mocked):
    settings = make_settings(workspace)
    store_tokens(settings)
    load_response("auth.oauth2_revoke_token")
    result = cli("logout")
    assert result.exit_code == 0, result.output
    revoked = [c for c in mocked.calls if c.request.url.endswith("/token/revoke")]
    assert len(revoked) == 2 * len(scope_requirements(settings))  # access + refresh each
    with GlobusAuth(settings, network=NO_RETRY) as auth:
        assert auth.tokens() == []


def test_logout_offline_still_removes_tokens_and_warns(workspace):
    settings = make_settings(workspace)
    store_tokens(settings)
    result = cli("logout")
    assert result.exit_code == 0, result.output
    assert "could not revoke" in result.output
    with GlobusAuth(settings, network=NO_RETRY) as auth:
        assert auth.tokens() == []


# -- doctor ----------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_doctor_offline_gives_clear_failures_without_hanging(workspace):
    store_tokens(make_settings(workspace))
    result = cli("doctor")
    assert result.exit_code == 1
    assert "cannot reach Globus" in result.output
    assert "skipped: Globus is not reachable" in result.output
    assert "fix:" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an escaped error


def test_doctor_not_logged_in_says_what_to_do(workspace, mocked):
    result = cli("doctor")
    assert result.exit_code == 1
    assert "not logged in" in result.output and "beamflow login" in result.output
    assert len(mocked.calls) == 0


def test_doctor_unfilled_ids_name_the_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["init", ".", "--backend", "globus"]).exit_code == 0
    result = cli("doctor", "--json")
    assert result.exit_code == 1
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    for key in ("globus.client_id", "beamline.collection_id", "compute.endpoint_id"):
        assert checks[key]["outcome"] == "fail" and key in checks[key]["fix"]


def test_doctor_all_good(workspace):
    from beamflow.registry import (
        Registry,
        flow_checksum,
        flow_names,
        function_checksum,
        function_names,
    )

    settings = make_settings(workspace)
    registry = Registry(settings.registry_path, "globus")
    flow_ids = {}
    for i, name in enumerate(flow_names()):
        flow_ids[name] = f"00000000-0000-4000-8000-00000000000{i}"
        registry.record("flow", name, flow_ids[name], flow_checksum(name))
    function_id = "11111111-1111-4111-8111-111111111111"
    for name in function_names():
        registry.record("function", name, function_id, function_checksum(name))
    store_tokens(settings, flow_ids=tuple(flow_ids.values()))
    userinfo()
    for coll in (BEAMLINE, HPC):
        register(
            "transfer",
            f"/v0.10/endpoint/{coll}",
            {
                "id": coll,
                "display_name": f"coll {coll[:4]}",
                "entity_type": "GCSv5_mapped_collection",
            },
        )
        register(
            "transfer",
            f"/v0.10/operation/endpoint/{coll}/ls",
            {"DATA_TYPE": "file_list", "DATA": [{"name": "detector", "type": "dir"}]},
        )
    register(
        "compute",
        f"/v2/endpoints/{ENDPOINT}/status",
        {"status": "online", "details": {"total_workers": 8}},
    )
    register("compute", f"/v2/functions/{function_id}", {"function_uuid": function_id})
    for fid in flow_ids.values():
        register("flows", f"/flows/{fid}", {"id": fid, "title": "beamflow"})
    result = cli("doctor")
    assert result.exit_code == 0, result.output
    assert "online, 8 workers" in result.output
    assert "FAIL" not in result.output
    # A person's configuration names no agent client: the flows are fine, but said so.
    assert "no agent client is known" in result.output
