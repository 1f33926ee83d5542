"""Per-run resources: the Reconstruct step hands Globus Compute a ``user_endpoint_config``
from the run's input (partition/queue, account, walltime), so progressive previews go to a
short queue and the whole scan's reconstruction to a long one (``[cluster.preview]``,
``[cluster.final]``); the endpoint templates take exactly those variables."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from endpoint_kit import DEPLOY, user_config
from flow_kit import FUNCTION_ID, scan_workspace

import flows
from beamflow.config import ConfigError, load_config
from beamflow.local.actions import ActionStatus, RunContext
from beamflow.local.clock import ManualClock
from beamflow.local.compute import ComputeRequest
from beamflow.local.interpreter import FlowRunner
from beamflow.local.validation import validate_input
from beamflow.runs.flow_input import flow_input_for
from beamflow.runs.lifecycle import create_scan_run, launch_run
from beamflow.runs.request import RunRequest
from beamflow.runs.store import Store
from beamflow.workspace_toml import local_workspace_toml

TRANSFER = "https://transfer.actions.globus.org/transfer"
COMPUTE = "https://compute.actions.globus.org/v3"
PREVIEW = {"partition": "debug", "walltime": "00:20:00"}
FINAL = {"partition": "gpu-long", "account": "ptycho_beam", "qos": "high", "walltime": "08:00:00"}


def _toml(table: dict[str, str]) -> str:
    return "".join(f'{k} = "{v}"\n' for k, v in table.items())


@pytest.fixture
def settings(tmp_path: Path):  # noqa: ANN201
    return scan_workspace(tmp_path, "\n[cluster.preview]\n" + _toml(PREVIEW)
                          + "\n[cluster.final]\n" + _toml(FINAL))  # fmt: skip


def body_for(settings, flow: str, fraction: float | None) -> dict[str, Any]:  # noqa: ANN001
    scan = settings.beamline.detector_dir / "s1"
    return flow_input_for(settings, scan, {}, "s1-abcdef12", flow=flow, function_id=FUNCTION_ID,
                          fraction=fraction)  # fmt: skip


@pytest.mark.parametrize("flow", ["ptycho_reconstruct", "ptycho_shared_fs"])
def test_previews_and_final_runs_get_their_own_resources(settings, flow: str) -> None:
    assert body_for(settings, flow, 0.25)["compute"]["user_endpoint_config"] == PREVIEW
    assert body_for(settings, flow, None)["compute"]["user_endpoint_config"] == FINAL
    assert body_for(settings, flow, 1.0)["compute"]["user_endpoint_config"] == FINAL
    assert validate_input(body_for(settings, flow, 0.5), flows.load_schema(flow)) == []


def test_nothing_configured_sends_an_empty_config(tmp_path: Path) -> None:
    body = body_for(scan_workspace(tmp_path), "ptycho_reconstruct", 0.5)
    assert body["compute"]["user_endpoint_config"] == {}  # the template's defaults
    assert validate_input(body, flows.load_schema("ptycho_reconstruct")) == []


@pytest.mark.parametrize(
    ("table", "key", "value"),
    [("preview", "walltime", "2 hours"), ("final", "partition", "gpu; rm -rf /"),
     ("final", "nodes", "4")],
)
def test_bad_resources_are_refused_naming_the_key(tmp_path: Path, table, key, value) -> None:
    config = tmp_path / "beamflow.toml"
    config.write_text(local_workspace_toml() + f'\n[cluster.{table}]\n{key} = "{value}"\n')
    with pytest.raises(ConfigError, match=rf"cluster\.{table}\.{key}"):
        load_config(config)


def test_the_flow_input_schema_refuses_what_the_templates_would(settings) -> None:  # noqa: ANN001
    for bad in ({"walltime": "1h"}, {"partition": "a b"}, {"nodes": "2"}):
        body = body_for(settings, "ptycho_reconstruct", None)
        body["compute"]["user_endpoint_config"] = bad
        assert validate_input(body, flows.load_schema("ptycho_reconstruct")), bad


class Recorder:
    """An action provider that records what the flow sends it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def start(self, body: dict[str, Any], context: RunContext) -> ActionStatus:
        self.bodies.append(body)
        return ActionStatus(action_id=str(uuid.uuid4()), status="SUCCEEDED",
                            details={"result": [{}]})  # fmt: skip

    def status(self, action_id: str) -> ActionStatus:  # pragma: no cover - never ACTIVE
        raise AssertionError

    def cancel(self, action_id: str) -> ActionStatus:  # pragma: no cover
        raise AssertionError


@pytest.mark.parametrize("flow", ["ptycho_reconstruct", "ptycho_shared_fs"])
@pytest.mark.parametrize(("fraction", "expected"), [(0.5, PREVIEW), (None, FINAL)])
def test_the_flow_hands_the_resources_to_compute(settings, flow, fraction, expected) -> None:  # noqa: ANN001
    """The definition itself, run by the interpreter: the Compute action's body carries the
    run's user_endpoint_config, and the local Compute provider accepts such a body."""
    transfer, compute = Recorder(), Recorder()
    runner = FlowRunner(flows.load_definition(flow), {TRANSFER: transfer, COMPUTE: compute},
                        input_schema=flows.load_schema(flow), clock=ManualClock())  # fmt: skip
    result = runner.run(body_for(settings, flow, fraction))
    assert result.status == "SUCCEEDED", result.error
    (sent,) = compute.bodies
    assert sent["user_endpoint_config"] == expected
    assert sent["endpoint_id"] == settings.compute.endpoint_id
    request = ComputeRequest.model_validate(sent)  # the local backend takes it (and ignores it)
    assert request.user_endpoint_config == expected


class CapturingBackend:
    name = "capture"

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def start_run(self, flow: str, body: dict[str, Any], *, label: str, tags: list[str]) -> str:
        self.bodies.append(body)
        return f"run-{len(self.bodies)}"


def test_launching_a_progressive_run_sends_the_preview_resources(settings) -> None:  # noqa: ANN001
    from beamflow.registry import Registry, function_checksum

    Registry(settings.registry_path, "local").record(
        "function", "reconstruct", FUNCTION_ID, function_checksum("reconstruct")
    )
    store = Store(settings.store_path)
    backend = CapturingBackend()
    scan = settings.beamline.detector_dir / "s1"
    part = create_scan_run(settings, store, RunRequest(
        scan_path=scan, fraction=0.5, params={"max_frames": 10}, dedupe_key="s1:0.5"))
    whole = create_scan_run(settings, store, RunRequest(scan_path=scan, fraction=1.0,
                                                        dedupe_key="s1:final"))
    launch_run(settings, store, backend, part)
    launch_run(settings, store, backend, whole)
    assert [b["compute"]["user_endpoint_config"] for b in backend.bodies] == [PREVIEW, FINAL]


@pytest.mark.parametrize(("kind", "resources"), [
    ("slurm-gpu", FINAL),
    ("pbspro-gpu", {"queue": "debug", "account": "ptycho_beam", "walltime": "00:20:00"}),
])
def test_the_endpoint_template_takes_them(kind: str, resources: dict[str, str]) -> None:
    """What a run sends is what the template's schema allows, and lands in the provider."""
    config = user_config(DEPLOY / kind, resources)
    try:
        provider = config.engine.executor.provider
        assert provider.walltime == resources["walltime"]
        assert provider.account == resources["account"]
        if kind == "slurm-gpu":
            assert (provider.partition, provider.qos) == (FINAL["partition"], FINAL["qos"])
        else:
            assert provider.queue == "debug"
    finally:
        config.engine.shutdown()
