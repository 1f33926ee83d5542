"""The agent as a confidential client (ClientApp): its tokens come from the
client-credentials grant, and the dependent scopes of a flow (Transfer, each mapped
collection's data_access) are checked against the consents Globus Auth holds for the
client's own identity, as the SDK checks them for a person.

Everything Auth answers is registered with ``responses``: the grant (with an id_token
signed by a test key, which the SDK verifies against the registered JWK), the client's
consents, the runs. Beside each client case, the person's case shows that a person is still
told to log in."""

from __future__ import annotations

import json
import urllib.parse

import globus_sdk
import pytest
from globus_sdk.testing import load_response
from globus_testkit import (
    BEAMLINE,
    CLIENT_ID,
    HPC,
    IDENTITY,
    NO_RETRY,
    AuthKeys,
    client_grant,
    consents,
    globus_workspace,
    make_settings,
    register,
    store_tokens,
)
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.globus.auth import GlobusAuth, scope_requirements
from beamflow.globus.backend import GlobusRunBackend
from beamflow.globus.errors import ClientConsentMissing, ClientSecretRejected, LoginRequired
from beamflow.registry import Registry, flow_checksum

FLOW = "ptycho_reconstruct"
pytestmark = pytest.mark.usefixtures("mocked")


@pytest.fixture
def client(tmp_path, monkeypatch):
    """A workspace whose identity is the agent's confidential client."""
    globus_workspace(tmp_path, monkeypatch)
    monkeypatch.setenv("BEAMFLOW_GLOBUS__CLIENT_SECRET", "s3cret")
    return make_settings(tmp_path)


def calls(mocked, path_end: str, method: str = "GET") -> list:
    return [c for c in mocked.calls
            if c.request.method == method and c.request.url.split("?")[0].endswith(path_end)]


def granted_scopes(mocked) -> list[str]:
    return [urllib.parse.parse_qs(c.request.body)["scope"][0]
            for c in calls(mocked, "/v2/oauth2/token", "POST")]


def start_flow_run(settings) -> str:
    flow_id = load_response(globus_sdk.SpecificFlowClient.run_flow).metadata["flow_id"]
    Registry(settings.registry_path, "globus").record("flow", FLOW, flow_id, flow_checksum(FLOW))
    return flow_id


def all_trees(settings, flow_ids=()) -> list:
    return [s for scopes in scope_requirements(settings, flow_ids).values() for s in scopes]


# -- the client ------------------------------------------------------------------------------
def test_client_grant_asks_every_dependency_and_auth_holds_the_clients_consents(client, mocked):
    """What works: the grant asks each scope with its dependencies; the SDK then finds the
    client identity's consents to them (GET consents of the client's own identity)."""
    flow_id = start_flow_run(client)
    keys = AuthKeys()
    client_grant(keys, scope_requirements(client, [flow_id]))
    consents(CLIENT_ID, all_trees(client, [flow_id]))
    with GlobusRunBackend(client, network=NO_RETRY) as backend:
        backend.start_run(FLOW, {"run_name": "s1"}, label="s1", tags=["beamflow"])
    (asked,) = granted_scopes(mocked)
    flow_scope = globus_sdk.SpecificFlowClient(flow_id).scopes.user.scope_string
    for needed in (f"{flow_scope}[", f"{BEAMLINE}/data_access", f"{HPC}/data_access", "openid"):
        assert needed in asked, needed
    assert calls(mocked, f"/identities/{CLIENT_ID}/consents")  # the client's own consents
    (run,) = calls(mocked, f"/flows/{flow_id}/run", "POST")
    assert run.request.headers["Authorization"] == f"Bearer cc-{flow_id}"


def test_a_flow_registered_after_the_grant_is_granted_again_without_a_login(client, mocked):
    keys = AuthKeys()
    client_grant(keys, scope_requirements(client))  # the grant before the flow existed
    consents(CLIENT_ID, all_trees(client))
    with GlobusAuth(client, network=NO_RETRY) as auth:
        auth.login()
    flow_id = start_flow_run(client)  # registered now: no token for its resource server
    client_grant(keys, scope_requirements(client, [flow_id]))
    consents(CLIENT_ID, all_trees(client, [flow_id]))
    with GlobusRunBackend(client, network=NO_RETRY) as backend:
        backend.start_run(FLOW, {}, label="x", tags=[])
    assert len(granted_scopes(mocked)) == 2 and flow_id in granted_scopes(mocked)[1]
    assert calls(mocked, f"/flows/{flow_id}/run", "POST")


def test_a_consent_gone_since_is_granted_again_when_the_sdk_finds_it_missing(client, mocked):
    """Tokens stored, the client's identity known (from the first grant's id_token), but Auth
    no longer holds the data_access consent (revoked): the SDK's check fails, and the client
    asks the grant again, which records it; the run starts, nobody logs in."""
    flow_id = start_flow_run(client)
    keys = AuthKeys()
    client_grant(keys, scope_requirements(client, [flow_id]))
    with GlobusAuth(client, network=NO_RETRY, flow_ids=[flow_id]) as auth:
        consents(CLIENT_ID, all_trees(client, [flow_id]))
        auth.login()
    mocked.replace("GET", f"https://auth.globus.org/v2/api/identities/{CLIENT_ID}/consents",
                   json={"consents": []})  # revoked
    consents(CLIENT_ID, all_trees(client, [flow_id]))  # recorded again by the next grant
    with GlobusRunBackend(client, network=NO_RETRY) as backend:
        backend.start_run(FLOW, {}, label="x", tags=[])
    assert len(granted_scopes(mocked)) == 2  # the login, then the one the check caused
    assert len(calls(mocked, f"/identities/{CLIENT_ID}/consents")) >= 3  # login, check, after
    assert calls(mocked, f"/flows/{flow_id}/run", "POST")


