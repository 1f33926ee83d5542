"""The agent's decisions against a real run store and the real run path, with a scripted
backend and a hand-driven clock: the queue and its limit, one run at a time per scan,
progressive parts, retries (and none for bad input), aborted and broken scans, restarts."""

from __future__ import annotations

import json

import pytest
from agent_kit import (
    Clock,
    ScriptedBackend,
    flow_failure,
    make_agent,
    one_scan_started,
    runs_of,
    settings,
    step,
    transfer_failed,
    write_scan,
)
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.config import Settings
from beamflow.error_kinds import ErrorKind
from beamflow.runs.backend import RunBackendError
from beamflow.runs.records import RunStatus
from beamflow.runs.store import Store
from edge_agent.policy import dedupe_key, is_transient, retry_delay

__all__ = ["settings"]  # the fixture, imported


def test_queue_respects_the_concurrency_limit(settings: Settings) -> None:
    backend, clock = ScriptedBackend(), Clock()
    agent = make_agent(settings, backend, clock)
    for i in range(5):
        write_scan(settings.beamline.detector_dir, f"s{i}")
    step(agent, clock, 2.0)
    store = agent.store
    assert len(runs_of(store)) == 5
    assert len(runs_of(store, RunStatus.ACTIVE)) == 2 and len(backend.active()) == 2
    finished = 0
    while backend.active():
        for run_id in backend.active()[:1]:
            backend.end(run_id, RunStatus.SUCCEEDED)
            finished += 1
        step(agent, clock, 2.0, passes=2)
        assert len(runs_of(store, RunStatus.ACTIVE)) <= 2
    assert finished == 5
    assert [r.status for r in runs_of(store)] == [RunStatus.SUCCEEDED] * 5
    # Seen again later (a rescan, a restart), no scan gets a second run.
    step(agent, clock, 60.0, passes=2)
    assert len(runs_of(store)) == 5 and len(backend.runs) == 5


def test_progressive_parts_run_one_at_a_time_per_scan(settings: Settings) -> None:
    settings.agent.progressive = [0.5]
    backend, clock = ScriptedBackend(), Clock()
    agent = make_agent(settings, backend, clock)
    root = settings.beamline.detector_dir
    write_scan(root, "s1", n=8, files=1)  # 2 of 8 frames
    step(agent, clock, 0.1)
    assert runs_of(agent.store) == []
    write_scan(root, "s1", n=8, files=2)  # 4 of 8: half
    step(agent, clock, 0.1)
    (partial,) = runs_of(agent.store)
    assert partial.status == RunStatus.ACTIVE and partial.fraction == 0.5
    assert partial.parameters["max_frames"] == 4
    assert backend.bodies[partial.backend_run_id]["reconstruction"]["max_frames"] == 4
    write_scan(root, "s1", n=8)  # complete
    step(agent, clock, 2.0)
    partial, final = runs_of(agent.store)
    assert final.fraction == 1.0 and final.parameters["max_frames"] is None
    assert final.status == RunStatus.QUEUED  # waits for the partial run of the same scan
    # Both continue from the scan's one checkpoint directory.
    body = backend.bodies[partial.backend_run_id]
    backend.end(partial.backend_run_id, RunStatus.SUCCEEDED)
    step(agent, clock, 2.0, passes=2)
    final = agent.store.require_run(final.id)
    assert final.status == RunStatus.ACTIVE
    assert (backend.bodies[final.backend_run_id]["compute"]["checkpoint_dir"]
            == body["compute"]["checkpoint_dir"])


def test_a_partial_run_still_queued_when_more_frames_arrive_is_superseded(
    settings: Settings,
) -> None:
    settings.agent.progressive = [0.25, 0.5]
    settings.agent.max_concurrent_runs = 1
    backend, clock = ScriptedBackend(), Clock()
    agent = make_agent(settings, backend, clock)
    root = settings.beamline.detector_dir
    write_scan(root, "busy")
    step(agent, clock, 2.0)  # takes the only slot
    write_scan(root, "s1", n=8, files=1)  # 25 %
    step(agent, clock, 0.1)
    write_scan(root, "s1", n=8)  # complete before the 25 % run could start
    step(agent, clock, 2.0)
    parts = {r.fraction: r for r in agent.store.list_runs(scan="s1", limit=None)}
    assert parts[0.25].status == RunStatus.CANCELLED and "superseded" in parts[0.25].error
    assert parts[1.0].status == RunStatus.QUEUED
    assert [e.code for e in agent.store.events(parts[0.25].id)] == ["Superseded"]


