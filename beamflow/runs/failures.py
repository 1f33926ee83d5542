"""A failed flow run, told for the person who gave the scan: the cause first, in the words
of the user's own files, and the kind of fault that decides whether a retry helps.

Our flows catch every action failure and record it at ``$.failure`` (``step``,
``description``, ``error``: the caught ``{"Error", "Cause"}``, whose Cause is usually the
action's status document, the same on both backends: a compute task's ``details.error`` /
``details.exception``, a transfer's ``details.fatal_error``). From that one record come:

- the kind (:class:`ErrorKind`), from the error's name, the compute exception's type and the
  transfer fault's code, never from the wording of a message;
- the message: the innermost cause with the exception class names and the wrappers around
  it taken off, and the cluster's copies of the scan named by their beamline paths
  (``beamline/detector/bad/bad.cxi is not an HDF5 file (no HDF5 signature)``);
- the chain: everything as the backend told it, kept in the run's result and its events.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel

from beamflow.disk import NO_SPACE_ERRNOS, bytes_text
from beamflow.error_kinds import ErrorKind
from beamflow.runs.backend import FlowRunInfo
from beamflow.runs.records import Run

# Compute exceptions by type. functions/reconstruct.py raises ValueError for bad input and
# RuntimeError for a reconstruction that failed on good input (built-ins: they deserialise
# anywhere); the engine says WorkerLost when the worker running a task died, and the local
# compute provider TaskLost when no worker took a task, or its worker made no progress, in time.
_COMPUTE_KINDS: dict[str, ErrorKind] = {
    "ValueError": ErrorKind.BAD_INPUT,
    "ValidationError": ErrorKind.BAD_INPUT,
    "ScanFormatError": ErrorKind.BAD_INPUT,
    "ReconstructError": ErrorKind.BAD_INPUT,
    "IncompatibleCheckpoint": ErrorKind.BAD_INPUT,
    "WorkerLost": ErrorKind.LOST,
    "ManagerLost": ErrorKind.LOST,
    "TaskLost": ErrorKind.LOST,
    "Canceled": ErrorKind.CANCELLED,
    "TaskCancelled": ErrorKind.CANCELLED,
    "CancelledError": ErrorKind.CANCELLED,
    "EngineError": ErrorKind.TRANSIENT,
    "TimeoutError": ErrorKind.TRANSIENT,
    "ConnectionError": ErrorKind.TRANSIENT,
}
# Transfer faults of the user's files that another attempt would meet again; every other
# fault is retried, as Globus Transfer retries its own (a file renamed by the detector's
# writer, a network fault, something in the way); a full disk (or quota) is a kind of its
# own: retried after a longer wait, once someone may have freed space.
_TRANSFER_BAD_INPUT = {"PERMISSION_DENIED"}
_TRANSFER_NO_SPACE = {"NO_SPACE_LEFT", "QUOTA_EXCEEDED"}
# An OSError's number, as str(OSError) writes it: "[Errno 28] No space left on device".
_ERRNO = re.compile(r"^\[Errno (\d+)\] ")
# Which disk filled, by the step that wrote to it (our flows' step names).
_DISK_OF_STEP = {"TransferResultsToBeamline": "the beamline's disk"}
_CLUSTER_DISK = "the cluster's disk"
# A provider refusing the action's request (not an endpoint that could not take it).
_REFUSED_REQUEST = {"BadRequest", "UnprocessableEntity", "InvalidRequest", "ValidationError"}

# ``Name: `` of an exception class, at the start of a text or after another ``: ``.
_CLASS_NAME = re.compile(r"(?:^|(?<=: ))(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|"
                         r"Exit|Lost|Timeout|Interrupt|Refused|Failed|Cancelled|Warning): ")


class Failure(BaseModel):
    """How a run failed: in which step, of what kind, why (cause first), and the chain."""

    step: str | None
    kind: ErrorKind
    message: str
    chain: str


def failure_of(run: Run, info: FlowRunInfo) -> Failure:
    """The failure of a FAILED (or CANCELLED) flow run of ``run``."""
    if info.status.value == "CANCELLED":
        text = info.error or "cancelled"
        return Failure(step=info.error_step, kind=ErrorKind.CANCELLED, message=text, chain=text)
    record = info.output.get("failure") if isinstance(info.output, dict) else None
    if isinstance(record, dict) and record.get("step"):
        error = record.get("error") if isinstance(record.get("error"), dict) else {}
        name = str(error.get("Error") or "Error")
        cause = _document(error.get("Cause"))
        kind, innermost = _kind_and_cause(name, cause)
        head = str(record.get("description") or "failed")
        chain = f"{head}: {name}: {_chain_text(cause)}"
        step = str(record["step"])
        message = (disk_full_words(innermost, step, run) if kind == ErrorKind.NO_SPACE
                   else user_words(innermost, run))
        return Failure(step=step, kind=kind, message=message, chain=chain[:4000])
    step = info.error_step
    if step is None:
        failed = [s.name for s in info.steps if s.status in ("FAILED", "CANCELLED")]
        step = failed[-1] if failed else None
    text = info.error or "failed (no reason given by the backend)"
    return Failure(step=step, kind=info.error_kind or ErrorKind.FAILED,
                   message=user_words(text, run), chain=text)  # fmt: skip


def _document(cause: Any) -> Any:
    """The Cause as the action's status document where it is one (often JSON text)."""
    if isinstance(cause, str):
        try:
            return json.loads(cause)
        except json.JSONDecodeError:
            return cause
    return cause