def test_consents_auth_does_not_hold_are_an_admins_task_not_a_login(client, mocked):
    flow_id = start_flow_run(client)
    keys = AuthKeys()
    client_grant(keys, scope_requirements(client, [flow_id]))
    consents(CLIENT_ID, [])  # Auth recorded nothing for the client
    with GlobusRunBackend(client, network=NO_RETRY) as backend, \
            pytest.raises(ClientConsentMissing) as caught:  # fmt: skip
        backend.start_run(FLOW, {}, label="x", tags=[])
    text = str(caught.value)
    assert f"{CLIENT_ID}@clients.auth.globus.org" in text
    assert BEAMLINE in text and HPC in text and "data_access" in text
    assert "beamflow-as-agent doctor" in text and "beamflow login" not in text
    assert not calls(mocked, f"/flows/{flow_id}/run", "POST")  # nothing started half-allowed


def test_a_rejected_secret_names_the_client(client, mocked):
    register("auth", "/v2/oauth2/token", {"error": "invalid_client"}, method="POST", status=401)
    result = CliRunner().invoke(app, ["login", "--config", "beamflow.toml"])
    assert result.exit_code == 1
    assert f"Globus Auth rejected the client secret for {CLIENT_ID}" in result.output
    assert "Rotating the client secret" in result.output
    assert "Traceback" not in result.output
    start_flow_run(client)
    with GlobusRunBackend(client, network=NO_RETRY) as backend, \
            pytest.raises(ClientSecretRejected, match=CLIENT_ID):  # fmt: skip
        backend.start_run(FLOW, {}, label="x", tags=[])


def test_doctor_checks_the_clients_grant_and_consents(client, mocked):
    keys = AuthKeys()
    client_grant(keys, scope_requirements(client))
    consents(CLIENT_ID, all_trees(client)[:1])  # openid only: no Transfer data_access tree
    result = CliRunner().invoke(app, ["doctor", "--json", "--config", "beamflow.toml"])
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    login = checks["login"]
    assert login["outcome"] == "fail", login
    assert f"{CLIENT_ID}@clients.auth.globus.org" in login["detail"]
    assert "data_access" in login["detail"] and "storage gateway" in login["detail"]
    assert "beamflow login" not in login["detail"] + (login["fix"] or "")
    mocked.replace("POST", "https://auth.globus.org/v2/oauth2/token",
                   json={"error": "invalid_client"}, status=401)
    result = CliRunner().invoke(app, ["doctor", "--json", "--config", "beamflow.toml"])
    login = {c["name"]: c for c in json.loads(result.stdout)}["login"]
    assert login["outcome"] == "fail"
    assert f"Globus Auth rejected the client secret for {CLIENT_ID}" in login["detail"]
    assert "second secret" in login["fix"]


def test_doctor_passes_the_client_when_auth_holds_every_consent(client, mocked):
    keys = AuthKeys()
    client_grant(keys, scope_requirements(client))
    consents(CLIENT_ID, all_trees(client))
    result = CliRunner().invoke(app, ["doctor", "--json", "--config", "beamflow.toml"])
    login = {c["name"]: c for c in json.loads(result.stdout)}["login"]
    assert login["outcome"] == "ok", login
    assert f"{CLIENT_ID}@clients.auth.globus.org" in login["detail"]


# -- the person, for contrast -----------------------------------------------------------------
def test_a_person_short_of_a_consent_is_told_to_log_in(tmp_path, monkeypatch, mocked):
    globus_workspace(tmp_path, monkeypatch)
    settings = make_settings(tmp_path)
    flow_id = start_flow_run(settings)
    store_tokens(settings, flow_ids=(flow_id,), identity_id=IDENTITY)
    consents(IDENTITY, [], client=CLIENT_ID)
    with GlobusRunBackend(settings, network=NO_RETRY) as backend, \
            pytest.raises(LoginRequired, match="beamflow login"):  # fmt: skip
        backend.start_run(FLOW, {}, label="x", tags=[])
    assert not calls(mocked, "/v2/oauth2/token", "POST")  # a person is never granted silently


def test_a_person_with_every_consent_starts_the_run(tmp_path, monkeypatch, mocked):
    globus_workspace(tmp_path, monkeypatch)
    settings = make_settings(tmp_path)
    flow_id = start_flow_run(settings)
    store_tokens(settings, flow_ids=(flow_id,), identity_id=IDENTITY)
    consents(IDENTITY, all_trees(settings, [flow_id]))
    with GlobusRunBackend(settings, network=NO_RETRY) as backend:
        backend.start_run(FLOW, {}, label="x", tags=[])
    assert calls(mocked, f"/identities/{IDENTITY}/consents")
    assert calls(mocked, f"/flows/{flow_id}/run", "POST")