def test_transient_failures_are_retried_with_backoff_then_given_up(settings: Settings) -> None:
    agent, backend, clock, run = one_scan_started(settings)
    for attempt in (1, 2, 3):
        run = agent.store.require_run(run.id)
        assert run.status == RunStatus.ACTIVE and run.attempt == attempt
        backend.end(run.backend_run_id, RunStatus.FAILED, "RunLost: lost: the process ended",
                    kind=ErrorKind.LOST)
        step(agent, clock, 1.5)
        run = agent.store.require_run(run.id)
        if attempt == 3:
            break
        assert run.status == RunStatus.QUEUED and run.attempt == attempt + 1
        delay = retry_delay(settings.agent.retry_backoff_seconds, attempt)
        step(agent, clock, delay / 2)
        assert agent.store.require_run(run.id).status == RunStatus.QUEUED  # backing off
        step(agent, clock, delay / 2 + 0.5)
    assert run.status == RunStatus.FAILED and run.attempt == 3 == settings.agent.max_retries + 1
    assert len(runs_of(agent.store)) == 1  # one record, three attempts
    codes = [e.code for e in agent.store.events(run.id)]
    assert codes.count("RetryScheduled") == 2


def test_bad_input_is_not_retried(settings: Settings) -> None:
    agent, backend, clock, run = one_scan_started(settings)
    backend.end(run.backend_run_id, RunStatus.FAILED, "ReconstructFailed", output=flow_failure(
        "Reconstruct", "ActionFailedException", {"error": {
            "type": "ValueError",
            "message": "scan s1: reconstruction failed: ScanFormatError: frames hold NaN"}}))
    step(agent, clock, 1.5)
    run = agent.store.require_run(run.id)
    assert run.status == RunStatus.FAILED and run.attempt == 1
    assert (run.error_step, run.error_kind) == ("Reconstruct", ErrorKind.BAD_INPUT)
    assert run.error.endswith("frames hold NaN") and "Error" not in run.error
    step(agent, clock, 100.0, passes=2)
    assert len(backend.runs) == 1


def test_a_transient_fault_is_retried_however_it_is_worded(settings: Settings) -> None:
    """The kind decides, not the words: a transfer fault that says "invalid" (the old rule
    never retried it) is retried; a reconstruction that failed on good input is not."""
    agent, backend, clock, run = one_scan_started(settings)
    run = transfer_failed(agent, backend, clock, run, "CONNECTION_RESET",
                          "invalid response from the data server")
    assert (run.status, run.attempt) == (RunStatus.QUEUED, 2)
    assert "invalid response" in agent.store.events(run.id)[-1].message
    step(agent, clock, retry_delay(settings.agent.retry_backoff_seconds, 1) + 0.5)
    run = agent.store.require_run(run.id)
    assert run.status == RunStatus.ACTIVE
    backend.end(run.backend_run_id, RunStatus.FAILED, "ReconstructFailed", output=flow_failure(
        "Reconstruct", "ActionFailedException", {"error": {
            "type": "RuntimeError", "message": "scan s1: reconstruction failed: the loss "
            "diverged (network timeout while saving)"}}))
    step(agent, clock, 1.5)
    run = agent.store.require_run(run.id)
    assert (run.status, run.error_kind, run.attempt) == (RunStatus.FAILED, ErrorKind.FAILED, 2)