def _kind_and_cause(name: str, cause: Any) -> tuple[ErrorKind, str]:
    """The kind of a caught action error (its name and the action's status document) and
    its innermost cause, as text."""
    if not isinstance(cause, dict):
        text = "" if cause is None else str(cause)
        return _kind_of_name(name, None), text or name
    details = cause.get("details") if isinstance(cause.get("details"), dict) else cause
    error = details.get("error")
    if isinstance(error, dict) and error.get("type"):  # a compute task's exception
        message = str(error.get("message") or error["type"])
        return _compute_kind(str(error["type"]), message), message
    exception = details.get("exception")
    tasks = details.get("results") if isinstance(details.get("results"), list) else []
    for task in tasks:  # a task's own exception, where the action status has no summary
        if not exception and isinstance(task, dict) and isinstance(task.get("exception"), str):
            exception = task["exception"]
    if isinstance(exception, str) and exception:  # the service's traceback: "Type: message"
        raised = list(re.finditer(r"^([A-Za-z_][\w.]*): ", exception, flags=re.MULTILINE))
        if not raised:
            return ErrorKind.FAILED, exception.strip()
        kind_name = raised[-1].group(1).rpartition(".")[2]
        message = exception[raised[-1].end():].strip()
        return _compute_kind(kind_name, message), message or kind_name
    fatal = details.get("fatal_error")
    if not isinstance(fatal, dict) and details.get("nice_status"):  # a Transfer task document
        fatal = {"code": details["nice_status"], "description": details.get("description")}
    if isinstance(fatal, dict):  # a transfer's fault
        code = str(fatal.get("code") or "")
        kind = (ErrorKind.BAD_INPUT if code in _TRANSFER_BAD_INPUT
                else ErrorKind.NO_SPACE if code in _TRANSFER_NO_SPACE
                else ErrorKind.CANCELLED if code == "CANCELED" else ErrorKind.TRANSIENT)
        return kind, str(fatal.get("description") or code)
    code = str(details.get("code") or "")
    text = str(details.get("description") or cause.get("display_status") or name)
    return _kind_of_name(name, code), text


def _compute_kind(type_name: str, message: str) -> ErrorKind:
    """The kind of a compute task's exception, by its type; an OSError by its number (a
    full disk or quota: the kind of its own)."""
    number = _ERRNO.match(message.strip())
    if type_name == "OSError" and number and int(number.group(1)) in NO_SPACE_ERRNOS:
        return ErrorKind.NO_SPACE
    return _COMPUTE_KINDS.get(type_name, ErrorKind.FAILED)


def _kind_of_name(name: str, code: str | None) -> ErrorKind:
    if name == "RunLost":
        return ErrorKind.LOST
    if name == "ActionUnableToRun":
        return ErrorKind.BAD_INPUT if code in _REFUSED_REQUEST else ErrorKind.TRANSIENT
    if name in ("ActionTimeout", "ActionFailedException"):
        return ErrorKind.TRANSIENT
    return ErrorKind.FAILED


