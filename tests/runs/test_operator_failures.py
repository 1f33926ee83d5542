"""Failures an operator can act on: a full disk named as the disk that filled (the cluster's
path, not the user's scan), with how much the run needs there, under a kind of its own that
the agent retries after a longer wait; every attempt of a run retried in its own record kept,
with its start, end, error and kind; garbage frames found at readiness, naming the frame."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401 - the bitshuffle filter of the simulated data files
import numpy as np
import pytest

from beamflow.disk import bytes_text, free_space
from beamflow.error_kinds import ErrorKind
from beamflow.runs.backend import FlowRunInfo
from beamflow.runs.failures import failure_of
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store

WS = "/home/op/ws"
HPC = "/scratch/beamflow"
KEY = "s1-30c8fdf0"


def flow_run(scan_bytes: int | None = 536_000) -> Run:
    """A run of s1 as launch_run records it: the flow's input and what the scan takes."""
    body = {"compute": {"scan_path": f"{HPC}/{KEY}/raw/s1/s1_master.h5"},
            "beamline": {"raw_path": "/detector/s1"}}  # fmt: skip
    result = {"input": body, **({"scan_bytes": scan_bytes} if scan_bytes else {})}
    return Run(id="r1", scan_name="s1", scan_path=f"{WS}/beamline/detector/s1/s1_master.h5",
               flow="ptycho_reconstruct", backend="local", status=RunStatus.FAILED,
               created_at=0, updated_at=0, result=result)  # fmt: skip


def failed(step: str, details: dict) -> FlowRunInfo:
    cause = json.dumps({"status": "FAILED", "details": details})
    record = {"step": step, "description": f"the {step} step failed",
              "error": {"Error": "ActionFailedException", "Cause": cause}}
    return FlowRunInfo(backend_run_id="b1", status=RunStatus.FAILED,
                       output={"failure": record}, error=f"{step}Failed")


# -- a full disk, told -------------------------------------------------------------------------
@pytest.mark.parametrize("code", ["NO_SPACE_LEFT", "QUOTA_EXCEEDED"])
def test_a_full_scratch_disk_during_the_scan_transfer_names_the_clusters_path(code: str) -> None:
    written = f"{HPC}/{KEY}/raw/s1/s1_data_000001.h5"
    failure = failure_of(flow_run(), failed("TransferScanToHPC", {"fatal_error": {
        "code": code, "description": f"{written}: No space left on device"}}))
    assert failure.kind == ErrorKind.NO_SPACE and failure.step == "TransferScanToHPC"
    # The cluster's disk and path (never the beamline's copy of the scan), and the need.
    assert failure.message == (f"the cluster's disk is full: {written}: No space left on "
                               "device; the scan needs 536 KB there")
    assert "beamline/detector" not in failure.message


def test_a_full_beamline_disk_on_the_way_back_is_named_as_the_beamlines() -> None:
    failure = failure_of(flow_run(), failed("TransferResultsToBeamline", {"fatal_error": {
        "code": "NO_SPACE_LEFT", "description": f"{WS}/beamline/previews/x/product.h5: No "
        "space left on device"}}))
    assert failure.kind == ErrorKind.NO_SPACE
    assert failure.message.startswith("the beamline's disk is full: ")
    assert "the scan needs" not in failure.message


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT])
@pytest.mark.parametrize("how", ["error", "traceback"])
def test_a_reconstruction_that_fills_the_disk_is_a_full_disk_not_a_bad_scan(
    number: int, how: str
) -> None:
    said = (f"the cluster's disk is full: no space left writing {HPC}/{KEY}/runs/s1-r1 "
            "(20 KB free of 1 GB); this run writes about 2.9 MB there")
    message = str(OSError(number, said))
    details = ({"error": {"type": "OSError", "message": message}} if how == "error" else
               {"exception": f"Traceback (most recent call last):\n  ...\nOSError: {message}"})
    failure = failure_of(flow_run(), failed("Reconstruct", details))
    assert (failure.kind, failure.step) == (ErrorKind.NO_SPACE, "Reconstruct")
    assert failure.message == said  # said once, no errno, no class name
    # Any other OSError is still a failed reconstruction.
    other = str(OSError(errno.EIO, "Input/output error"))
    plain = failure_of(flow_run(), failed("Reconstruct", {
        "error": {"type": "OSError", "message": other}}))
    assert plain.kind == ErrorKind.FAILED


def test_the_compute_function_says_which_disk_filled_and_what_the_run_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import beamflow.job.run
    from beamflow.job.models import ReconstructJob
    from beamflow.job.task import run_task
    from beamflow.simulate import simulate_scan

    scratch = tmp_path / "scratch"
    master = simulate_scan(scratch / "raw", "s1", positions=24, probe_size=16, photons=1e4,
                           frames_per_file=12)
    out = scratch / "runs" / "s1-r1"

    def fills_the_disk(job, progress=None):  # noqa: ANN001, ANN202
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(out / "product.h5"))
        except OSError as exc:  # as h5py reports it: wrapped
            raise RuntimeError("cannot write the product") from exc

    monkeypatch.setattr(beamflow.job.run, "run_reconstruction", fills_the_disk)
    with pytest.raises(OSError) as raised:
        run_task(scan_path=str(master), output_dir=str(out), allowed_roots=[str(scratch)],
                 checkpoint_dir=str(scratch / "checkpoints"), parameters={"device": "cpu"})
    assert raised.value.errno == errno.ENOSPC
    text = raised.value.strerror
    _, free, total = free_space(out)
    assert text.startswith(f"the cluster's disk is full: no space left writing "
                           f"{out / 'product.h5'} (")
    assert f" free of {bytes_text(total)})" in text
    assert "; this run writes about " in text and f"in {out} and {scratch / 'checkpoints'}" in text
    assert str(master) not in text  # the scan is not the culprit
    job = ReconstructJob(scan=master, out=out, checkpoint_dir=scratch / "checkpoints")
    needed = beamflow.job.run.written_bytes_estimate(job)  # as the function's job
    assert f"about {bytes_text(needed)} there" in text
    assert 100_000 < needed < 20_000_000  # a few states of a 16-px scan, and the previews