@pytest.mark.parametrize(("transient", "status", "attempt"), [
    (True, RunStatus.ACTIVE, 2),
    (False, RunStatus.FAILED, 1),
])
def test_start_failures(settings: Settings, transient: bool, status: RunStatus,
                        attempt: int) -> None:
    backend, clock = ScriptedBackend(), Clock()
    backend.start_faults.append(RunBackendError("service unavailable", transient=transient,
                                             step="Start"))
    agent = make_agent(settings, backend, clock)
    write_scan(settings.beamline.detector_dir, "s1")
    step(agent, clock, 2.0)
    step(agent, clock, retry_delay(settings.agent.retry_backoff_seconds, 1) + 0.1)
    (run,) = runs_of(agent.store)
    assert (run.status, run.attempt) == (status, attempt)
    if status == RunStatus.FAILED:
        assert run.error_step == "Start" and "unavailable" in run.error


def test_only_lost_and_transient_faults_are_worth_a_retry() -> None:
    from beamflow.runs.records import Run

    def run(kind: ErrorKind | None) -> Run:
        return Run(id="r", scan_name="s", scan_path="/d/s", flow="f", backend="local",
                   status=RunStatus.FAILED, created_at=0, updated_at=0, error_kind=kind,
                   error="temporary network timeout: invalid")  # fmt: skip

    assert is_transient(run(ErrorKind.LOST)) and is_transient(run(ErrorKind.TRANSIENT))
    for kind in (ErrorKind.BAD_INPUT, ErrorKind.FAILED, ErrorKind.CANCELLED, None):
        assert not is_transient(run(kind))


def test_an_aborted_scan_is_processed_with_its_frames_and_marked(settings: Settings) -> None:
    backend, clock = ScriptedBackend(), Clock()
    agent = make_agent(settings, backend, clock)
    write_scan(settings.beamline.detector_dir, "s1", n=8, files=3)  # 6 of 8, then nothing
    step(agent, clock, 2.0)
    assert runs_of(agent.store) == []  # short, but not stalled yet: still being written
    step(agent, clock, settings.agent.stall_timeout)
    (run,) = runs_of(agent.store)
    assert run.status == RunStatus.ACTIVE
    assert run.parameters["aborted"] is True and run.parameters["max_frames"] == 6
    assert backend.bodies[run.backend_run_id]["reconstruction"]["aborted"] is True
    (event,) = [e for e in agent.store.events(run.id) if e.code == "ScanAborted"]
    assert "6 of 8" in event.message


def test_an_unreadable_scan_fails_at_once_naming_the_file(settings: Settings) -> None:
    backend, clock = ScriptedBackend(), Clock()
    agent = make_agent(settings, backend, clock)
    scan_dir = settings.beamline.detector_dir / "bad"
    scan_dir.mkdir()
    (scan_dir / "bad_master.h5").write_bytes(b"not HDF5 at all")
    write_scan(settings.beamline.detector_dir, "good")
    step(agent, clock, 2.0)
    bad = agent.store.get_run_by_key(dedupe_key(scan_dir / "bad_master.h5", "final"))
    assert bad.status == RunStatus.FAILED and bad.error_step == "Readiness"
    assert "bad_master.h5" in bad.error and "not an HDF5 file" in bad.error
    assert len(backend.runs) == 1  # only the good scan went to the backend
    (good,) = agent.store.list_runs(scan="good")
    assert good.status == RunStatus.ACTIVE


def test_a_scan_part_that_cannot_be_queued_is_recorded_failed_once(settings: Settings) -> None:
    # Parameters the run path refuses (set past the configuration's own check): each scan gets
    # one failed run that says why, through the run path's API, and is not asked again.
    settings.reconstruction.iterations = -1
    backend, clock = ScriptedBackend(), Clock()
    agent = make_agent(settings, backend, clock)
    master = write_scan(settings.beamline.detector_dir, "s1")
    step(agent, clock, 2.0)
    (run,) = runs_of(agent.store)
    assert (run.status, run.error_step, run.error_kind) == (
        RunStatus.FAILED, "Queue", ErrorKind.BAD_INPUT)
    assert run.error.startswith("parameter iterations=-1")
    assert (run.scan_name, run.scan_path, run.backend) == ("s1", str(master.resolve()), "local")
    assert run.dedupe_key == dedupe_key(master, "final") and run.parameters["iterations"] == -1
    assert agent.stats.failed == 1
    step(agent, clock, 100.0, passes=2)
    assert runs_of(agent.store) == [agent.store.require_run(run.id)] and backend.runs == {}
    assert agent.stats.failed == 1


