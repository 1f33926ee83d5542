"""No placeholder reaches production: `beamflow render-endpoint` writes the Compute
endpoint's files with the site's values from beamflow.toml, read back with the endpoint's own
renderer, loader and identity mapper; `beamflow doctor` fails on a placeholder left, on a
module command whose failure is hidden, and on a worker environment the mapped account
cannot reach; `doctor --probe --as-agent` probes with the agent's credentials and the
[cluster.final] resources; in a local workspace `doctor` and `doctor --probe` agree."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest
from endpoint_kit import DEPLOY, render_user_config, user_config
from globus_testkit import CLIENT_ID, globus_workspace
from parsl.providers import PBSProProvider, SlurmProvider
from typer.testing import CliRunner

from beamflow import endpoint_files as ef
from beamflow.cli import app
from beamflow.config import load_config
from beamflow.globus.doctor import endpoint_files_checks, identity_mapping_check
from beamflow.globus.identity_mapping import client_identity, mapped_accounts

AGENT = "7b1e2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
PERSON = "c0ffee00-1111-4222-8333-444455556666"

SITE = """
[cluster]
service_account = "beamflow"
people_domain = "anl.gov"
worker_env = "/soft/beamflow-env-0.1.0"
module_paths = ["/soft/modulefiles"]
modules = ["cuda/12.2", "hdf5"]
[cluster.final]
account = "ptycho"
walltime = "08:00:00"
gpus_per_node = 2
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A Globus workspace with the agent's client and the site's [cluster] values."""
    globus_workspace(tmp_path, monkeypatch)
    config = tmp_path / "beamflow.toml"
    text = config.read_text().replace("[globus]\n", f'[globus]\nagent_client_id = "{AGENT}"\n')
    config.write_text(text + SITE)
    return tmp_path


def render(site: Path, kind: str, extra: str = "", *args: str):
    config = site / "beamflow.toml"
    if extra:
        config.write_text(config.read_text() + extra)
    return CliRunner().invoke(app, ["render-endpoint", str(DEPLOY / kind), str(site / kind),
                                    *args, "--config", str(config)])


@pytest.fixture
def loaded():
    configs = []
    yield configs
    for config in configs:
        config.engine.shutdown()


def test_slurm_files_carry_the_sites_values_as_the_endpoint_reads_them(site, loaded):
    result = render(site, "slurm-gpu", 'partition = "gpu-long"\n')  # into [cluster.final]
    assert result.exit_code == 0, result.output
    out = site / "slurm-gpu"
    assert "--id-mapping-config" in result.output and "config.single-user.yaml" in result.output
    config = user_config(out, {})  # the endpoint's renderer and loader, no variables
    loaded.append(config)
    provider = config.engine.executor.provider
    assert isinstance(provider, SlurmProvider)
    assert (provider.partition, provider.account, provider.walltime) == ("gpu-long", "ptycho",
                                                                         "08:00:00")
    assert config.engine.executor.max_workers_per_node == 2
    init = provider.worker_init
    assert init.index("module use /soft/modulefiles ||") < init.index("module load cuda/12.2 ||")
    assert "module load hdf5 || { echo" in init and "exit 1; }" in init
    assert 'source "/soft/beamflow-env-0.1.0"/bin/activate' in init
    # A submission's variables still win over the site's defaults.
    config = user_config(out, {"partition": "debug", "walltime": "00:10:00"})
    loaded.append(config)
    assert config.engine.executor.provider.partition == "debug"
    # Who runs as whom, with the endpoint's own mapper.
    mapping = out / "identity_mapping.json"
    assert mapped_accounts(mapping, client_identity(AGENT), AGENT) == ["beamflow"]
    assert mapped_accounts(mapping, "jdoe@anl.gov", PERSON) == ["jdoe"]
    assert mapped_accounts(mapping, client_identity(CLIENT_ID), CLIENT_ID) == []
    assert ef.placeholders(out) == [] and ef.hidden_failures(out / ef.TEMPLATE) == []


def test_pbs_files_and_a_key_the_template_does_not_take(site, loaded):
    assert render(site, "pbspro-gpu", 'queue = "prod"\n').exit_code == 0
    config = user_config(site / "pbspro-gpu", {})
    loaded.append(config)
    provider = config.engine.executor.provider
    assert isinstance(provider, PBSProProvider)
    assert (provider.queue, provider.account) == ("prod", "ptycho")
    assert "ngpus=2" in provider.select_options
    result = render(site, "pbspro-gpu", 'partition = "gpu"\n', "--force")
    assert result.exit_code == 1
    assert "cluster.final.partition is set" in result.output and "cluster.final.queue" in \
        result.output  # fmt: skip


def test_the_workstation_has_no_mapping_and_one_user(site):
    config = site / "beamflow.toml"
    config.write_text(config.read_text().split("[cluster.final]")[0])  # no batch system
    result = render(site, "workstation")
    assert result.exit_code == 0, result.output
    assert not (site / "workstation" / "identity_mapping.json").exists()
    assert "--multi-user false" in result.output and "--id-mapping-config" not in result.output
    text = render_user_config(site / "workstation", {})
    assert 'source "/soft/beamflow-env-0.1.0"/bin/activate' in text


@pytest.mark.parametrize(("remove", "named"), [
    ('worker_env = "/soft/beamflow-env-0.1.0"\n', "cluster.worker_env"),
    ('service_account = "beamflow"\n', "cluster.service_account"),
    (f'agent_client_id = "{AGENT}"\n', "globus.agent_client_id"),
])
def test_what_cannot_be_filled_in_is_refused_naming_the_key(site, remove, named):
    config = site / "beamflow.toml"
    config.write_text(config.read_text().replace(remove, ""))
    result = render(site, "slurm-gpu")
    assert result.exit_code == 1 and named in result.output
    assert not (site / "slurm-gpu").exists()  # nothing half-written


def test_written_files_are_not_overwritten_without_force(site):
    assert render(site, "slurm-gpu").exit_code == 0
    again = render(site, "slurm-gpu")
    assert again.exit_code == 1 and "--force" in again.output


# -- doctor ------------------------------------------------------------------------------------
def doctor_settings(site: Path, endpoint_dir: Path):
    config = site / "beamflow.toml"
    config.write_text(config.read_text().replace(
        "[cluster]\n", f'[cluster]\nendpoint_dir = "{endpoint_dir}"\n'))
    return load_config(config)


def by_name(checks):
    return {c.name: c for c in checks}


def test_doctor_fails_the_shipped_files_for_their_placeholders(site):
    checks = by_name(endpoint_files_checks(doctor_settings(site, DEPLOY / "slurm-gpu")))
    files = checks["endpoint files"]
    assert files.outcome == "fail"
    for left in ("FILL-the-worker-environment", "BEAMLINE-CLIENT-ID", "facility"):
        assert left in files.detail, left
    assert "render-endpoint" in files.fix


def test_doctor_fails_a_module_load_whose_failure_is_hidden(site):
    assert render(site, "slurm-gpu").exit_code == 0
    template = site / "slurm-gpu" / ef.TEMPLATE
    text = template.read_text().replace(
        "      source {{", "      module load cuda/12 2>/dev/null || true\n      source {{", 1)
    template.write_text(text)
    files = by_name(endpoint_files_checks(doctor_settings(site, site / "slurm-gpu")))
    assert files["endpoint files"].outcome == "fail"
    assert "module load cuda/12 2>/dev/null || true" in files["endpoint files"].detail


def test_doctor_passes_rendered_files_and_checks_the_mapping_in_them(site):
    assert render(site, "slurm-gpu").exit_code == 0
    settings = doctor_settings(site, site / "slurm-gpu")
    checks = by_name(endpoint_files_checks(settings))
    assert checks["endpoint files"].outcome == "ok", checks["endpoint files"]
    # /soft/... is not on this host: said, not failed; the probe as the agent proves it.
    assert checks["worker environment"].outcome == "skip"
    assert "--as-agent" in checks["worker environment"].fix
    mapping = identity_mapping_check(settings)  # read from cluster.endpoint_dir
    assert mapping.outcome == "ok" and "'beamflow'" in mapping.detail


def test_a_worker_environment_in_another_users_home_fails(site):
    config = site / "beamflow.toml"
    config.write_text(config.read_text().replace('"/soft/beamflow-env-0.1.0"',
                                                 '"/home/jdoe/beamflow-env"'))
    assert render(site, "slurm-gpu").exit_code == 0
    env = by_name(endpoint_files_checks(doctor_settings(site, site / "slurm-gpu")))
    check = env["worker environment"]
    assert check.outcome == "fail" and "another user's home" in check.detail
    assert "beamflow" in check.detail


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make files another account owns")
def test_a_worker_environment_the_account_cannot_search_fails_on_this_host():
    nobody = pwd.getpwnam("nobody").pw_name
    top = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own tmp is root's alone
    try:
        top.chmod(0o755)
        env = top / "env"
        (env / "bin").mkdir(parents=True)
        (env / "bin" / "activate").write_text("")
        env.chmod(0o700)  # root's alone
        reach = ef.account_reaches(str(env), nobody)
        assert reach.ok is False and f"no search permission on {env}" in reach.detail
        env.chmod(0o755)
        assert ef.account_reaches(str(env), nobody).ok is True
    finally:
        shutil.rmtree(top)


def test_an_environment_this_account_can_read_passes(tmp_path):
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "activate").write_text("")
    me = pwd.getpwuid(os.getuid()).pw_name
    reach = ef.account_reaches(str(env), me)
    assert reach.ok is True and me in reach.detail
    assert ef.account_reaches("relative/env", me).ok is False


# -- doctor --probe --as-agent ----------------------------------------------------------------
def test_as_agent_without_the_agents_credentials_says_how_to_run_it(site):
    result = CliRunner().invoke(app, ["doctor", "--probe", "--as-agent", "--json", "--config",
                                      str(site / "beamflow.toml")])
    probe = {c["name"]: c for c in json.loads(result.stdout)}["worker probe"]
    assert probe["outcome"] == "fail" and "beamflow-as-agent doctor --probe --as-agent" in \
        probe["fix"]  # fmt: skip


def test_as_agent_goes_with_probe(site):
    result = CliRunner().invoke(app, ["doctor", "--as-agent", "--config",
                                      str(site / "beamflow.toml")])
    assert result.exit_code == 2 and "--probe" in result.output


# -- a local workspace: doctor and doctor --probe agree ----------------------------------------
@pytest.mark.timeout(180)
def test_doctor_and_the_probe_agree_in_a_local_workspace(tmp_path):
    assert CliRunner().invoke(app, ["init", str(tmp_path / "ws")]).exit_code == 0
    config = str(tmp_path / "ws" / "beamflow.toml")
    plain = CliRunner().invoke(app, ["doctor", "--json", "--config", config])
    assert plain.exit_code == 0, plain.output
    names = [c["name"] for c in json.loads(plain.stdout)]
    assert not any(n.startswith("globus") for n in names)  # no Globus id asked locally
    probed = CliRunner().invoke(app, ["doctor", "--probe", "--json", "--config", config])
    assert probed.exit_code == 0, probed.output
    checks = json.loads(probed.stdout)
    assert [c["name"] for c in checks][: len(names)] == names  # the same checks, then the probe
    assert {c["name"] for c in checks} >= {"worker probe", "worker Parsl"}
    bad = tmp_path / "ws" / "beamflow.toml"
    bad.write_text(bad.read_text().replace('detector_dir = "beamline/detector"',
                                           'detector_dir = "beamline/nowhere"'))
    for args in (["doctor"], ["doctor", "--probe"]):
        result = CliRunner().invoke(app, [*args, "--config", config])
        assert result.exit_code == 1 and "detector directory" in result.output, args
