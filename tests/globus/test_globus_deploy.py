"""deploy/compute-endpoint: every config loads with globus-compute-endpoint's own loader,
and each multi-user template, rendered with its example variables exactly as the endpoint
renders it, loads too; one worker pinned to each GPU, an environment with beamflow on the
nodes, and no address that depends on a network interface's name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from endpoint_kit import DEPLOY, core_config, example, render_user_config, user_config
from globus_compute_endpoint.endpoint.config import CoreEndpointConfig, UserEndpointConfig
from globus_compute_endpoint.endpoint.config.utils import get_config, load_config_yaml
from globus_compute_endpoint.engines import GlobusComputeEngine
from parsl.launchers import MpiExecLauncher, SrunLauncher
from parsl.providers import LocalProvider, PBSProProvider, SlurmProvider

ROOT = DEPLOY.parents[1]
CLUSTERS = ["pbspro-gpu", "slurm-gpu"]
KINDS = [*CLUSTERS, "workstation"]
FILES_OF_A_KIND = {
    "config.yaml",
    "user_config_template.yaml.j2",
    "user_config_schema.json",
    "example.json",
}


# Globus identities user@example.org run as the local account "user" (Globus Connect
# Server's expression mapping format, which the endpoint reads).
IDENTITY_MAPPING = {
    "DATA_TYPE": "expression_identity_mapping#1.0.0",
    "mappings": [{"source": "{username}", "match": "(.*)@example\\.org", "output": "{0}"}],
}


@pytest.fixture
def loaded():
    """Configs loaded in a test; their engines (built, never started) are shut down after."""
    configs: list[UserEndpointConfig] = []
    yield configs
    for config in configs:
        config.engine.shutdown()


# The clusters' extra files: who runs as whom (multi-user, root), and the no-root form.
CLUSTER_FILES = {"identity_mapping.json", "config.single-user.yaml"}


def test_the_three_kinds_are_there():
    assert {p.name for p in DEPLOY.iterdir() if p.is_dir()} == set(KINDS)
    for name in KINDS:
        extra = CLUSTER_FILES if name in CLUSTERS else set()
        assert {p.name for p in (DEPLOY / name).iterdir()} == FILES_OF_A_KIND | extra, name


@pytest.mark.parametrize("name", KINDS)
def test_config_is_an_endpoint_that_start_accepts(name):
    """`globus-compute-endpoint start` (4.19) refuses a config.yaml with an `engine`:
    the engine lives in the template, config.yaml loads as the (multi-user) endpoint."""
    config = get_config(DEPLOY / name)
    assert isinstance(config, CoreEndpointConfig)
    assert core_config(DEPLOY / name) is not None
    assert config.amqp_port == 443
    assert config.display_name and "beamflow" in config.display_name


def test_workstation_template_renders_one_worker_per_gpu(loaded):
    opts = example(DEPLOY / "workstation")
    config = user_config(DEPLOY / "workstation", opts)
    loaded.append(config)
    engine = config.engine
    assert isinstance(engine, GlobusComputeEngine)
    htex = engine.executor
    assert isinstance(htex.provider, LocalProvider)
    assert htex.max_workers_per_node == len(htex.available_accelerators) == opts["gpus"]
    assert htex.address is None  # Parsl offers every address of the host
    assert f'source "{opts["beamflow_env"]}"/bin/activate' in htex.provider.worker_init
    cpu = user_config(DEPLOY / "workstation", {"gpus": 0, "cpu_workers": 3})
    loaded.append(cpu)
    assert cpu.engine.executor.max_workers_per_node == 3
    assert cpu.engine.executor.available_accelerators == []


@pytest.mark.parametrize("name", CLUSTERS)
def test_template_renders_with_its_example_and_loads(name, loaded):
    opts = example(DEPLOY / name)
    config = user_config(DEPLOY / name, opts)
    loaded.append(config)
    assert config.amqp_port == 443
    assert config.idle_heartbeats_soft > 0  # idle users give their nodes back
    engine = config.engine
    assert isinstance(engine, GlobusComputeEngine)
    htex = engine.executor
    gpus = opts["gpus_per_node"]
    assert htex.max_workers_per_node == gpus
    assert htex.available_accelerators == [str(i) for i in range(gpus)]
    assert htex.address is None
    assert engine.max_retries_on_system_failure == 1
    provider = htex.provider
    assert provider.walltime == opts["walltime"]
    assert provider.max_blocks == opts["max_blocks"]
    assert provider.init_blocks == provider.min_blocks == 0
    assert f'source "{opts["beamflow_env"]}"/bin/activate' in provider.worker_init
    assert f"OMP_NUM_THREADS={opts['omp_threads']}" in provider.worker_init
    if name == "slurm-gpu":
        assert isinstance(provider, SlurmProvider)
        assert (provider.partition, provider.account) == (opts["partition"], opts["account"])
        assert f"#SBATCH --gpus-per-node={gpus}" in provider.scheduler_options
        assert isinstance(provider.launcher, SrunLauncher)
        assert "--ntasks-per-node=1" in provider.launcher.overrides
    else:
        assert isinstance(provider, PBSProProvider)
        assert (provider.queue, provider.account) == (opts["queue"], opts["account"])
        assert f"ngpus={gpus}" in provider.select_options
        assert f"filesystems={opts['filesystems']}" in provider.scheduler_options
        assert isinstance(provider.launcher, MpiExecLauncher)
        assert f"--depth={opts['cpus_per_node']} --ppn 1" in provider.launcher.overrides


@pytest.mark.parametrize("name", KINDS)
def test_template_loads_with_no_variables(name, loaded):
    """beamflow's flows send no user_endpoint_config: the site's defaults apply."""
    config = user_config(DEPLOY / name, {})
    loaded.append(config)
    htex = config.engine.executor
    gpus = 2 if name == "workstation" else 4
    assert htex.max_workers_per_node == len(htex.available_accelerators) == gpus
    # As shipped, the environment is a placeholder: `beamflow render-endpoint` fills it in,
    # and `beamflow doctor` fails while it is left (tests/globus/test_endpoint_render.py).
    assert 'source "FILL-the-worker-environment"/bin/activate' in htex.provider.worker_init
    assert "module" not in htex.provider.worker_init  # no module a site may not have
    if name != "workstation":
        assert htex.provider.walltime == "01:00:00"


def test_slurm_template_states_partition_and_account_once(loaded):
    """One #SBATCH line each: the provider writes them from its own settings, so the
    template must not repeat them in scheduler_options or the launcher."""
    opts = {**example(DEPLOY / "slurm-gpu"), "qos": "normal"}
    config = user_config(DEPLOY / "slurm-gpu", opts)
    loaded.append(config)
    provider = config.engine.executor.provider
    script = provider.scheduler_options
    for option in ("partition", "account", "qos"):
        assert script.count(f"#SBATCH --{option}=") == 1, script
        assert f"--{option}" not in provider.launcher.overrides
    assert f"#SBATCH --partition={opts['partition']}" in script
    template = (DEPLOY / "slurm-gpu" / "user_config_template.yaml.j2").read_text()
    assert template.count("partition:") == template.count("account:") == 1


def test_slurm_template_on_cpu_nodes_asks_for_no_gpu(loaded):
    config = user_config(DEPLOY / "slurm-gpu", {"gpus_per_node": 0, "cpu_workers_per_node": 2})
    loaded.append(config)
    htex = config.engine.executor
    assert htex.max_workers_per_node == 2
    assert htex.available_accelerators == []
    assert "gpus" not in htex.provider.scheduler_options
    assert "gpus" not in htex.provider.launcher.overrides


@pytest.mark.parametrize(
    ("name", "opts"),
    [
        ("slurm-gpu", {"partition": "gpu\nengine: {type: ThreadPoolEngine}"}),
        ("slurm-gpu", {"beamflow_env": "/opt/env; curl evil | sh"}),
        ("slurm-gpu", {"gpus_per_node": "4"}),
        ("slurm-gpu", {"walltime": "1 hour"}),
        ("slurm-gpu", {"nodes": 8}),
        ("pbspro-gpu", {"filesystems": 'home"\nengine: x'}),
        ("pbspro-gpu", {"gpus_per_node": 0}),
        ("pbspro-gpu", {"beamflow_env": "relative/env"}),
        ("workstation", {"beamflow_env": '/opt/env"\nexport X=1'}),
        ("workstation", {"gpus": -1}),
    ],
)
def test_schema_refuses_what_could_break_the_config_or_the_shell(name, opts):
    with pytest.raises(jsonschema.ValidationError):
        render_user_config(DEPLOY / name, opts)


FILES = sorted(p for p in DEPLOY.rglob("*") if p.is_file())


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_no_config_names_a_network_interface(path: Path):
    """A config must not name an interface that may not exist on the login node."""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        assert "address_by_interface" not in line, f"{path}: {line}"


@pytest.mark.parametrize("name", KINDS)
def test_the_documented_configure_and_render_commands_work(name, tmp_path, loaded):
    """docs/deployment.md's commands, run with the endpoint's own CLI into a scratch
    GLOBUS_COMPUTE_USER_DIR (offline: configure and render-user-config need no login)."""
    env = {**os.environ, "HOME": str(tmp_path), "GLOBUS_COMPUTE_USER_DIR": str(tmp_path / "gc")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    kind = DEPLOY / name
    configure = ["globus-compute-endpoint", "configure", "beamflow"]
    if name == "workstation":
        configure += ["--multi-user", "false"]
    else:
        mapping = tmp_path / "identity-mapping.json"
        mapping.write_text(json.dumps([IDENTITY_MAPPING]))
        configure += ["--multi-user", "true", "--contact-email", "ops@example.org"]
        configure += ["--id-mapping-config", str(mapping)]
    configure += ["--core-config", str(kind / "config.yaml")]
    configure += ["--template-config", str(kind / "user_config_template.yaml.j2")]
    configure += ["--schema-config", str(kind / "user_config_schema.json")]
    done = subprocess.run(configure, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    endpoint_dir = tmp_path / "gc" / "beamflow"
    config = core_config(endpoint_dir)
    if name != "workstation":  # what `start` checks of a multi-user endpoint run as root
        assert config.email == "ops@example.org"
        assert config.identity_mapping_config_path == endpoint_dir / "identity_mapping_config.json"
    render = ["globus-compute-endpoint", "render-user-config", "-e", "beamflow"]
    render += ["-o", str(kind / "example.json")]
    done = subprocess.run(render, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == render_user_config(kind, example(kind)) + "\n"  # print()
    rendered = load_config_yaml(done.stdout)
    assert isinstance(rendered, UserEndpointConfig)
    loaded.append(rendered)


@pytest.mark.parametrize("name", CLUSTERS)
def test_the_no_root_form_is_a_single_user_endpoint_of_the_same_engine(name, tmp_path, loaded):
    """config.single-user.yaml: the endpoint the service account runs without root, no
    identity mapping; configured with the endpoint's own CLI and loaded with its loader, it
    renders the same template as the multi-user form."""
    kind = DEPLOY / name
    single = kind / "config.single-user.yaml"
    config = load_config_yaml(single.read_text())
    assert isinstance(config, CoreEndpointConfig)
    assert config.identity_mapping_config_path is None and config.amqp_port == 443
    assert "service account" in config.display_name
    env = {**os.environ, "HOME": str(tmp_path), "GLOBUS_COMPUTE_USER_DIR": str(tmp_path / "gc")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    configure = ["globus-compute-endpoint", "configure", "beamflow", "--multi-user", "false"]
    configure += ["--core-config", str(single)]
    configure += ["--template-config", str(kind / "user_config_template.yaml.j2")]
    configure += ["--schema-config", str(kind / "user_config_schema.json")]
    done = subprocess.run(configure, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    installed = core_config(tmp_path / "gc" / "beamflow")
    assert installed.identity_mapping_config_path is None
    assert not installed.public and installed.email is None
    render = ["globus-compute-endpoint", "render-user-config", "-e", "beamflow"]
    done = subprocess.run(render, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rendered = load_config_yaml(done.stdout)
    loaded.append(rendered)
    assert isinstance(rendered.engine, GlobusComputeEngine)
    assert done.stdout == render_user_config(kind, {}) + "\n"
    guide = (ROOT / "docs" / "deployment.md").read_text()
    assert f"deploy/compute-endpoint/{name}/config.single-user.yaml" in guide


def test_guide_covers_every_config_and_the_setup_steps():
    guide = (DEPLOY.parent / "README.md").read_text()
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    for name in (*CLUSTERS, "workstation"):
        assert name in guide and name in deployment, name
    for topic in (
        "native app",
        "confidential client",
        "collection_root",
        "data_access",
        "beamflow login",
        "beamflow doctor",
        "systemd",
        "constraints-worker.txt",
        "make dist",
        "user_config_template.yaml.j2",
        "--multi-user true",
    ):
        assert topic in guide, topic
    for topic in ("render-user-config", "--id-mapping-config", "PBS Pro", "pytest -m slurm"):
        assert topic in deployment, topic