def test_a_restarted_agent_reattaches_and_starts_what_was_queued(settings: Settings) -> None:
    settings.agent.max_concurrent_runs = 1
    backend, clock = ScriptedBackend(), Clock()
    first = make_agent(settings, backend, clock)
    for name in ("a", "b"):
        write_scan(settings.beamline.detector_dir, name)
    step(first, clock, 2.0)
    active, queued = runs_of(first.store)
    assert (active.status, queued.status) == (RunStatus.ACTIVE, RunStatus.QUEUED)
    del first  # "killed": nothing in memory survives

    second = make_agent(settings, backend, clock)
    step(second, clock, 0.1)
    assert len(backend.runs) == 1  # re-attached to the run that is going, not restarted
    backend.end(active.backend_run_id, RunStatus.SUCCEEDED)
    step(second, clock, 2.0, passes=2)
    assert second.store.require_run(active.id).status == RunStatus.SUCCEEDED
    queued = second.store.require_run(queued.id)
    assert queued.status == RunStatus.ACTIVE
    backend.end(queued.backend_run_id, RunStatus.SUCCEEDED)
    step(second, clock, 2.0, passes=2)
    assert [r.status for r in runs_of(second.store)] == [RunStatus.SUCCEEDED] * 2
    assert len(backend.runs) == 2


def test_a_clean_stop_requeues_runs_that_live_in_the_agent(settings: Settings) -> None:
    agent, backend, clock, run = one_scan_started(settings, ScriptedBackend(outlive=False))
    agent.stop()
    agent._shutdown()
    run = agent.store.require_run(run.id)
    assert run.status == RunStatus.QUEUED and run.attempt == 1 and run.backend_run_id is None
    assert backend.cancelled and "Interrupted" in [e.code for e in agent.store.events(run.id)]
    again = make_agent(settings, backend, clock)
    step(again, clock, 0.1)
    assert again.store.require_run(run.id).status == RunStatus.ACTIVE


def test_polling_backs_off_while_nothing_changes(settings: Settings) -> None:
    backend, clock = ScriptedBackend(), Clock()
    agent = make_agent(settings, backend, clock)
    write_scan(settings.beamline.detector_dir, "s1")
    step(agent, clock, 2.0)
    backend.get_calls = 0
    for _ in range(600):  # ten minutes of a run that does not change, a pass a second
        step(agent, clock, 1.0)
    # Every second at first, then less and less often (capped at 10× poll_seconds).
    assert 60 <= backend.get_calls <= 100


