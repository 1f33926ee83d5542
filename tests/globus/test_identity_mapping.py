"""The agent's identity on a multi-user endpoint: the shipped identity_mapping.json files
map the beamline's confidential client to the service account (and people to themselves),
read by the endpoint's own mapper; `beamflow doctor` says when the client is not covered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from endpoint_kit import DEPLOY
from globus_compute_endpoint.endpoint.identity_mapper import PosixIdentityMapper
from globus_testkit import CLIENT_ID, write_config
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.config import load_config
from beamflow.globus.doctor import config_checks, identity_mapping_check
from beamflow.globus.identity_mapping import client_identity, mapped_accounts

CLUSTERS = ["slurm-gpu", "pbspro-gpu"]
PLACEHOLDER = "BEAMLINE-CLIENT-ID"
PERSON_ID = "c0ffee00-1111-4222-8333-444455556666"


def site_mapping(kind: str, directory: Path, client_id: str = CLIENT_ID) -> Path:
    """The shipped mapping with the site's client id filled in, as the docs say to."""
    text = (DEPLOY / kind / "identity_mapping.json").read_text()
    assert PLACEHOLDER in text
    path = directory / f"{kind}-identity_mapping.json"
    path.write_text(text.replace(PLACEHOLDER, client_id))
    return path


def endpoint_maps(path: Path, username: str, identity_id: str) -> list[list[dict]]:
    """What the endpoint itself maps (its PosixIdentityMapper, as core_endpoint uses it)."""
    mapper = PosixIdentityMapper(path, "test-endpoint")
    try:
        return mapper.map_identities([{"id": identity_id, "username": username,
                                       "status": "used"}])  # fmt: skip
    finally:
        mapper.stop_watching()


@pytest.mark.parametrize("kind", CLUSTERS)
def test_the_mapping_maps_the_agent_and_people(kind, tmp_path):
    path = site_mapping(kind, tmp_path)
    agent = endpoint_maps(path, client_identity(CLIENT_ID), CLIENT_ID)
    assert agent[0][0] == {CLIENT_ID: ["beamflow"]}  # the first rule: the service account
    person = endpoint_maps(path, "jdoe@facility.org", PERSON_ID)
    assert {PERSON_ID: ["jdoe"]} in person[0]
    other_client = "99999999-8888-4777-8666-555544443333"
    assert endpoint_maps(path, client_identity(other_client), other_client) == [[]]
    assert mapped_accounts(path, "jdoe@elsewhere.org", PERSON_ID) == []


@pytest.mark.parametrize("kind", CLUSTERS)
def test_config_yaml_and_the_docs_point_at_it(kind):
    config = (DEPLOY / kind / "config.yaml").read_text()
    assert f"--id-mapping-config deploy/compute-endpoint/{kind}/identity_mapping.json" in config
    guide = (DEPLOY.parents[1] / "docs" / "deployment.md").read_text()
    assert f"deploy/compute-endpoint/{kind}/identity_mapping.json" in guide
    assert "@clients.auth.globus.org" in guide


