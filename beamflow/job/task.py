"""The work of the reconstruct compute function (functions/reconstruct.py), as named steps:
check the request, confine its paths, pick the device, build the job, run it (with progress
for the run directory), report.

The function itself stays a thin, self-contained body (globus-compute ships it alone) that
imports this module on the endpoint, so the steps are ordinary, testable code here.
Errors raise ``ValueError`` (bad input: nothing to retry), ``RuntimeError`` (the
reconstruction failed) or ``OSError`` with ``errno.ENOSPC``/``EDQUOT`` (the cluster's disk or
quota is full: which, and how much the run writes there), all built-ins so they deserialise
anywhere, with the scan or the disk and the cause in the message.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from beamflow.atomic import atomic_write_json
from beamflow.disk import bytes_text, free_space, no_space_error
from beamflow.error_kinds import ErrorKind
from beamflow.job.models import ProgressCallback, ReconstructJob, RunParameters
from beamflow.validation_text import validation_text

__all__ = ["TaskRequest", "run_task"]


class TaskRequest(BaseModel):
    """The function's keyword arguments, as the flow passes them."""

    model_config = ConfigDict(extra="forbid")

    scan_path: str = Field(min_length=1)
    output_dir: str = Field(min_length=1)
    allowed_roots: list[str] = Field(min_length=1, max_length=16)
    parameters: RunParameters = Field(default_factory=RunParameters)
    checkpoint_dir: str | None = None
    node_local_dir: str | None = None
    run_name: str | None = Field(default=None, max_length=200)


class _Paths(BaseModel):
    scan: Path
    out: Path
    checkpoints: Path
    node_local: Path | None


def run_task(**kwargs: Any) -> dict[str, Any]:
    """Reconstruct ``kwargs["scan_path"]`` into its ``output_dir`` (product.h5, previews/); return
    the summary the flow carries back."""
    scan = kwargs.get("scan_path")
    label = scan if isinstance(scan, str) else repr(scan)
    request = _checked_request(kwargs, label)
    paths = _confined_paths(request, label)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    device = _pinned_device(request.parameters.device, visible, label)
    job = _built_job(request.parameters, paths, device, label)
    # The flow's results transfer copies previews/ recursively: it must exist (empty when no
    # preview could be drawn) or the whole run would fail at its last step.
    (paths.out / "previews").mkdir(parents=True, exist_ok=True)
    started = time.time()
    summary = _ran(job, label)
    return _report(request, paths, device, visible, summary, time.time() - started)


def _checked_request(kwargs: dict[str, Any], label: str) -> TaskRequest:
    try:
        return TaskRequest(**{**kwargs, "parameters": kwargs.get("parameters") or {}})
    except ValidationError as exc:
        raise ValueError(f"scan {label}: invalid arguments: {validation_text(exc)}") from None


def _confined_paths(request: TaskRequest, label: str) -> _Paths:
    """Every path inside an allowed root, after resolving symlinks and ``..``."""
    roots: list[Path] = []
    for raw in request.allowed_roots:
        root = Path(raw).expanduser()
        if not root.is_absolute():
            raise ValueError(f"scan {label}: allowed root {raw!r} must be an absolute path")
        if not root.is_dir():
            raise ValueError(f"scan {label}: allowed root {raw} is not a directory")
        roots.append(root.resolve())

    def confined(raw: str, what: str, *, must_exist: bool) -> Path:
        path = Path(raw).expanduser()
        if not path.is_absolute():
            raise ValueError(f"scan {label}: {what} {raw!r} must be an absolute path")
        resolved = path.resolve(strict=False)
        if not any(resolved == r or resolved.is_relative_to(r) for r in roots):
            raise ValueError(
                f"scan {label}: {what} {raw} resolves to {resolved}, outside the allowed "
                f"roots ({', '.join(map(str, roots))}); refused"
            )
        if must_exist and not resolved.exists():
            raise ValueError(f"scan {label}: {what} {raw} does not exist")
        return resolved

    out = confined(request.output_dir, "output_dir", must_exist=False)
    return _Paths(
        scan=confined(request.scan_path, "scan_path", must_exist=True),
        out=out,
        checkpoints=confined(request.checkpoint_dir or str(out / "checkpoints"),
                             "checkpoint_dir", must_exist=False),
        node_local=confined(request.node_local_dir, "node_local_dir", must_exist=False)
        if request.node_local_dir else None,
    )


def _pinned_device(asked: str, visible: str | None, label: str) -> str:
    """The device asked for, within the endpoint's pinning (never widened)."""
    no_gpu = visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles")
    if not no_gpu:
        return asked
    if asked == "cuda":
        raise ValueError(
            f"scan {label}: device 'cuda' asked for, but this worker has no GPU "
            f"(CUDA_VISIBLE_DEVICES={visible!r})"
        )
    return "cpu"


