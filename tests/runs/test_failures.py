"""A failed flow run told cause first, in the user's paths, with the kind of fault that
decides a retry read from the error's type or code, never from its words."""

from __future__ import annotations

import json

import pytest

from beamflow.error_kinds import ErrorKind
from beamflow.runs.backend import FlowRunInfo
from beamflow.runs.failures import failure_of
from beamflow.runs.records import Run, RunStatus

WS = "/home/op/ws"
HPC_RUN = f"{WS}/hpc/bad-30c8fdf0"


def run_of(scan_path: str, compute_scan: str, collection_scan: str) -> Run:
    """A run as launch_run records it: the flow's input beside the user's scan path."""
    body = {"compute": {"scan_path": compute_scan},
            "beamline": {"raw_path": collection_scan}}  # fmt: skip
    return Run(id="r1", scan_name="bad", scan_path=scan_path, flow="ptycho_reconstruct",
               backend="local", status=RunStatus.FAILED, created_at=0, updated_at=0,
               result={"input": body})  # fmt: skip


def failed(step: str, error: str, details: dict | None, *, cause: str | None = None
           ) -> FlowRunInfo:
    """A FAILED run whose flow recorded the caught error at $.failure (both backends)."""
    text = cause if cause is not None else json.dumps({"status": "FAILED", "details": details})
    record = {"step": step, "description": f"the {step} step failed",
              "error": {"Error": error, "Cause": text}}  # fmt: skip
    return FlowRunInfo(backend_run_id="b1", status=RunStatus.FAILED,
                       output={"failure": record}, error=f"{step}Failed")  # fmt: skip


CXI_RUN = run_of(f"{WS}/beamline/detector/bad/bad.cxi", f"{HPC_RUN}/raw/bad.cxi",
                 "/detector/bad/bad.cxi")


def test_the_issue_example_reads_cause_first_in_the_users_path() -> None:
    message = (f"scan {HPC_RUN}/raw/bad.cxi: reconstruction failed: ScanFormatError: "
               f"{HPC_RUN}/raw/bad.cxi: /: not an HDF5 file (no HDF5 signature)")
    info = failed("Reconstruct", "ActionFailedException",
                  {"error": {"type": "ValueError", "message": message}})
    failure = failure_of(CXI_RUN, info)
    assert failure.message == (
        "beamline/detector/bad/bad.cxi is not an HDF5 file (no HDF5 signature)")
    assert (failure.step, failure.kind) == ("Reconstruct", ErrorKind.BAD_INPUT)
    # The chain keeps everything: the step's words, the class names, the cluster's path.
    assert "ActionFailedException" in failure.chain and "ScanFormatError" in failure.chain
    assert f"{HPC_RUN}/raw/bad.cxi" in failure.chain


def test_a_master_files_directory_maps_back_with_its_data_files() -> None:
    run = run_of(f"{WS}/beamline/detector/s1/s1_master.h5",
                 f"{HPC_RUN}/raw/s1/s1_master.h5", "/detector/s1")
    message = (f"scan {HPC_RUN}/raw/s1/s1_master.h5: reconstruction failed: ScanFormatError: "
               f"{HPC_RUN}/raw/s1/s1_data_000002.h5: /entry/data/data: frames hold NaN")
    failure = failure_of(run, failed("Reconstruct", "ActionFailedException", {
        "error": {"type": "ValueError", "message": message}}))
    assert failure.message == (
        "beamline/detector/s1/s1_data_000002.h5: /entry/data/data: frames hold NaN")


def test_a_cause_without_a_file_still_names_the_scan() -> None:
    message = f"scan {HPC_RUN}/raw/bad.cxi: reconstruction failed: FloatingPointError: diverged"
    failure = failure_of(CXI_RUN, failed("Reconstruct", "ActionFailedException", {
        "error": {"type": "RuntimeError", "message": message}}))
    assert failure.message == "beamline/detector/bad/bad.cxi: diverged"
    assert failure.kind == ErrorKind.FAILED  # good input, failed job: a retry fails again


