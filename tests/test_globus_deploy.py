"""deploy/compute-endpoint: the Globus Compute endpoint configs parse and hold what
GlobusComputeEngine (Parsl's HighThroughputExecutor) and the Parsl providers accept, with
one worker pinned to each GPU and an environment with beamflow activated on the nodes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
CONFIGS = sorted((DEPLOY / "compute-endpoint").glob("*/config.yaml"))

# Top-level keys of a globus-compute-endpoint config (UserEndpointConfigModel).
ENDPOINT_KEYS = {
    "display_name", "engine", "amqp_port", "heartbeat_period", "heartbeat_threshold",
    "idle_heartbeats_soft", "idle_heartbeats_hard", "detach_endpoint", "endpoint_setup",
    "endpoint_teardown", "log_dir", "stdout", "stderr", "allowed_functions",
    "authentication_policy", "subscription_id", "environment", "debug", "multi_user",
}  # fmt: skip
# GlobusComputeEngine's own options plus those it passes to HighThroughputExecutor.
ENGINE_KEYS = {
    "type", "provider", "address", "strategy", "max_workers_per_node",
    "available_accelerators", "cpu_affinity", "max_retries_on_system_failure",
    "worker_debug", "cores_per_worker", "mem_per_worker", "prefetch_capacity",
    "heartbeat_period", "heartbeat_threshold", "job_status_kwargs", "run_in_sandbox",
    "working_dir", "encrypted", "label",
}  # fmt: skip
PROVIDER_KEYS = {
    "PBSProProvider": {
        "account", "queue", "scheduler_options", "select_options", "worker_init",
        "nodes_per_block", "cpus_per_node", "init_blocks", "min_blocks", "max_blocks",
        "parallelism", "launcher", "walltime", "cmd_timeout",
    },
    "SlurmProvider": {
        "partition", "account", "qos", "constraint", "nodes_per_block", "cores_per_node",
        "mem_per_node", "init_blocks", "min_blocks", "max_blocks", "parallelism", "walltime",
        "scheduler_options", "regex_job_id", "worker_init", "cmd_timeout", "exclusive",
        "launcher",
    },
    "LocalProvider": {
        "nodes_per_block", "launcher", "init_blocks", "min_blocks", "max_blocks",
        "worker_init", "cmd_timeout", "parallelism",
    },
}  # fmt: skip
LAUNCHERS = {"MpiExecLauncher", "SrunLauncher", "SingleNodeLauncher", "SimpleLauncher"}


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path}: not a mapping"
    return data


def test_the_three_kinds_are_there():
    assert {p.parent.name for p in CONFIGS} == {"pbspro-gpu", "slurm-gpu", "workstation"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.parent.name)
def test_endpoint_config_has_the_keys_the_endpoint_accepts(path):
    config = load(path)
    assert set(config) <= ENDPOINT_KEYS, set(config) - ENDPOINT_KEYS
    engine = config["engine"]
    assert engine["type"] == "GlobusComputeEngine"
    assert set(engine) <= ENGINE_KEYS, set(engine) - ENGINE_KEYS
    provider = engine["provider"]
    allowed = PROVIDER_KEYS[provider["type"]]
    assert set(provider) - {"type"} <= allowed, set(provider) - {"type"} - allowed
    if "launcher" in provider:
        assert provider["launcher"]["type"] in LAUNCHERS
    if "walltime" in provider:  # unquoted 01:00:00 would be YAML 1.1 sexagesimal: an int
        assert isinstance(provider["walltime"], str)
    assert provider["min_blocks"] <= provider["init_blocks"] or provider["init_blocks"] == 0
    assert provider["max_blocks"] >= 1


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.parent.name)
def test_one_worker_per_gpu_in_an_environment_with_beamflow(path):
    engine = load(path)["engine"]
    gpus = engine["available_accelerators"]
    count = gpus if isinstance(gpus, int) else len(gpus)
    assert engine["max_workers_per_node"] == count
    init = engine["provider"]["worker_init"]
    assert "activate" in init and "beamflow" in init


def test_cluster_configs_ask_the_scheduler_for_the_gpus_they_pin():
    pbs = load(DEPLOY / "compute-endpoint/pbspro-gpu/config.yaml")["engine"]
    assert pbs["available_accelerators"] == 4
    assert "ngpus=4" in pbs["provider"]["select_options"]
    slurm = load(DEPLOY / "compute-endpoint/slurm-gpu/config.yaml")["engine"]
    assert slurm["available_accelerators"] == 4
    assert "--gpus-per-node=4" in slurm["provider"]["scheduler_options"]


def test_guide_covers_every_config_and_the_setup_steps():
    guide = (DEPLOY / "README.md").read_text()
    for path in CONFIGS:
        assert path.parent.name in guide
    for topic in (
        "native app",
        "confidential client",
        "collection_root",
        "data_access",
        "beamflow login",
        "beamflow doctor",
        "systemd",
        'pip install "beamflow[gpu]"',
    ):
        assert topic in guide, topic
