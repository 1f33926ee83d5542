"""The edge agent driven by hand: a scripted run backend, a hand-driven clock, a workspace's
settings with short waits, Eiger-style scans written file by file, and one step of the agent's
loop after the events the watcher would have delivered. Shared by the agent's and the status
page's tests."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner
from watchdog.events import FileCreatedEvent

from beamflow.cli import app
from beamflow.config import Settings, load_config
from beamflow.error_kinds import ErrorKind
from beamflow.formats import Geometry
from beamflow.formats.eiger import data_file_name, master_path, write_data_file, write_master
from beamflow.registry import Registry, register_functions
from beamflow.runs.backend import FlowRunInfo, RunBackendError
from beamflow.runs.records import RunStatus
from beamflow.runs.store import Store
from edge_agent.agent import EdgeAgent
from edge_agent.scans import find_scans, scan_files

GEOMETRY = Geometry(energy_eV=8800.0, distance_m=2.0, detector_pixel_size_m=75e-6)


class ScriptedBackend:
    """A backend whose runs end when the test says so."""

    name = "local"

    def __init__(self, *, outlive: bool = True) -> None:
        self.runs_outlive_agent = outlive
        self.runs: dict[str, FlowRunInfo] = {}
        self.bodies: dict[str, dict] = {}
        self.start_faults: list[RunBackendError] = []
        self.get_calls = 0
        self.cancelled: list[str] = []

    def register_functions(self, *, dry_run: bool = False) -> list:
        return []

    def register_flows(self, *, dry_run: bool = False) -> list:
        return []

    def start_run(self, flow: str, body: dict, *, label: str, tags: list[str]) -> str:
        if self.start_faults:
            raise self.start_faults.pop(0)
        run_id = str(uuid.uuid4())
        self.runs[run_id] = FlowRunInfo(backend_run_id=run_id, status=RunStatus.ACTIVE)
        self.bodies[run_id] = body
        return run_id

    def get_run(self, backend_run_id: str) -> FlowRunInfo:
        self.get_calls += 1
        if backend_run_id not in self.runs:
            raise RunBackendError(f"no run {backend_run_id}")
        return self.runs[backend_run_id]

    def end(self, backend_run_id: str, status: RunStatus, error: str | None = None,
            step: str | None = None, *, kind: ErrorKind | None = None,
            output: dict | None = None) -> None:
        self.runs[backend_run_id] = FlowRunInfo(
            backend_run_id=backend_run_id, status=status, error=error, error_step=step,
            error_kind=kind, output=output or {},
        )

    def cancel_run(self, backend_run_id: str) -> None:
        self.cancelled.append(backend_run_id)
        self.end(backend_run_id, RunStatus.CANCELLED)

    def close(self) -> None:
        pass

    def active(self) -> list[str]:
        return [i for i, r in self.runs.items() if r.status == RunStatus.ACTIVE]


def flow_failure(step: str, error: str, action_details: dict) -> dict:
    """The flows' failure record ($.failure) of a caught action error, as both backends
    give it: the Cause is the action's status document, as JSON."""
    cause = json.dumps({"status": "FAILED", "details": action_details})
    return {"failure": {"step": step, "description": f"{step} failed",
                        "error": {"Error": error, "Cause": cause}}}


class Clock:
    """Real time plus what the test let pass: files written now are as old as they are."""

    def __init__(self) -> None:
        self.offset = 0.0

    @property
    def now(self) -> float:
        return time.time() + self.offset

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    result = CliRunner().invoke(app, ["init", str(tmp_path / "ws")])
    assert result.exit_code == 0, result.output
    settings = load_config(tmp_path / "ws" / "beamflow.toml")
    register_functions(
        Registry(settings.registry_path, "local"),
        create=lambda name: str(uuid.uuid4()),
        update=lambda name, function_id: function_id,
    )
    policy = settings.agent
    policy.quiet_seconds = 1.0
    policy.stall_timeout = 30.0
    policy.rescan_seconds = 0.5
    policy.poll_seconds = 1.0
    policy.retry_backoff_seconds = 10.0
    policy.max_retries = 2
    policy.max_concurrent_runs = 2
    return settings


def make_agent(settings: Settings, backend: ScriptedBackend, clock: Clock) -> EdgeAgent:
    return EdgeAgent(settings, store=Store(settings.store_path), backend=backend, clock=clock)


def write_scan(root: Path, name: str, n: int = 8, files: int | None = None,
               per_file: int = 2) -> Path:
    """An Eiger-style scan promising ``n`` frames with the first ``files`` data files."""
    master = master_path(root, name)
    master.parent.mkdir(parents=True, exist_ok=True)
    if not master.exists():
        positions = np.stack([np.arange(n) * 2e-7, np.zeros(n)], axis=1)
        write_master(master, geometry=GEOMETRY, frame_shape=(16, 16), positions_m=positions,
                     frames_per_file=per_file)
    total = -(-n // per_file) if files is None else files
    for index in range(1, total + 1):
        path = master.parent / data_file_name(name, index)
        if not path.exists():
            write_data_file(path, np.ones((per_file, 16, 16), np.uint32),
                            1 + (index - 1) * per_file)
    return master


def step(agent: EdgeAgent, clock: Clock, seconds: float = 0.0, passes: int = 1) -> None:
    """Let ``seconds`` pass (files age with the clock), then run the agent's loop, after
    the filesystem events the watcher would have delivered for the files written."""
    clock.offset += seconds
    for master in find_scans(agent.root):
        agent.changes.on_any_event(FileCreatedEvent(str(master)))
    for _ in range(passes):
        agent.tick()


def runs_of(store: Store, status: RunStatus | None = None) -> list:
    return store.list_runs(status=status, limit=None, oldest_first=True)


def age(master: Path, seconds: float) -> None:
    t = time.time() - seconds
    for entry in scan_files(master):
        os.utime(entry.path, (t, t))


def one_scan_started(settings: Settings, backend: ScriptedBackend | None = None
                     ) -> tuple[EdgeAgent, ScriptedBackend, Clock, Any]:
    """An agent that found scan s1 written whole and started its one run on ``backend``
    (default: a ScriptedBackend): (agent, backend, clock, the run)."""
    backend, clock = backend or ScriptedBackend(), Clock()
    agent = make_agent(settings, backend, clock)
    write_scan(settings.beamline.detector_dir, "s1")
    step(agent, clock, 2.0)
    (run,) = runs_of(agent.store)
    return agent, backend, clock, run


def transfer_fault(code: str, description: str) -> dict:
    """The flows' failure record of the raw data's transfer failing with Transfer's fault
    ``code``."""
    return flow_failure("TransferScanToHPC", "ActionFailedException",
                        {"fatal_error": {"code": code, "description": description}})


def transfer_failed(agent: EdgeAgent, backend: ScriptedBackend, clock: Clock, run: Any,
                    code: str, description: str) -> Any:
    """The run's raw-data transfer fails with Transfer's fault ``code``, and the agent sees it
    on its next pass: the run as the store then holds it."""
    backend.end(run.backend_run_id, RunStatus.FAILED, "TransferScanToHPCFailed",
                output=transfer_fault(code, description))
    step(agent, clock, 1.5)
    return agent.store.require_run(run.id)
