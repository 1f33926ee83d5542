"""`beamflow agent` killed with -9 at several points and restarted: every scan ends processed
exactly once (one run each, SUCCEEDED, nothing lost); SIGTERM stops it cleanly, exit 0."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from process_kit import pid_running
from runs_kit import runs_when
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store
from beamflow.simulate import simulate_scan

BEAMFLOW = Path(sys.executable).with_name("beamflow")
SCANS = ("k1", "k2", "k3")
ENV = {
    # The beamflow of this checkout, whichever copy the venv's `beamflow` script would import.
    "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    "BEAMFLOW_RECONSTRUCTION__ITERATIONS": "3",
    "BEAMFLOW_RECONSTRUCTION__CHECKPOINT_EVERY": "1",
    "BEAMFLOW_RECONSTRUCTION__DEVICE": "cpu",
    "BEAMFLOW_AGENT__QUIET_SECONDS": "0.3",
    "BEAMFLOW_AGENT__POLL_SECONDS": "0.2",
    "BEAMFLOW_AGENT__RESCAN_SECONDS": "2",
    "BEAMFLOW_AGENT__RETRY_BACKOFF_SECONDS": "0.2",
    "BEAMFLOW_AGENT__MAX_RETRIES": "6",
    "BEAMFLOW_AGENT__MAX_CONCURRENT_RUNS": "1",
}


class Agent:
    """`beamflow agent` as systemd runs it: a process of its own, JSON logs on stderr."""

    started_here: list[Agent] = []  # killed at teardown if a test failed half-way

    def __init__(self, workspace: Path, log: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log
        self.offset = log.stat().st_size if log.exists() else 0
        self.started = time.time()
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [str(BEAMFLOW), "agent", "--config", str(workspace / "beamflow.toml")],
            stdout=self.log, stderr=self.log, env={**os.environ, **ENV, **(env or {})},
        )  # fmt: skip
        Agent.started_here.append(self)

    def said(self, message: str) -> bool:
        """Whether this agent process has logged ``message`` (JSON logs, one per line)."""
        with self.log_path.open("rb") as fh:
            fh.seek(self.offset)
            return f'"message": "{message}"'.encode() in fh.read()

    def kill(self) -> list[int]:
        """SIGKILL; the pids of its child processes still alive a few seconds later."""
        children = children_of(self.proc.pid)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.log.close()
        return gone(children)

    def terminate(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.log.close()


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def engine_of(workspace: Path, pid: int) -> list[int]:
    """The processes of the compute engine that agent ``pid`` started (its run directory is
    ``state/compute-engine/<time>-<pid>``)."""
    from beamflow.local.engine import engine_processes

    base = workspace / "state" / "compute-engine"
    return [p for d in base.glob(f"*-{pid}") for p in engine_processes(d)]


def gone(pids: list[int], within: float = 10.0) -> list[int]:
    """The processes of ``pids`` still alive after up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(pid_running(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if pid_running(p)]


def wait_until(store: Store, what: str, check: Callable[[list[Run]], bool],
               timeout: float = 120.0, log: Path | None = None) -> list[Run]:
    return runs_when(store, check, timeout, what, log)


@pytest.fixture(autouse=True)
def _no_agent_left_behind() -> Iterator[None]:
    yield
    while Agent.started_here:
        agent = Agent.started_here.pop()
        if agent.proc.poll() is None:
            for pid in children_of(agent.proc.pid):
                os.kill(pid, signal.SIGKILL)
            agent.proc.kill()
            agent.proc.wait(30)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    result = CliRunner().invoke(app, ["init", str(root)])
    assert result.exit_code == 0, result.output
    staging = tmp_path / "staging"
    for name in SCANS:  # whole scans, moved in at once, waiting for the agent
        master = simulate_scan(staging, name, positions=30, probe_size=32, frames_per_file=10,
                               photons=1e5)
        shutil.move(master.parent, root / "beamline" / "detector" / name)
    return root


@pytest.mark.slow
def test_kill_9_at_any_point_then_restart_processes_every_scan_exactly_once(
    workspace: Path,
) -> None:
    store = Store(workspace / "state" / "runs.sqlite")
    log = workspace / "agent.log"
    # Kill points, in the order the work reaches them, each judged on what *this* agent
    # process did (its own log lines, store rows it updated); each kill is followed by a
    # restart. Transfers of these small scans take milliseconds, too short to aim at.
    kill_points: list[tuple[str, Callable[[Agent, list[Run]], bool]]] = [
        ("a run was just queued", lambda a, runs: a.said("run queued") or a.said("run retry")),
        ("a run was just started (raw data on its way)", lambda a, runs: a.said("run started")),
        ("reconstructing", lambda a, runs: any(
            r.status == RunStatus.ACTIVE and r.current_step == "Reconstruct"
            and r.updated_at > a.started for r in runs)),
        ("right after a run succeeded", lambda a, runs: a.said("run finished")),
        ("right after the next run started", lambda a, runs: a.said("run started")),
    ]
    for what, point in kill_points:
        agent = Agent(workspace, log)
        wait_until(store, what, lambda runs, a=agent, p=point: p(a, runs), log=log)
        # Nothing it started goes on computing behind the restarted agent's back.
        assert agent.kill() == [], f"orphans after kill -9 ({what})"

    agent = Agent(workspace, log)
    runs = wait_until(store, "every scan done",
                      lambda runs: len(runs) >= len(SCANS)
                      and all(r.status.finished for r in runs), log=log)  # fmt: skip
    assert agent.terminate() == 0

    # Exactly once: one run per scan, each SUCCEEDED, each with a product on the beamline.
    assert sorted(r.scan_name for r in runs) == sorted(SCANS)
    for run in runs:
        assert run.status == RunStatus.SUCCEEDED, (run.scan_name, run.error)
        assert run.product and Path(run.product).is_file()
        assert run.dedupe_key.endswith("#final")
    # The kills hit runs in flight: those were found lost at restart and run again.
    retried = [r for r in runs if r.attempt > 1]
    assert retried
    messages = [e.message for r in retried for e in store.events(r.id)]
    assert any("lost" in m for m in messages)
    assert "agent stopped" in log.read_text()


def test_kill_9_mid_reconstruction_leaves_no_orphan_and_sigterm_is_prompt(
    workspace: Path,
) -> None:
    """A reconstruction far too long to end by itself: after kill -9 of the agent its
    worker goes too (else it would compute on beside the retry); SIGTERM mid-run stops the
    agent and its worker cleanly, the run waiting in the queue for the next start."""
    for name in SCANS[1:]:
        shutil.rmtree(workspace / "beamline" / "detector" / name)
    store = Store(workspace / "state" / "runs.sqlite")
    log = workspace / "agent.log"
    long_run = {"BEAMFLOW_RECONSTRUCTION__ITERATIONS": "1000000"}

    def computing(attempt: int) -> Callable[[list[Run]], bool]:
        return lambda runs: any(r.attempt == attempt and r.status == RunStatus.ACTIVE
                                and r.current_step == "Reconstruct" and (r.iteration or 0) >= 1
                                for r in runs)

    agent = Agent(workspace, log, long_run)
    wait_until(store, "iterations under way", computing(1), log=log)
    engine = engine_of(workspace, agent.proc.pid)
    assert len(engine) >= 4  # interchange, pool (manager, worker), the job script
    assert agent.kill() == []
    assert gone(engine) == []  # the whole compute engine, not only the agent's children

    agent = Agent(workspace, log, long_run)
    wait_until(store, "the retry's iterations under way", computing(2), log=log)
    children = children_of(agent.proc.pid)
    engine = engine_of(workspace, agent.proc.pid)
    assert agent.terminate(timeout=60) == 0
    assert gone(children) == []  # the interchange went with it
    assert gone(engine) == []  # and the worker pool, shut down in order
    (run,) = store.list_runs()
    assert run.status == RunStatus.QUEUED and run.attempt == 2
    assert store.events(run.id)[-1].code == "Interrupted"

    records = [json.loads(line) for line in log.read_text().splitlines()
               if line.startswith("{")]
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert records[-1]["message"] == "agent stopped"
    assert any(r["message"] == "run re-attached" for r in records)


def test_kill_9_of_an_idle_worker_then_the_next_scan_succeeds(
    workspace: Path, tmp_path: Path
) -> None:
    """An idle compute worker killed between scans (kill -9; an out-of-memory kill looks the
    same) used to leave the next scan in Reconstruct for ever: the pool's task queue stayed
    locked by the dead worker. The engine is restarted and the next scan goes through."""
    from beamflow.local.engine import pool_workers

    later = tmp_path / "later"
    later.mkdir()
    shutil.move(workspace / "beamline" / "detector" / "k2", later / "k2")
    shutil.rmtree(workspace / "beamline" / "detector" / "k3")
    store = Store(workspace / "state" / "runs.sqlite")
    log = workspace / "agent.log"
    agent = Agent(workspace, log)
    wait_until(store, "the first scan done",
               lambda runs: [r.status for r in runs] == [RunStatus.SUCCEEDED], log=log)  # fmt: skip
    base = workspace / "state" / "compute-engine"
    workers = [p for d in base.glob(f"*-{agent.proc.pid}") for p in pool_workers(d)]
    assert workers, "no worker of the agent's compute engine found"
    time.sleep(1)  # idle: each waits for its next task
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    assert gone(workers) == []

    shutil.move(later / "k2", workspace / "beamline" / "detector" / "k2")
    runs = wait_until(store, "the next scan done",
                      lambda runs: len(runs) == 2 and all(r.status.finished for r in runs),
                      timeout=180, log=log)  # fmt: skip
    assert agent.terminate() == 0
    assert [(r.scan_name, r.status) for r in runs] == [
        ("k1", RunStatus.SUCCEEDED), ("k2", RunStatus.SUCCEEDED)], [r.error for r in runs]
    text = log.read_text()
    assert "compute engine: restarting: 1 idle worker died" in text
    # The agent says which configuration it runs with.
    started = [json.loads(line) for line in text.splitlines() if '"agent started"' in line]
    assert started[0]["config"] == str(workspace / "beamflow.toml")