def _chain_text(cause: Any) -> str:
    if isinstance(cause, dict):
        details = cause.get("details") if isinstance(cause.get("details"), dict) else cause
        error = details.get("error")
        if isinstance(error, dict) and error.get("message"):
            return f"{error.get('type', 'Error')}: {error['message']}"
        fatal = details.get("fatal_error")
        if isinstance(fatal, dict):
            return f"{fatal.get('code')}: {fatal.get('description')}"
        for key in ("exception", "description", "display_status"):
            if details.get(key):
                return str(details[key])
        return json.dumps(cause, default=str)[:1500]
    return "" if cause is None else str(cause)


def disk_full_words(text: str, step: str | None, run: Run) -> str:
    """A full disk, told for the operator who can free it: which disk (as the machine that
    filled it names it: a cluster path stays a cluster path, never the user's scan) and,
    for the scan's transfer, how much the scan needs there."""
    names = list(_CLASS_NAME.finditer(text))
    text = _ERRNO.sub("", text[names[-1].end():] if names else text.strip())
    disk = _DISK_OF_STEP.get(step or "", _CLUSTER_DISK)
    if not text.startswith(f"{disk} is full"):
        text = f"{disk} is full: {text}"
    needed = run.result.get("scan_bytes")
    if step == "TransferScanToHPC" and isinstance(needed, int):
        text += f"; the scan needs {bytes_text(needed)} there"
    return text[:2000]


def user_words(text: str, run: Run) -> str:
    """A cause as the person who gave the scan reads it: the innermost message (what
    follows the last exception class name), still naming the scan where the compute
    function's ``scan X:`` wrapper did, with the cluster's copies named by their beamline
    paths, and a reader's ``<file>: /: not ...`` as ``<file> is not ...``."""
    text = text.strip()
    wrapper = re.match(r"scan (\S+): ", text)
    names = list(_CLASS_NAME.finditer(text))
    if names:
        text = text[names[-1].end():]
        if wrapper and not re.search(r"(?:^|\s)/\S", text):  # the cause names no file
            text = f"{wrapper.group(1)}: {text}"
    for cluster, beamline in _path_map(run):
        text = text.replace(cluster, beamline)
    match = re.fullmatch(r"(\S+): /: (.+)", text, flags=re.DOTALL)
    if match:
        file, problem = match.groups()
        text = f"{file} is {problem}" if problem.startswith("not ") else f"{file}: {problem}"
    return text[:2000]


def _path_map(run: Run) -> list[tuple[str, str]]:
    """(cluster path, beamline path) pairs for the paths a flow run's function and
    transfers see, longest first; the beamline path named from its collection's root
    directory (``beamline/detector/s1/s1_master.h5``)."""
    body = run.result.get("input")
    if not isinstance(body, dict):
        return []
    compute = body.get("compute") if isinstance(body.get("compute"), dict) else {}
    beamline = body.get("beamline") if isinstance(body.get("beamline"), dict) else {}
    hpc_scan, raw_path = compute.get("scan_path"), beamline.get("raw_path")
    if not isinstance(hpc_scan, str) or not isinstance(raw_path, str):
        return []  # one file system (ptycho_shared_fs): the paths are the beamline's
    user_scan = PurePosixPath(run.scan_path)
    # raw_path is what was moved, in the collection: the scan file, or the master's directory.
    moved_rel = PurePosixPath(raw_path.lstrip("/"))
    moved = user_scan if user_scan.name == moved_rel.name else user_scan.parent
    root = PurePosixPath(*moved.parts[: len(moved.parts) - len(moved_rel.parts)])
    shown = PurePosixPath(root.name) / moved_rel
    hpc = PurePosixPath(hpc_scan)
    hpc_moved = hpc.parent if hpc.name == user_scan.name and moved != user_scan else hpc
    pairs = [(str(hpc_moved), str(shown))]
    if hpc_moved != hpc:
        pairs.insert(0, (str(hpc), str(shown / user_scan.name)))
    return pairs
