"""Flows checked by the service: `beamflow flows validate --remote` and `register flows` ask
Globus Flows' own validation (POST /flows/validate, globus-sdk's FlowsClient.validate_flow)
and show its messages; answered by globus-sdk's recorded responses."""

from __future__ import annotations

import json

import globus_sdk
import pytest
from globus_sdk.testing import get_last_request, load_response
from globus_testkit import NO_RETRY, globus_workspace, make_settings, register, store_tokens
from typer.testing import CliRunner

import flows
from beamflow.cli import app
from beamflow.globus.backend import GlobusRunBackend
from beamflow.globus.flows import validate_flow
from beamflow.registry import Registry
from beamflow.runs.backend import RunBackendError

pytestmark = pytest.mark.usefixtures("mocked")
SCOPE = "urn:globus:auth:scope:transfer.api.globus.org:all"


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    return globus_workspace(tmp_path, monkeypatch)


def cli(*args: str):
    return CliRunner().invoke(app, [*args, "--config", "beamflow.toml"])


def accepted() -> None:
    register("flows", "/flows/validate", {"scopes": {"User": [SCOPE]}}, method="POST")


def test_the_service_accepts_a_shipped_flow_with_its_schema(workspace, mocked):
    store_tokens(make_settings(workspace))
    accepted()
    path = workspace / "ptycho_reconstruct.json"
    path.write_text(json.dumps(flows.load_definition("ptycho_reconstruct")))
    (workspace / "ptycho_reconstruct.schema.json").write_text(
        json.dumps(flows.load_schema("ptycho_reconstruct"))
    )
    result = cli("flows", "validate", str(path), "--remote")
    assert result.exit_code == 0, result.output
    assert "Globus Flows accepts it" in result.output and SCOPE in result.output
    assert result.output.strip().endswith("valid")
    sent = json.loads(get_last_request().body)
    assert sent["definition"] == flows.load_definition("ptycho_reconstruct")
    assert sent["input_schema"] == flows.load_schema("ptycho_reconstruct")


def test_the_services_reasons_are_printed_and_exit_1(workspace):
    store_tokens(make_settings(workspace))
    response = load_response(globus_sdk.FlowsClient.validate_flow, case="definition_error")
    path = workspace / "broken.json"
    path.write_text(json.dumps(response.metadata["invalid"]))
    result = cli("flows", "validate", str(path), "--remote")
    assert result.exit_code == 1
    assert ("Globus Flows: $.definition.States.Step1: A state of type 'Action' must be "
            "defined as either terminal") in result.output  # fmt: skip
    assert "valid\n" not in result.output


def test_a_flow_only_the_service_refuses_fails_too(workspace):
    """The local rules pass it; the service's answer decides."""
    store_tokens(make_settings(workspace))
    register("flows", "/flows/validate", {"error": {"code": "UNPROCESSABLE_ENTITY",
             "detail": "ActionUrl https://example.org/x is not a known action provider"}},
             method="POST", status=422)  # fmt: skip
    path = workspace / "ok.json"
    path.write_text(json.dumps(flows.load_definition("ptycho_shared_fs")))
    result = cli("flows", "validate", str(path), "--remote")
    assert result.exit_code == 1
    assert "Globus Flows: ActionUrl https://example.org/x is not a known" in result.output


def test_remote_validation_needs_a_login_and_says_so(workspace, mocked):
    path = workspace / "f.json"
    path.write_text(json.dumps(flows.load_definition("ptycho_shared_fs")))
    result = cli("flows", "validate", str(path), "--remote")
    assert result.exit_code == 1 and "beamflow login" in result.output
    assert len(mocked.calls) == 0
    offline = CliRunner().invoke(app, ["flows", "validate", str(path)])  # no --remote: no Globus
    assert offline.exit_code == 0 and offline.output.strip() == "valid"


def test_service_errors_other_than_a_refusal_are_errors(tmp_path):
    settings = make_settings(tmp_path)
    store_tokens(settings)
    register("flows", "/flows/validate", {"error": {"code": "FORBIDDEN"}}, method="POST",
             status=403)  # fmt: skip
    with GlobusRunBackend(settings, network=NO_RETRY) as backend, pytest.raises(RunBackendError):
        backend.validate_flow("f", flows.load_definition("ptycho_shared_fs"), None)
    client = globus_sdk.FlowsClient(authorizer=globus_sdk.NullAuthorizer())
    response = load_response(globus_sdk.FlowsClient.validate_flow)
    check = validate_flow(client, "simple", response.metadata["success"], None)
    assert check.valid and check.problems == [] and check.scopes == {"User": [SCOPE]}
    assert "input_schema" not in json.loads(get_last_request().body)


def test_register_flows_sends_nothing_the_service_refuses(tmp_path, mocked):
    settings = make_settings(tmp_path)
    store_tokens(settings)
    register("flows", "/flows/validate", {"error": {"code": "UNPROCESSABLE_ENTITY", "detail": [
        {"loc": ["definition", "States", "Reconstruct", "Parameters"],
         "msg": "unknown key user_endpoint_config", "type": "value_error"}]}},
        method="POST", status=422)  # fmt: skip
    backend = GlobusRunBackend(settings, network=NO_RETRY)
    with backend, pytest.raises(RunBackendError) as caught:
        backend.register_flows()
    message = str(caught.value)
    assert message.startswith(f"flows/{flows.flow_names()[0]}.json: Globus Flows refuses")
    assert "$.definition.States.Reconstruct.Parameters: unknown key user_endpoint_config" in message
    assert [c.request.url.rsplit("/", 1)[-1] for c in mocked.calls] == ["validate"]
    assert Registry(settings.registry_path, "globus").entries("flow") == {}


def test_register_flows_command_prints_the_services_reasons(workspace):
    store_tokens(make_settings(workspace))
    load_response(globus_sdk.FlowsClient.validate_flow, case="definition_error")
    register("flows", "/flows/validate", {"error": {"detail": [
        {"loc": ["definition", "StartAt"], "msg": "field required"}]}}, method="POST",
        status=422)  # fmt: skip
    result = cli("register", "flows", "--backend", "globus")
    assert result.exit_code == 1
    assert "Globus Flows refuses the definition" in result.output
    assert "$.definition.StartAt: field required" in result.output