@pytest.mark.parametrize(("error", "details", "kind", "message"), [
    ("ActionFailedException", {"error": {"type": "WorkerLost", "message": "the worker process "
                                         "running reconstruct ended (killed)"}},
     ErrorKind.LOST, "the worker process running reconstruct ended (killed)"),
    # the local compute provider's watch: a task no worker took, or that made no progress
    ("ActionFailedException", {"error": {"type": "TaskLost", "message": "no progress for 600 s: "
                                         "the task is lost"}},
     ErrorKind.LOST, "no progress for 600 s: the task is lost"),
    # Globus Compute's traceback text: the raised type on its last "Type: message" line.
    ("ActionFailedException", {"exception": "Traceback (most recent call last):\n  File "
                               "\"f\", line 2\nValueError: scan /x: invalid arguments: "
                               "iterations"}, ErrorKind.BAD_INPUT, "scan /x: invalid arguments: "
     "iterations"),
    ("ActionFailedException", {"fatal_error": {"code": "PERMISSION_DENIED",
                                               "description": f"no access to {HPC_RUN}/raw"}},
     ErrorKind.BAD_INPUT, f"no access to {HPC_RUN}/raw"),
    ("ActionFailedException", {"fatal_error": {"code": "CONNECTION_RESET",
                                               "description": "invalid reply, refused"}},
     ErrorKind.TRANSIENT, "invalid reply, refused"),
    # Globus Transfer's task document: the fault's code is its nice_status.
    ("ActionFailedException", {"task_id": "t", "status": "FAILED",
                               "nice_status": "PERMISSION_DENIED",
                               "description": "permission denied"},
     ErrorKind.BAD_INPUT, "permission denied"),
    ("ActionUnableToRun", {"code": "EndpointOffline", "description": "endpoint is offline"},
     ErrorKind.TRANSIENT, "endpoint is offline"),
    ("ActionUnableToRun", {"code": "BadRequest", "description": "tasks: invalid"},
     ErrorKind.BAD_INPUT, "tasks: invalid"),
])
def test_the_kind_comes_from_the_type_or_code_not_the_words(
    error: str, details: dict, kind: ErrorKind, message: str
) -> None:
    run = run_of(f"{WS}/beamline/detector/s1", f"{HPC_RUN}/raw/s1", "/detector/s1")
    failure = failure_of(run, failed("TransferScanToHPC", error, details))
    assert failure.kind == kind
    assert failure.message == message


def test_a_timeout_with_a_plain_cause_is_transient() -> None:
    info = failed("Reconstruct", "ActionTimeout", None, cause="waited 86400 s")
    failure = failure_of(CXI_RUN, info)
    assert (failure.kind, failure.message) == (ErrorKind.TRANSIENT, "waited 86400 s")


def test_without_a_failure_record_the_backends_kind_is_used() -> None:
    lost = FlowRunInfo(backend_run_id="b", status=RunStatus.FAILED, error_kind=ErrorKind.LOST,
                       error="RunLost: lost: the process running it ended (pid 7)")
    failure = failure_of(CXI_RUN, lost)
    assert failure.kind == ErrorKind.LOST
    assert failure.message == "lost: the process running it ended (pid 7)"
    unknown = FlowRunInfo(backend_run_id="b", status=RunStatus.FAILED, error="it broke")
    assert failure_of(CXI_RUN, unknown).kind == ErrorKind.FAILED
    cancelled = FlowRunInfo(backend_run_id="b", status=RunStatus.CANCELLED, error="canceled")
    assert failure_of(CXI_RUN, cancelled).kind == ErrorKind.CANCELLED


def test_a_tasks_own_traceback_gives_the_kind_when_the_status_has_no_summary() -> None:
    details = {"results": [{"task_id": "t1", "status": "FAILED", "exception": (
        "Traceback (most recent call last):\n  File \"x\", line 1\n"
        "parsl.executors.high_throughput.errors.WorkerLost: Task failure due to loss of "
        "worker 0 on host h")}]}
    failure = failure_of(CXI_RUN, failed("Reconstruct", "ActionFailedException", details))
    assert failure.kind == ErrorKind.LOST
    assert failure.message == "Task failure due to loss of worker 0 on host h"


def test_the_errors_of_bad_input_say_so_where_they_are_raised() -> None:
    """The reader, the checkpoint check and the job carry their kind, for the compute
    function to raise as bad input (ValueError) without naming their classes."""
    from beamflow.checkpoint.compat import IncompatibleCheckpoint
    from beamflow.formats.errors import ScanFormatError
    from beamflow.job.models import ReconstructError

    for error in (ScanFormatError("/d/s.cxi", "/", "not an HDF5 file"),
                  IncompatibleCheckpoint([]), ReconstructError("no positions")):
        assert error.kind == ErrorKind.BAD_INPUT