def _built_job(params: RunParameters, paths: _Paths, device: str, label: str) -> ReconstructJob:
    try:
        # Every run parameter is a job field of the same name (the engine's settings and
        # aborted as the job's shorthands); the device is the one decided above.
        return ReconstructJob(scan=paths.scan, out=paths.out, checkpoint_dir=paths.checkpoints,
                              node_local_dir=paths.node_local,
                              **params.model_dump(exclude={"device"}), device=device)
    except (ValidationError, TypeError, ValueError) as exc:
        raise ValueError(f"scan {label}: invalid reconstruction job: {exc}") from None


def _progress_writer(out: Path) -> ProgressCallback:
    """Progress for whoever watches the run directory (the local backend shows it as the
    iteration count); written atomically, at most about once a second."""
    progress_file = out / "progress.json"
    last_write = [0.0]

    def progress(iteration: int, stop_iteration: int, loss: float | None) -> None:
        now = time.time()
        if now - last_write[0] < 1.0 and iteration < stop_iteration:
            return
        last_write[0] = now
        # "iterations_total" is the file's name for the iteration to stop at (the run store's)
        record = {"iteration": iteration, "iterations_total": stop_iteration, "loss": loss,
                  "time": now}
        with contextlib.suppress(OSError):  # a courtesy; the reconstruction goes on
            atomic_write_json(progress_file, record, durable=False)

    return progress


def _ran(job: ReconstructJob, label: str) -> dict[str, Any]:
    """The job's summary (JSON); its failure as bad input or a failed reconstruction."""
    import beamflow.job.run  # at call time: tests replace its run_reconstruction

    try:
        summary = beamflow.job.run.run_reconstruction(job, _progress_writer(job.out))
        return summary.model_dump(mode="json")
    except Exception as exc:
        full = no_space_error(exc)
        if full is not None:  # the cluster's disk, not the scan: say which, and how much
            raise OSError(full.errno, _disk_full(job, full)) from None
        # Bad data is the user's to fix (the error says so by its kind); everything else is
        # a failed reconstruction.
        bad_input = getattr(exc, "kind", None) == ErrorKind.BAD_INPUT
        error = ValueError if bad_input else RuntimeError
        raise error(f"scan {label}: reconstruction failed: {type(exc).__name__}: {exc}") from None


def _disk_full(job: ReconstructJob, error: OSError) -> str:
    """Which disk filled (a path on it, as this machine names it), how full it is, and how
    much the run writes there."""
    import beamflow.job.run

    where = Path(error.filename) if error.filename else job.out
    text = f"the cluster's disk is full: no space left writing {where}"
    measured = free_space(where)
    if measured is not None:
        text += f" ({bytes_text(measured[1])} free of {bytes_text(measured[2])})"
    try:
        needed = beamflow.job.run.written_bytes_estimate(job)
    except Exception:  # noqa: BLE001 - the estimate is a courtesy; the disk is the news
        return text
    return (f"{text}; this run writes about {bytes_text(needed)} there: its product and "
            f"{job.checkpoint_keep} checkpoints, in {job.out} and {job.l2_dir}")


def _report(request: TaskRequest, paths: _Paths, device: str, visible: str | None,
            data: dict[str, Any], elapsed: float) -> dict[str, Any]:
    out = paths.out
    product = Path(str(data.get("product") or out / "product.h5"))
    previews = [Path(str(p)) for p in data.get("previews") or []]

    def relative(p: Path) -> str:
        return str(p.relative_to(out)) if p.is_relative_to(out) else p.name

    return {
        "scan_path": str(paths.scan),
        "run_name": request.run_name,
        "algorithm": data.get("algorithm"),  # the one that ran (auto resolved)
        "iterations": data.get("iterations"),
        "iterations_this_run": data.get("iterations_this_run"),
        "n_frames": data.get("n_frames"),
        "seconds_per_iteration": data.get("seconds_per_iteration"),
        "seconds_total": round(elapsed, 3),
        "final_loss": data.get("final_loss"),
        "resumed_from_iteration": data.get("resumed_from_iteration"),
        "device": data.get("device", device),
        "visible_devices": visible,
        "host": socket.gethostname(),
        "output_dir": str(out),
        "checkpoint_dir": str(paths.checkpoints),
        "product": str(product),
        "previews": [str(p) for p in previews],
        "product_relative": relative(product),
        "previews_relative": [relative(p) for p in previews],
        "propagation": data.get("propagation"),
        "focus_distance_m": data.get("focus_distance_m"),
        "verdict": data.get("verdict"),
        "verdict_reasons": data.get("verdict_reasons") or [],
        "notes": data.get("notes") or [],
        "parameters": data.get("parameters") or {},
    }
