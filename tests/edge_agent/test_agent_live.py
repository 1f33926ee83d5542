"""The agent on the embedded local backend, with the simulator writing live into the watched
directory of a `beamflow init` workspace: real files, real flows, real reconstructions.

One agent serves the module (its compute worker stays warm, as at a beamline); each test
writes its own scans and checks what happened to them.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.config import Settings, load_config
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store
from beamflow.simulate import simulate_scan
from edge_agent.agent import EdgeAgent
from edge_agent.scans import scan_files

ITERATIONS = 3
QUIET = 0.5
SMALL = {"positions": 30, "probe_size": 32, "frames_per_file": 10, "photons": 1e5}


class Live:
    def __init__(self, settings: Settings, agent: EdgeAgent) -> None:
        self.settings = settings
        self.agent = agent
        self.store = Store(settings.store_path)
        self.detector = Path(settings.beamline.detector_dir)
        self.staging = Path(settings.state_dir) / "staging"

    def runs(self, scan: str) -> list[Run]:
        return [r for r in self.store.list_runs(limit=None, oldest_first=True)
                if r.scan_name == scan]

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                table = [(r.scan_name, r.fraction, r.status.value, r.attempt, r.error_step, r.error)
                         for r in self.store.list_runs(limit=None, oldest_first=True)]
                pytest.fail(f"timed out waiting for {what}; runs: {table}")
            time.sleep(0.1)

    def wait_done(self, scan: str, count: int = 1, timeout: float = 90.0) -> list[Run]:
        def done() -> bool:
            runs = self.runs(scan)
            return len(runs) >= count and all(r.status.finished for r in runs)

        self.wait(f"{count} finished run(s) of {scan}", done, timeout)
        return self.runs(scan)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("agent-live") / "ws"
    result = CliRunner().invoke(app, ["init", str(root)])
    assert result.exit_code == 0, result.output
    settings = load_config(root / "beamflow.toml")
    settings.reconstruction.iterations = ITERATIONS
    settings.reconstruction.checkpoint_every = 1
    settings.reconstruction.device = "cpu"
    policy = settings.agent
    policy.quiet_seconds = QUIET
    policy.stall_timeout = 3.0
    policy.poll_seconds = 0.2
    policy.rescan_seconds = 2.0
    policy.retry_backoff_seconds = 0.5
    policy.max_concurrent_runs = 2
    policy.progressive = [0.5]
    agent = EdgeAgent(settings)
    thread = threading.Thread(target=agent.run_forever, name="agent", daemon=True)
    thread.start()
    try:
        # The agent starts the compute engine when it starts, not at the first scan.
        deadline = time.monotonic() + 60
        while not engine_processes(settings):
            assert time.monotonic() < deadline, "the agent did not start the compute engine"
            time.sleep(0.1)
        assert Store(settings.store_path).list_runs() == []
        yield Live(settings, agent)
    finally:
        agent.stop()
        thread.join(30)
        agent.backend.close()
        assert not thread.is_alive()
    assert engine_processes(settings) == []


def engine_processes(settings: Settings) -> list[int]:
    from beamflow.local import engine

    base = settings.state_dir / "compute-engine"
    return [p for d in base.glob("*") for p in engine.engine_processes(d)]


def last_write(master: Path) -> float:
    return max(e.stat().st_mtime for e in scan_files(master))


def test_a_slow_scan_is_processed_once_only_when_complete_with_progressive_parts(
    live: Live,
) -> None:
    master = simulate_scan(live.detector, "slow", **{**SMALL, "positions": 40}, rate_hz=16.0)
    complete_at = last_write(master)
    partial, final = live.wait_done("slow", count=2)

    # The final run: one, whole scan, queued only after the files were quiet.
    assert final.status == RunStatus.SUCCEEDED, final.error
    assert final.fraction == 1.0 and final.parameters["max_frames"] is None
    assert final.created_at >= complete_at + QUIET
    summary = final.result["summary"]
    assert summary["n_frames"] == 40

    # The partial run: at half the frames, started while the scan was still being written.
    assert partial.fraction == 0.5 and partial.parameters["max_frames"] == 20
    assert partial.status == RunStatus.SUCCEEDED, partial.error
    assert partial.created_at < complete_at
    assert partial.result["summary"]["n_frames"] == 20
    # Serialised, and the final run continued from the partial run's checkpoint.
    assert final.started_at >= partial.finished_at
    assert summary["resumed_from_iteration"] == partial.result["summary"]["iterations"]
    assert summary["iterations"] == 2 * ITERATIONS

    # Previews came back to the beamline for both, as the scan went.
    for run in (partial, final):
        assert run.previews and all(Path(p).is_file() for p in run.previews)
        assert all(Path(p).is_relative_to(live.settings.beamline.preview_dir)
                   for p in run.previews)
    steps = [s.name for s in live.store.steps(final.id)]
    assert steps == ["TransferScanToHPC", "Reconstruct", "TransferResultsToBeamline"]
    assert all(s.duration is not None for s in live.store.steps(final.id))
    time.sleep(2 * QUIET)
    assert len(live.runs("slow")) == 2  # nothing more for that scan


def test_a_corrupt_and_a_truncated_scan_fail_clearly_and_the_next_good_one_succeeds(
    live: Live,
) -> None:
    bad = live.detector / "garbage"
    bad.mkdir()
    (bad / "garbage_master.h5").write_bytes(b"\x89HDF\r\n this is not really HDF5")

    # A scan with a data file cut short under its final name, moved in as a whole.
    staged = simulate_scan(live.staging, "cut", **SMALL)
    data = staged.parent / "cut_data_000002.h5"
    data.write_bytes(data.read_bytes()[:2000])
    shutil.move(staged.parent, live.detector / "cut")

    staged = simulate_scan(live.staging, "fine", **SMALL)
    shutil.move(staged.parent, live.detector / "fine")

    (garbage,) = live.wait_done("garbage")
    assert garbage.status == RunStatus.FAILED and garbage.error_step == "Readiness"
    assert "garbage_master.h5" in garbage.error and "HDF5" in garbage.error

    (cut,) = live.wait_done("cut")
    assert cut.status == RunStatus.FAILED and cut.error_step == "Readiness"
    assert "cut_data_000002.h5" in cut.error and "truncated or corrupt" in cut.error

    (fine,) = live.wait_done("fine")
    assert fine.status == RunStatus.SUCCEEDED, fine.error
    assert fine.attempt == 1 and fine.product and Path(fine.product).is_file()


def test_an_aborted_scan_is_reconstructed_from_its_frames_and_marked(live: Live) -> None:
    simulate_scan(live.detector, "stopped", **SMALL, stop_after=20)  # of 30 promised
    live.wait("the final run of the aborted scan",
              lambda: any(r.fraction == 1.0 for r in live.runs("stopped")), timeout=60)
    runs = live.wait_done("stopped")
    (run,) = [r for r in runs if r.fraction == 1.0]
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.parameters["aborted"] is True and run.parameters["max_frames"] == 20
    assert run.result["summary"]["n_frames"] == 20
    assert "ScanAborted" in [e.code for e in live.store.events(run.id)]


def test_the_concurrency_limit_holds_with_a_queue_behind_it(live: Live) -> None:
    names = [f"burst{i}" for i in range(4)]
    for name in names:
        staged = simulate_scan(live.staging, name, **SMALL)
        shutil.move(staged.parent, live.detector / name)  # whole scans appear at once
    runs = [r for name in names for r in live.wait_done(name)]
    assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * 4
    # At no moment were more runs active than the limit (run times from the store).
    edges = sorted([(r.started_at, 1) for r in runs] + [(r.finished_at, -1) for r in runs])
    active = peak = 0
    for _, change in edges:
        active += change
        peak = max(peak, active)
    assert peak == live.settings.agent.max_concurrent_runs
