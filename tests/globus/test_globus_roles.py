"""Flow roles on Globus Flows: `register flows` deploys every flow with its starters (the
agent's client identity and the staff group), viewers and administrators from [globus];
`--dry-run` prints them; every run carries its managers and monitors; `doctor` fails when the
deployed flow would refuse the agent. Against globus-sdk's registered responses."""

from __future__ import annotations

import json

import globus_sdk
import pytest
from globus_sdk.testing import get_last_request, load_response
from globus_testkit import CLIENT_ID, NO_RETRY, globus_workspace, register, store_tokens
from typer.testing import CliRunner

import flows
from beamflow.cli import app
from beamflow.config import ConfigError, load_config
from beamflow.globus.auth import GlobusAuth
from beamflow.globus.backend import GlobusRunBackend
from beamflow.globus.doctor import _flow_on_service
from beamflow.registry import Registry, flow_checksum

pytestmark = pytest.mark.usefixtures("mocked")

AGENT = "7b1e2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
STAFF = "5d6e7f80-91a2-4b3c-8d4e-5f6a7b8c9d0e"
ADMIN = "urn:globus:auth:identity:0a1b2c3d-4e5f-4061-8293-a4b5c6d7e8f9"
AGENT_URN = f"urn:globus:auth:identity:{AGENT}"
STAFF_URN = f"urn:globus:groups:id:{STAFF}"


def with_roles(directory) -> None:
    config = directory / "beamflow.toml"
    text = config.read_text().replace("[globus]\n", f'[globus]\nagent_client_id = "{AGENT}"\n'
                                      f'staff_group = "{STAFF}"\n'
                                      f'flow_administrators = ["{ADMIN}"]\n', 1)
    config.write_text(text)


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    globus_workspace(tmp_path, monkeypatch)
    with_roles(tmp_path)
    return tmp_path


def sent(mocked, method: str, path_end: str) -> list[dict]:
    return [json.loads(c.request.body) for c in mocked.calls
            if c.request.method == method and c.request.url.split("?")[0].endswith(path_end)]


def test_flows_are_deployed_startable_by_the_agent_and_the_staff(workspace, mocked):
    settings = load_config(workspace / "beamflow.toml")
    store_tokens(settings)
    names = flows.flow_names()
    for i in range(len(names)):
        register("flows", "/flows", {"id": f"0000000{i}-0000-4000-8000-000000000000"},
                 method="POST")
    register("flows", "/flows/validate", {"scopes": {}}, method="POST")
    with GlobusRunBackend(settings, network=NO_RETRY) as backend:
        results = backend.register_flows()
    created = sent(mocked, "POST", "/flows")
    assert len(created) == len(names)
    for body in created:
        assert body["flow_starters"] == [AGENT_URN, STAFF_URN]
        assert body["flow_viewers"] == [AGENT_URN, STAFF_URN]
        assert body["flow_administrators"] == [ADMIN]
    assert results[0].roles["flow_starters"] == [AGENT_URN, STAFF_URN]


def test_changed_roles_update_the_flow(workspace, mocked):
    settings = load_config(workspace / "beamflow.toml")
    store_tokens(settings)
    flow_id = "24bc4997-b483-4c25-a19c-64b0afc00743"
    registry = Registry(settings.registry_path, "globus")
    from beamflow.globus.backend import deployed_flow_checksum

    for i, name in enumerate(flows.flow_names()):
        fid = flow_id if i == 0 else f"{flow_id[:-1]}{i}"
        registry.record("flow", name, fid, deployed_flow_checksum(settings, name))
        register("flows", f"/flows/{fid}", {"id": fid})
    with GlobusRunBackend(settings, network=NO_RETRY) as backend:
        assert {r.action for r in backend.register_flows()} == {"unchanged"}
    other = "99999999-1111-4222-8333-444444444444"
    config = workspace / "beamflow.toml"
    config.write_text(config.read_text().replace(STAFF, other))
    settings = load_config(workspace / "beamflow.toml")
    for i, _name in enumerate(flows.flow_names()):
        fid = flow_id if i == 0 else f"{flow_id[:-1]}{i}"
        register("flows", f"/flows/{fid}", {"id": fid}, method="PUT")
    register("flows", "/flows/validate", {"scopes": {}}, method="POST")
    with GlobusRunBackend(settings, network=NO_RETRY) as backend:
        assert {r.action for r in backend.register_flows()} == {"updated"}
    (put, *_) = sent(mocked, "PUT", flow_id)
    assert put["flow_starters"] == [AGENT_URN, f"urn:globus:groups:id:{other}"]