@pytest.mark.parametrize("kind", CLUSTERS)
def test_configure_installs_it_and_the_endpoint_loads_it(kind, tmp_path):
    """`globus-compute-endpoint configure --id-mapping-config` copies the file and points
    config.yaml at the copy; the endpoint's loader then accepts it."""
    from endpoint_kit import core_config

    path = site_mapping(kind, tmp_path)
    env = {**os.environ, "HOME": str(tmp_path), "GLOBUS_COMPUTE_USER_DIR": str(tmp_path / "gc")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    d = DEPLOY / kind
    done = subprocess.run(
        ["globus-compute-endpoint", "configure", "beamflow", "--multi-user", "true",
         "--contact-email", "ops@example.org", "--id-mapping-config", str(path),
         "--core-config", str(d / "config.yaml"),
         "--template-config", str(d / "user_config_template.yaml.j2"),
         "--schema-config", str(d / "user_config_schema.json")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = core_config(tmp_path / "gc" / "beamflow")
    installed = config.identity_mapping_config_path
    assert json.loads(installed.read_text()) == json.loads(path.read_text())
    assert mapped_accounts(installed, client_identity(CLIENT_ID), CLIENT_ID) == ["beamflow"]


# -- doctor -------------------------------------------------------------------------------------
def settings_with(tmp_path, monkeypatch, mapping: Path | None, account: str | None = None):
    for key in list(os.environ):
        if key.startswith("BEAMFLOW_"):
            monkeypatch.delenv(key)
    config = write_config(tmp_path)
    extra = "\n[cluster]\n"
    if mapping is not None:
        extra += f'identity_mapping = "{mapping}"\n'
    if account is not None:
        extra += f'service_account = "{account}"\n'
    config.write_text(config.read_text() + extra)
    monkeypatch.setenv("BEAMFLOW_GLOBUS__CLIENT_SECRET", "s3cret")
    return load_config(config)


def test_doctor_passes_when_the_client_runs_as_the_service_account(tmp_path, monkeypatch):
    path = site_mapping("slurm-gpu", tmp_path)
    check = identity_mapping_check(settings_with(tmp_path, monkeypatch, path, "beamflow"))
    assert check.outcome == "ok", check
    assert client_identity(CLIENT_ID) in check.detail and "'beamflow'" in check.detail


def test_doctor_fails_with_the_rule_to_add_when_the_client_is_not_mapped(tmp_path, monkeypatch):
    shipped = DEPLOY / "slurm-gpu" / "identity_mapping.json"  # placeholder never filled in
    check = identity_mapping_check(settings_with(tmp_path, monkeypatch, shipped, "beamflow"))
    assert check.outcome == "fail"
    assert "would refuse every run the agent starts" in check.detail
    rule = json.loads(check.fix.split("add the rule ", 1)[1].split(" to the mappings")[0])
    # The rule it proposes works when added, as the endpoint reads it.
    fixed = json.loads(shipped.read_text())
    fixed[0]["mappings"].insert(0, rule)
    path = tmp_path / "fixed.json"
    path.write_text(json.dumps(fixed))
    assert mapped_accounts(path, client_identity(CLIENT_ID), CLIENT_ID) == ["beamflow"]


def test_doctor_fails_when_the_client_maps_to_another_account(tmp_path, monkeypatch):
    path = site_mapping("pbspro-gpu", tmp_path)
    check = identity_mapping_check(settings_with(tmp_path, monkeypatch, path, "ptycho"))
    assert check.outcome == "fail" and "'beamflow'" in check.detail and "'ptycho'" in check.detail


def test_doctor_names_a_broken_or_missing_file(tmp_path, monkeypatch):
    broken = tmp_path / "broken.json"
    broken.write_text('[{"DATA_TYPE": "expression_identity_mapping#1.0.0", "mappings": [')
    check = identity_mapping_check(settings_with(tmp_path, monkeypatch, broken))
    assert check.outcome == "fail" and str(broken) in check.detail and "JSON" in check.detail
    unknown = tmp_path / "unknown.json"
    unknown.write_text('[{"DATA_TYPE": "no_such_mapping#9"}]')
    check = identity_mapping_check(settings_with(tmp_path, monkeypatch, unknown))
    assert check.outcome == "fail"
    assert "no identity mapping the endpoint understands" in check.detail
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"DATA_TYPE": "expression_identity_mapping#1.0.0",
                                "mappings": [{"source": "{username}", "match": "*@x",
                                              "output": "a"}]}]))  # fmt: skip
    check = identity_mapping_check(settings_with(tmp_path, monkeypatch, bad))
    assert check.outcome == "fail" and "not a valid identity mapping" in check.detail
    missing = tmp_path / "missing.json"
    check = identity_mapping_check(settings_with(tmp_path, monkeypatch, missing))
    assert check.outcome == "fail" and "cannot read" in check.detail


def test_doctor_skips_without_a_mapping_or_a_client(tmp_path, monkeypatch):
    check = identity_mapping_check(settings_with(tmp_path, monkeypatch, None))
    assert check.outcome == "skip" and "cluster.identity_mapping" in check.detail
    path = site_mapping("slurm-gpu", tmp_path)
    settings = settings_with(tmp_path, monkeypatch, path)
    settings.globus.client_secret = None  # a person's native app: not the agent
    assert identity_mapping_check(settings).outcome == "skip"


def test_doctor_command_reports_it(tmp_path, monkeypatch):
    shipped = DEPLOY / "slurm-gpu" / "identity_mapping.json"
    settings = settings_with(tmp_path, monkeypatch, shipped)
    checks = {c.name: c for c in config_checks(settings)}
    assert checks["identity mapping"].outcome == "fail"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BEAMFLOW_GLOBUS__CLIENT_ID", "not-a-uuid")  # stops before the network
    result = CliRunner().invoke(app, ["doctor", "--json", "--config", "beamflow.toml"])
    assert result.exit_code == 1
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["identity mapping"]["outcome"] == "skip"
