"""The life of a run: how a scan becomes a flow run and how the run store follows it.

The CLI (``beamflow runs start|retry|cancel``), the edge agent and the status page's retry
button all go through these functions, on either backend, so a run is recorded, started,
followed and reported the same way wherever it came from.

    request = RunRequest(scan_path=..., params={...}, dedupe_key=...)
    run = create_scan_run(settings, store, request)       # QUEUED
    run = record_refused_run(settings, store, request, refusal)   # FAILED: what it refused
    run = launch_run(settings, store, backend, run)       # ACTIVE, with backend_run_id
    run = sync_run(store, backend, run)                   # status, steps, error, previews
    run = start_scan_run(settings, store, backend, request)   # create + launch
    run = follow_run(store, backend, run)                 # sync until it ends
    run = retry_run(settings, run_id, backend=backend)    # the one new attempt of a failed run
    run = cancel_run(settings, run_id, backend=backend)

The backend is always the caller's (:mod:`beamflow.run_backends` opens the one the
configuration names), so this package imports neither backend.

What a run is asked is :mod:`beamflow.runs.request`; the flow's input it is started with,
:mod:`beamflow.runs.flow_input`; what the function answered, :mod:`beamflow.runs.compute_output`;
how it failed, :mod:`beamflow.runs.failures`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from beamflow.config import Settings
from beamflow.disk import tree_bytes
from beamflow.error_kinds import ErrorKind
from beamflow.job.models import FunctionSummary
from beamflow.runs.backend import RunBackend, RunBackendError, StepInfo
from beamflow.runs.compute_output import success_fields, summary_fields
from beamflow.runs.failures import failure_of
from beamflow.runs.flow_input import flow_input_for, transferred
from beamflow.runs.naming import run_name_for, safe_name, scan_name
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.request import (
    FLOWS,
    SHARED_FS_FLOW,
    RunInputError,
    RunRequest,
    reconstruction_params,
    scan_location,
)
from beamflow.runs.store import DuplicateRun, Store, StoreError
from beamflow.validation_text import validation_text


class RetryRefused(RunInputError):
    """A run cannot be retried; ``retry_id`` is the run that retries it already, if any."""

    def __init__(self, message: str, retry_id: str | None = None) -> None:
        super().__init__(message)
        self.retry_id = retry_id


# -- creating and starting runs ----------------------------------------------------------------
def create_scan_run(settings: Settings, store: Store, request: RunRequest) -> Run:
    """Record a QUEUED run of the scan (raises DuplicateRun for a taken ``dedupe_key``,
    :class:`RunInputError` for a bad scan path or parameters)."""
    if request.flow not in FLOWS:
        raise RunInputError(f"unknown flow {request.flow!r} (known: {', '.join(FLOWS)})")
    scan = scan_location(settings, request.scan_path)
    merged = reconstruction_params(settings, request.params)
    return store.create_run(
        scan_name=scan_name(scan),
        scan_path=str(scan),
        flow=request.flow,
        backend=settings.backend,
        parameters=merged,
        dedupe_key=request.dedupe_key,
        label=request.label,
        fraction=request.fraction,
        iterations_total=merged["iterations"],
    )


def record_refused_run(
    settings: Settings, store: Store, request: RunRequest, refusal: RunInputError
) -> Run | None:
    """Record the run :func:`create_scan_run` refused (``refusal``: the scan's file is not
    there or not one, the parameters are invalid) as FAILED in its Queue step, of kind
    bad_input, once under the request's ``dedupe_key``: the scan is seen with the reason
    instead of being asked again at every look. None when the scan is gone (nothing to
    record) or its key has a run already."""
    scan = Path(request.scan_path)
    if not scan.exists():
        return None
    try:
        run = store.create_run(
            scan_name=scan_name(scan), scan_path=str(scan.resolve()), flow=request.flow,
            backend=settings.backend, parameters=request.params, dedupe_key=request.dedupe_key,
            label=request.label, fraction=request.fraction,
        )  # fmt: skip
    except DuplicateRun:
        return None
    return store.update_run(run.id, status=RunStatus.FAILED, error=str(refusal),
                            error_step="Queue", error_kind=ErrorKind.BAD_INPUT)  # fmt: skip


def launch_run(settings: Settings, store: Store, backend: RunBackend, run: Run) -> Run:
    """Start a QUEUED run on the backend; the run becomes ACTIVE with its backend run id.

    Raises :class:`RunBackendError` (``transient`` when worth a retry) and leaves the run as it
    was: the caller decides between failing it and trying again."""
    if run.status != RunStatus.QUEUED:
        raise RunBackendError(f"run {run.id} is {run.status.value}, not QUEUED", step="Start")
    run_name = run_name_for(run)
    try:
        body = flow_input_for(settings, run.scan_path, run.parameters, run_name, flow=run.flow,
                              fraction=run.fraction)
    except RunInputError as exc:  # often the configuration: fixed, a retry goes through
        raise RunBackendError(str(exc), step="Start") from None
    label = (run.label or f"beamflow {run.scan_name} {run_name}")[:128]
    tags = ["beamflow", safe_name(run.scan_name, 100)]
    backend_run_id = backend.start_run(run.flow, body, label=label, tags=tags)
    results_dir = str(Path(settings.beamline.preview_dir).resolve() / run_name)
    # What the scan takes on the cluster: a full disk there says how much room it needs.
    scan_bytes = tree_bytes(transferred(Path(run.scan_path)))
    run = store.update_run(
        run.id,
        status=RunStatus.ACTIVE,
        backend_run_id=backend_run_id,
        label=label,
        error=None,
        error_step=None,
        error_kind=None,
        result={"run_name": run_name, "results_dir": results_dir, "input": body,
                "scan_bytes": scan_bytes},
    )
    store.add_event(
        run.id, "RunStarted", f"{run.flow} started on {backend.name} as {backend_run_id}"
    )
    return run


def run_direct(
    settings: Settings,
    store: Store,
    backend: RunBackend,
    request: RunRequest,
    *,
    timeout: float | None = None,
) -> Run:
    """Run the ``reconstruct`` function on the compute endpoint with no flow and no
    transfers (facilities whose beamline and cluster share a file system), and wait for it.

    The function gets exactly the arguments the ``ptycho_shared_fs`` flow would give it, and
    the run is recorded like a flow run (one step, Reconstruct). Only backends that can submit
    to a compute endpoint directly (Globus) offer this; ``request.flow`` is not used."""
    submit = getattr(backend, "run_direct", None)
    if submit is None:
        raise RunInputError(f"the {backend.name} backend has no direct submission (Globus only)")
    run = create_scan_run(settings, store, request.model_copy(update={"flow": SHARED_FS_FLOW}))
    run_name = run_name_for(run)
    body = flow_input_for(settings, run.scan_path, run.parameters, run_name, flow=run.flow)
    compute = body["compute"]
    kwargs = {  # what flows/ptycho_shared_fs.json passes to the function, key for key
        "scan_path": compute["scan_path"],
        "output_dir": compute["output_dir"],
        "checkpoint_dir": compute["checkpoint_dir"],
        "node_local_dir": compute["node_local_dir"],
        "allowed_roots": compute["allowed_roots"],
        "run_name": body["run_name"],
        "parameters": body["reconstruction"],
    }
    started = time.time()
    run = store.update_run(run.id, status=RunStatus.ACTIVE, backend_run_id=f"direct:{run_name}",
                           label=run.label or f"beamflow {run.scan_name} {run_name} (direct)",
                           result={"run_name": run_name, "input": body, "direct": True})
    store.record_step(run.id, "Reconstruct", "ACTIVE", started_at=started)
    try:
        summary = submit("reconstruct", kwargs, timeout=timeout,
                         user_endpoint_config=compute["user_endpoint_config"])
    except RunBackendError as exc:
        store.record_step(run.id, "Reconstruct", "FAILED", finished_at=time.time())
        return store.update_run(run.id, status=RunStatus.FAILED, error=str(exc),
                                error_step="Reconstruct", error_kind=exc.kind)  # fmt: skip
    store.record_step(run.id, "Reconstruct", "SUCCEEDED", finished_at=time.time())
    try:
        parsed = FunctionSummary.model_validate(summary)
    except ValidationError as exc:
        return store.update_run(
            run.id, status=RunStatus.FAILED, error_step="Reconstruct",
            error=f"the reconstruct function answered no summary: {validation_text(exc)}",
            error_kind=ErrorKind.FAILED,
        )  # fmt: skip
    fields = summary_fields(run, parsed, None)  # one file system: the files are in place
    return store.update_run(run.id, status=RunStatus.SUCCEEDED, **fields)


def start_scan_run(
    settings: Settings, store: Store, backend: RunBackend, request: RunRequest
) -> Run:
    """Record and start a run of a scan: ACTIVE, or FAILED with the reason if the backend
    could not start it. Bad arguments raise :class:`RunInputError` before anything is
    recorded."""
    return _launch_or_fail(settings, store, backend, create_scan_run(settings, store, request))


def _launch_or_fail(settings: Settings, store: Store, backend: RunBackend, run: Run) -> Run:
    try:
        return launch_run(settings, store, backend, run)
    except RunBackendError as exc:
        run = store.update_run(run.id, status=RunStatus.FAILED, error=str(exc),
                               error_step=exc.step or "Start", error_kind=exc.kind)  # fmt: skip
        store.add_event(run.id, "RunFailed", f"could not start: {exc}", level="error")
        return run


# -- following runs ----------------------------------------------------------------------------
def sync_run(store: Store, backend: RunBackend, run: Run) -> Run:
    """Bring the stored run up to date with the backend: status, steps with timings,
    iteration progress, and at the end the product and previews (beamline-side paths) or
    the error and the step it happened in. Raises :class:`RunBackendError` if the backend
    cannot say (the stored run is left as it was)."""
    if not run.backend_run_id or run.status.finished:
        return run
    info = backend.get_run(run.backend_run_id)
    _record_steps(store, run.id, info.steps, info.status)
    fields: dict[str, Any] = {}
    active = [s for s in info.steps if s.status == "ACTIVE"]
    if active:
        fields["current_step"] = active[-1].name
        progress = active[-1].progress
        if progress is not None:
            fields["iteration"] = progress.iteration
            if progress.iterations_total is not None:
                fields["iterations_total"] = progress.iterations_total
    if info.status == RunStatus.SUCCEEDED:
        fields.update(success_fields(run, info))
    failure = None
    if info.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        failure = failure_of(run, info)
        fields.update(error=failure.message, error_step=failure.step, error_kind=failure.kind,
                      result={**run.result, "failure": failure.model_dump(mode="json")})
    if info.status != run.status:
        fields["status"] = info.status
    changed = {k: v for k, v in fields.items() if getattr(run, k) != v}
    if not changed:
        return run
    run = store.update_run(run.id, **changed)
    if "status" in changed and run.status.finished:
        level = "info" if run.status == RunStatus.SUCCEEDED else "error"
        text = run.status.value.lower()
        if failure is not None:  # the whole chain, as the backend told it
            text += f" in {failure.step or 'an unknown step'} ({failure.kind}): {failure.chain}"
        store.add_event(run.id, f"Run{run.status.value.title()}", text, level=level,
                        details=failure.model_dump(mode="json") if failure else None)
    return run


def _record_steps(store: Store, run_id: str, steps: list[StepInfo], status: RunStatus) -> None:
    known = {s.name: s for s in store.steps(run_id)}
    for step in steps:
        old = known.get(step.name)
        details = _compact(step.details)
        if (
            old is not None
            and old.status == step.status
            and old.started_at == step.started_at
            and old.finished_at == step.finished_at
            and all(old.details.get(k) == v for k, v in details.items())
        ):
            continue
        store.record_step(run_id, step.name, step.status, started_at=step.started_at,
                          finished_at=step.finished_at, details=details)  # fmt: skip


def _compact(details: dict[str, Any]) -> dict[str, Any]:
    """Step details worth keeping in the store (bounded: no action inputs, short text)."""
    out = {k: v for k, v in details.items() if k != "input"}
    text = json.dumps(out, default=str)
    if len(text) > 20_000:
        out = {k: v for k, v in out.items() if k != "action"}
    return out


def follow_run(
    store: Store,
    backend: RunBackend,
    run: Run,
    *,
    poll_seconds: float = 1.0,
    max_poll_seconds: float = 10.0,
    timeout: float | None = None,
    on_update: Callable[[Run], None] | None = None,
) -> Run:
    """Sync the run until it ends (or ``timeout``); transient backend faults are retried."""
    deadline = None if timeout is None else time.monotonic() + timeout
    interval = poll_seconds
    while True:
        try:
            new = sync_run(store, backend, run)
        except RunBackendError as exc:
            if not exc.transient:
                raise
            new = run
        if on_update is not None:
            on_update(new)
        changed = new.updated_at != run.updated_at
        run = new
        if run.status.finished or not run.backend_run_id:
            return run
        if deadline is not None and time.monotonic() >= deadline:
            return run
        interval = poll_seconds if changed else min(interval * 1.5, max_poll_seconds)
        wait = interval if deadline is None else min(interval, deadline - time.monotonic())
        time.sleep(max(0.0, wait))


# -- retry and cancel --------------------------------------------------------------------------
def retry_run(
    settings: Settings,
    run_id: str,
    *,
    store: Store | None = None,
    backend: RunBackend,
) -> Run:
    """Start the one new attempt of a failed or cancelled run (same scan, flow and
    parameters; ``parent_run_id`` links them). It continues from the scan's checkpoints.

    Raises :class:`RetryRefused` when the run is not finished, succeeded, was retried
    already (with the id of that retry: two retries at once still make one run), or failed on
    bad input (a retry would not help).

    Following the new run is the caller's (``beamflow runs retry --wait``; the status page's
    retry button: :func:`beamflow.run_backends.retry_and_follow`)."""
    store = store or Store(settings.store_path)
    old = store.require_run(run_id)
    if old.retry_refusal:
        raise RetryRefused(old.retry_refusal, old.retried_by)
    try:
        new = store.add_retry(old, old.new_attempt(settings.backend))
    except DuplicateRun as exc:  # another retry won the race
        raise RetryRefused(f"run {old.id} was retried already, as run {exc.run_id}",
                           exc.run_id) from None  # fmt: skip
    cause = f"{old.error_step}: {old.error}" if old.error_step else old.error
    store.add_event(new.id, "RetryOf", f"retry of run {old.id} ({cause})")
    return _launch_or_fail(settings, store, backend, new)


def cancel_run(
    settings: Settings,
    run_id: str,
    *,
    store: Store | None = None,
    backend: RunBackend,
) -> Run:
    """Cancel a run: a QUEUED one at once; a running one through its backend (the store
    shows CANCELLED once the backend has stopped it)."""
    store = store or Store(settings.store_path)
    run = store.get_run(run_id)
    if run is None:
        raise StoreError(f"no run with id {run_id!r} in {store.path}")
    if run.status.finished:
        return run
    if run.status == RunStatus.QUEUED or not run.backend_run_id:
        run = store.update_run(run.id, status=RunStatus.CANCELLED,
                               error="cancelled before it started",
                               error_kind=ErrorKind.CANCELLED)  # fmt: skip
        store.add_event(run.id, "RunCancelled", "cancelled before it started")
        return run
    backend.cancel_run(run.backend_run_id)
    store.add_event(run.id, "CancelRequested", f"cancel sent to {backend.name}")
    return sync_run(store, backend, run)