# -- attempts and full disks (issue 36) --------------------------------------------------------
def test_a_retried_run_lists_every_attempt_with_its_start_end_error_and_kind(
    settings: Settings,
) -> None:
    from fastapi.testclient import TestClient

    from beamflow.status import StatusOptions, create_app

    backend, clock = ScriptedBackend(), Clock()
    backend.start_faults.append(RunBackendError("service unavailable", transient=True,
                                             step="Start"))
    agent = make_agent(settings, backend, clock)
    write_scan(settings.beamline.detector_dir, "s1")
    step(agent, clock, 2.0)  # attempt 1 cannot start
    step(agent, clock, retry_delay(settings.agent.retry_backoff_seconds, 1) + 0.1)
    (run,) = runs_of(agent.store)
    assert (run.status, run.attempt) == (RunStatus.ACTIVE, 2)
    backend.end(run.backend_run_id, RunStatus.FAILED, "RunLost: the worker ended",
                "Reconstruct", kind=ErrorKind.LOST)
    step(agent, clock, 1.5)  # attempt 2 is lost
    step(agent, clock, retry_delay(settings.agent.retry_backoff_seconds, 2) + 0.5)
    run = agent.store.require_run(run.id)
    assert (run.status, run.attempt) == (RunStatus.ACTIVE, 3)
    second_backend_run = [i for i in backend.runs if i != run.backend_run_id][0]
    backend.end(run.backend_run_id, RunStatus.SUCCEEDED)
    step(agent, clock, 1.5)
    run = agent.store.require_run(run.id)
    assert run.status == RunStatus.SUCCEEDED and len(runs_of(agent.store)) == 1

    attempts = agent.store.attempts(run)
    assert [(a.attempt, a.status, a.error_step, a.error_kind) for a in attempts] == [
        (1, RunStatus.FAILED, "Start", ErrorKind.TRANSIENT),
        (2, RunStatus.FAILED, "Reconstruct", ErrorKind.LOST),
        (3, RunStatus.SUCCEEDED, None, None)]
    assert attempts[0].started_at is None and "service unavailable" in attempts[0].error
    assert attempts[1].backend_run_id == second_backend_run
    assert attempts[1].started_at < attempts[1].finished_at <= attempts[2].started_at
    assert "the worker ended" in attempts[1].error

    config = str(settings.source)
    shown = CliRunner().invoke(app, ["runs", "show", run.id[:8], "-c", config])
    assert shown.exit_code == 0, shown.output
    table = shown.stdout.split("attempts", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["1", "2", "3"]
    assert "Start" in rows[0] and "transient" in rows[0] and "service unavailable" in rows[0]
    assert "Reconstruct" in rows[1] and "lost" in rows[1] and "FAILED" in rows[1]
    assert "SUCCEEDED" in rows[2]
    data = json.loads(CliRunner().invoke(app, ["runs", "show", run.id, "--json", "-c",
                                                config]).stdout)
    assert [(a["attempt"], a["status"], a["error_kind"]) for a in data["attempts"]] == [
        (1, "FAILED", "transient"), (2, "FAILED", "lost"), (3, "SUCCEEDED", None)]

    client = TestClient(create_app(Store(settings.store_path), StatusOptions()),
                        base_url="http://127.0.0.1:8765")
    detail = client.get(f"/api/runs/{run.id}").json()
    assert [(a["attempt"], a["status"], a["error_step_text"], a["error_kind"])
            for a in detail["attempts"]] == [
        (1, "FAILED", "Start", "transient"), (2, "FAILED", "Reconstruct", "lost"),
        (3, "SUCCEEDED", None, None)]
    page = client.get(f"/runs/{run.id}").text
    panel = page.split('id="attempts-panel"', 1)[1].split("</section>", 1)[0]
    assert not panel.startswith(" hidden") and panel.count('<li class="attempt ') == 3
    assert "service unavailable" in panel and "the worker ended" in panel


def test_a_full_disk_is_retried_once_space_may_have_been_freed(settings: Settings) -> None:
    settings.agent.no_space_backoff_seconds = 100.0
    agent, backend, clock, run = one_scan_started(settings)
    run = transfer_failed(agent, backend, clock, run, "NO_SPACE_LEFT",
                          "/scratch/s1/raw/x.h5: No space left")
    assert (run.status, run.attempt) == (RunStatus.QUEUED, 2)
    (ended,) = agent.store.attempts(run)[:-1]
    assert ended.error_kind == ErrorKind.NO_SPACE
    assert ended.error.startswith("the cluster's disk is full: /scratch/s1/raw/x.h5")
    # Not after the short back-off of a network fault: after the full disk's.
    step(agent, clock, settings.agent.retry_backoff_seconds + 1)
    assert agent.store.require_run(run.id).status == RunStatus.QUEUED
    step(agent, clock, 100.0 - settings.agent.retry_backoff_seconds)
    assert agent.store.require_run(run.id).status == RunStatus.ACTIVE
    (event,) = [e for e in agent.store.events(run.id) if e.code == "RetryScheduled"]
    assert "in 100 s" in event.message


def test_an_attempt_cut_short_by_a_clean_stop_is_listed_and_uses_no_retry(
    settings: Settings,
) -> None:
    agent, backend, clock, run = one_scan_started(settings, ScriptedBackend(outlive=False))
    agent.stop()
    agent._shutdown()
    run = agent.store.require_run(run.id)
    (cut, now) = agent.store.attempts(run)
    assert (cut.attempt, cut.status, cut.error_kind) == (1, RunStatus.CANCELLED,
                                                         ErrorKind.CANCELLED)
    assert cut.error.startswith("interrupted: the agent stopped")
    assert (now.attempt, now.status) == (1, RunStatus.QUEUED)