def test_dry_run_prints_each_flows_roles_without_network(workspace, mocked):
    result = CliRunner().invoke(app, ["register", "flows", "--backend", "globus", "--dry-run",
                                      "--config", "beamflow.toml"])
    assert result.exit_code == 0, result.output
    for name in flows.flow_names():
        assert f"created {name} -" in result.stdout
    assert result.stdout.count(f"flow_starters: {AGENT_URN}, {STAFF_URN}") == len(
        flows.flow_names())
    assert f"flow_administrators: {ADMIN}" in result.stdout
    assert len(mocked.calls) == 0


def test_the_agent_is_a_starter_when_the_configuration_is_the_agents(tmp_path, monkeypatch):
    globus_workspace(tmp_path, monkeypatch)
    monkeypatch.setenv("BEAMFLOW_GLOBUS__CLIENT_SECRET", "s3cret")
    result = CliRunner().invoke(app, ["register", "flows", "--backend", "globus", "--dry-run",
                                      "--config", "beamflow.toml"])
    assert f"flow_starters: urn:globus:auth:identity:{CLIENT_ID}" in result.stdout


def test_every_run_carries_its_managers_and_monitors(workspace):
    settings = load_config(workspace / "beamflow.toml")
    flow_id = load_response(globus_sdk.SpecificFlowClient.run_flow).metadata["flow_id"]
    Registry(settings.registry_path, "globus").record(
        "flow", "ptycho_reconstruct", flow_id, flow_checksum("ptycho_reconstruct"))
    store_tokens(settings, flow_ids=(flow_id,))
    with GlobusRunBackend(settings, network=NO_RETRY) as backend:
        backend.start_run("ptycho_reconstruct", {}, label="x", tags=[])
    body = json.loads(get_last_request().body)
    assert body["run_managers"] == [STAFF_URN] and body["run_monitors"] == [STAFF_URN]


def test_doctor_fails_a_flow_the_agent_may_not_start(workspace):
    settings = load_config(workspace / "beamflow.toml")
    store_tokens(settings)
    fid = "24bc4997-b483-4c25-a19c-64b0afc00743"
    register("flows", f"/flows/{fid}", {"id": fid, "flow_starters": [STAFF_URN]})
    with GlobusAuth(settings, network=NO_RETRY) as auth:
        client = auth.client(globus_sdk.FlowsClient)
        check = _flow_on_service(auth, client, "flow x", fid)
        assert check.outcome == "fail" and AGENT in check.detail
        assert "register flows" in check.fix
        register("flows", f"/flows/{fid}", {"id": fid, "flow_starters": [AGENT_URN]})
        assert _flow_on_service(auth, client, "flow x", fid).outcome == "ok"


@pytest.mark.parametrize("value", ['["someone@facility.org"]', '["urn:globus:groups:id:x"]'])
def test_a_principal_that_is_not_a_urn_is_refused_naming_the_key(workspace, value):
    config = workspace / "beamflow.toml"
    config.write_text(config.read_text().replace("[globus]\n", f"[globus]\nrun_managers = "
                                                 f"{value}\n", 1))
    with pytest.raises(ConfigError, match=r"beamflow.toml: globus.run_managers"):
        load_config(config)