def test_the_local_transfer_names_the_destination_file_and_the_room_left(tmp_path: Path) -> None:
    from beamflow.local.transfer_plan import PARTIAL_MARK, os_fault

    final = tmp_path / "raw" / "s1_data_000001.h5"
    final.parent.mkdir()
    hidden = final.with_name(f".{final.name}{PARTIAL_MARK}0123abcd")
    fault = os_fault(OSError(errno.ENOSPC, "No space left on device"), hidden)
    assert fault.code == "NO_SPACE_LEFT"
    _, free, total = free_space(final)
    assert fault.description.startswith(f"{final}: No space left on device (")
    assert fault.description.endswith(f" free of {bytes_text(total)})")
    assert PARTIAL_MARK not in fault.description


def test_bytes_are_told_in_decimal_units() -> None:
    assert [bytes_text(n) for n in (0, 999, 1000, 536_000, 2_870_000, 1.5e9, 3e15)] == [
        "0 B", "999 B", "1 KB", "536 KB", "2.87 MB", "1.5 GB", "3e+03 TB"]


# -- attempts ----------------------------------------------------------------------------------
def test_a_requeued_run_keeps_each_attempt_as_it_ended(tmp_path: Path) -> None:
    store = Store(tmp_path / "runs.sqlite")
    run = store.create_run(scan_name="s1", scan_path="/d/s1/s1_master.h5",
                           flow="ptycho_reconstruct", backend="local")
    run = store.update_run(run.id, status=RunStatus.ACTIVE, backend_run_id="b1")
    run = store.update_run(run.id, status=RunStatus.FAILED, error="the worker ended",
                           error_step="Reconstruct", error_kind=ErrorKind.LOST)
    first_end = run.finished_at
    again = store.requeue(run.id)
    assert (again.status, again.attempt, again.error, again.backend_run_id) == (
        RunStatus.QUEUED, 2, None, None)
    again = store.update_run(again.id, status=RunStatus.ACTIVE, backend_run_id="b2")
    stopped = store.requeue(again.id, status=RunStatus.CANCELLED, next_attempt=False,
                            error="interrupted", error_kind=ErrorKind.CANCELLED)
    assert stopped.attempt == 2  # an interruption uses no retry
    attempts = store.attempts(stopped)
    assert [(a.attempt, a.status, a.backend_run_id, a.error_step, a.error_kind, a.error)
            for a in attempts] == [
        (1, RunStatus.FAILED, "b1", "Reconstruct", ErrorKind.LOST, "the worker ended"),
        (2, RunStatus.CANCELLED, "b2", None, ErrorKind.CANCELLED, "interrupted"),
        (2, RunStatus.QUEUED, None, None, None, None),  # the run as it stands
    ]
    assert attempts[0].started_at == run.started_at and attempts[0].finished_at == first_end
    assert attempts[1].started_at is not None and attempts[1].finished_at is not None
    assert len(store.list_runs()) == 1


def test_a_store_of_schema_2_gains_the_attempts(tmp_path: Path) -> None:
    import sqlite3

    from beamflow.runs.schema import MIGRATIONS, SCHEMA_VERSION

    path = tmp_path / "runs.sqlite"
    conn = sqlite3.connect(path)
    for number in (0, 1):
        conn.executescript(MIGRATIONS[number])
    conn.execute("PRAGMA user_version = 2")
    conn.execute("INSERT INTO runs (id, scan_name, scan_path, flow, backend, status, "
                 "created_at, updated_at, attempt) VALUES ('r1', 's1', '/d/s1', 'f', 'local', "
                 "'FAILED', 1, 1, 3)")
    conn.commit()
    conn.close()
    store = Store(path)
    run = store.require_run("r1")
    assert [a.attempt for a in store.attempts(run)] == [3]  # earlier ones were not kept then
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


# -- garbage frames at readiness ---------------------------------------------------------------
def test_a_nan_in_the_last_frame_of_a_data_file_is_found_at_readiness(tmp_path: Path) -> None:
    from beamflow.formats.eiger import DATA_KEY, data_file_name
    from beamflow.simulate import simulate_scan
    from edge_agent.scans import SAMPLE_FRAMES, Readiness, assess

    master = simulate_scan(tmp_path, "s1", positions=200, probe_size=16, photons=1e4,
                           frames_per_file=20)
    spread = set(np.linspace(0, 199, SAMPLE_FRAMES).round().astype(int).tolist())
    assert 39 not in spread  # the frame below is one the sample alone would miss
    data = master.parent / data_file_name("s1", 2)  # frames 21..40 of the scan
    with h5py.File(data, "r") as f:
        frames = f[DATA_KEY][...].astype(np.float32)
        attrs = dict(f[DATA_KEY].attrs)
    frames[-1, 3, 5] = np.inf  # float frames, as a processing detector writes them
    with h5py.File(data, "w") as f:
        f.create_dataset(DATA_KEY, data=frames).attrs.update(attrs)
    state = assess(master, quiet_seconds=0.0, stall_timeout=60.0)
    assert state.readiness == Readiness.BROKEN
    assert state.error.startswith(f"{data}: {DATA_KEY}: frame 20 of 20 in this file (image 40 "
                                  "of the scan, counted from 1): a NaN or infinite value on a "
                                  "valid detector pixel")
