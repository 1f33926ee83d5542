"""The one run path: how a scan becomes a flow run and how the run store follows it.

The CLI (``beamflow runs start|retry|cancel``), the edge agent and the status page's retry
button all go through these functions, on either backend, so a run is recorded, started,
followed and reported the same way wherever it came from.

    request = RunRequest(scan_path=..., params={...}, dedupe_key=...)
    run = create_scan_run(settings, store, request)       # QUEUED
    run = launch_run(settings, store, backend, run)       # ACTIVE, with backend_run_id
    run = sync_run(store, backend, run)                   # status, steps, error, previews
    run = start_scan_run(settings, store, backend, request)   # create + launch
    run = follow_run(store, backend, run)                 # sync until it ends
    run = retry_run(settings, run_id)                     # the one new attempt of a failed run
    run = cancel_run(settings, run_id)

Where things go (the same layout on the local backend and at a facility):

- beamline side: the scan is read where the detector wrote it (inside
  ``beamline.collection_root``); product and previews come back to
  ``beamline.preview_dir/<run name>/`` (``product.h5``, ``previews/*.png``);
- HPC side, under ``hpc.scratch_dir/<scan key>/``: ``raw/`` (the transferred scan: a later
  run of the same scan copies only new files), ``checkpoints/`` (shared by the scan's runs,
  so a retry or a run with more frames continues from the last one) and
  ``runs/<run name>/`` (what the function writes).

The ``<scan key>`` is the scan's name plus a hash of its path (stable, unique); the
``<run name>`` is the scan's name plus the run id (plus the attempt after the first).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from beamflow.backend import Backend, BackendError, FlowRunInfo, StepInfo
from beamflow.config import Settings
from beamflow.disk import tree_bytes
from beamflow.error_kinds import ErrorKind
from beamflow.failures import failure_of
from beamflow.formats import ScanFormatError, find_scan_file
from beamflow.job.models import FunctionSummary, RunParameters
from beamflow.registry import Registry, RegistryError
from beamflow.store import DuplicateRun, Run, RunStatus, Store, StoreError
from beamflow.validation_text import field_path, validation_text


def get_backend(settings: Settings) -> Backend:
    """The backend the configuration names. The packages are imported here, not at the top,
    so a local run does not pay for importing the Globus SDKs (nor the reverse); neither
    package imports this module, so no circle hides behind the late import."""
    if settings.backend == "local":
        from beamflow.local import LocalBackend

        return LocalBackend(settings)
    from beamflow.globus import GlobusBackend

    return GlobusBackend(settings)

DEFAULT_FLOW = "ptycho_reconstruct"
SHARED_FS_FLOW = "ptycho_shared_fs"
FLOWS = (DEFAULT_FLOW, SHARED_FS_FLOW)
FUNCTION = "reconstruct"
MASTER_SUFFIX = "_master.h5"


class RunInputError(ValueError):
    """A run cannot be built from what was given (scan path, parameters, configuration)."""


class RetryRefused(RunInputError):
    """A run cannot be retried; ``retry_id`` is the run that retries it already, if any."""

    def __init__(self, message: str, retry_id: str | None = None) -> None:
        super().__init__(message)
        self.retry_id = retry_id


class RunRequest(BaseModel):
    """What a new run of a scan is asked: where the scan is, how to reconstruct it (the
    configured defaults overridden by ``params``), and how the run is found again."""

    model_config = ConfigDict(extra="forbid")

    scan_path: Path = Field(description="a scan directory, *_master.h5 or .cxi file")
    params: dict[str, Any] = Field(default_factory=dict)
    dedupe_key: str | None = Field(default=None, description="at most one run per key")
    fraction: float | None = Field(default=None, gt=0, le=1, description="of the frames")
    label: str | None = None
    flow: str = DEFAULT_FLOW


def reconstruction_params(settings: Settings, params: dict[str, Any] | None = None) -> dict:
    """The configured defaults overridden by ``params``; unknown keys and bad values raise
    :class:`RunInputError` naming them."""
    merged = {**settings.reconstruction.model_dump(), **(params or {})}
    try:
        return RunParameters.model_validate(merged).model_dump()
    except ValidationError as exc:
        known = ", ".join(RunParameters.model_fields)
        problems = []
        for err in exc.errors():
            key = field_path(err)
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown parameter {key!r} (known: {known})")
            else:
                problems.append(f"parameter {key}={err.get('input')!r}: {err['msg']}")
        raise RunInputError("; ".join(problems)) from None


def parse_param(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` from the command line; VALUE is JSON when it parses (50, true, null),
    else a string."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise RunInputError(f"--param {text!r}: expected KEY=VALUE (e.g. iterations=50)")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


# -- names and paths ---------------------------------------------------------------------------
def _safe(text: str, limit: int = 60) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-_")[:limit]
    return cleaned or "scan"


def scan_name(scan_path: Path) -> str:
    """A scan's name: its directory, or the file without ``_master.h5`` / extension."""
    if scan_path.is_file() or scan_path.suffix:
        name = scan_path.name
        if name.endswith(MASTER_SUFFIX):
            return name[: -len(MASTER_SUFFIX)]
        return scan_path.stem
    return scan_path.name


def scan_key(scan_path: Path) -> str:
    digest = hashlib.sha256(str(scan_path).encode()).hexdigest()[:8]
    return f"{_safe(scan_name(scan_path), 48)}-{digest}"


def run_name_for(run: Run) -> str:
    name = f"{_safe(run.scan_name, 60)}-{run.id[:8]}"
    return name if run.attempt <= 1 else f"{name}-{run.attempt}"


def _collection_path(path: PurePosixPath, root: PurePosixPath, what: str) -> str:
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise RunInputError(f"{what} {path} is not inside its collection root {root}") from None
    return "/" + rel.as_posix() if rel.parts else "/"


def scan_location(settings: Settings, scan_path: str | Path) -> Path:
    """The scan's one path, as every part names it (``scan_path``): its master (or CXI)
    file, absolute, symlinks resolved, checked to exist inside the beamline collection (or
    it could not be transferred). A scan directory stands for the one scan file in it, so a
    scan started as its directory and the same scan found by the agent (as its master file)
    are one scan. Checked when a run is created and again when it starts (the files may have
    gone in between)."""
    scan = Path(scan_path).expanduser().resolve()
    if not scan.exists():
        raise RunInputError(f"scan {scan} does not exist")
    beamline_root = Path(settings.beamline.collection_root).resolve()
    if not scan.is_relative_to(beamline_root):
        raise RunInputError(
            f"scan {scan} is outside the beamline collection root {beamline_root} "
            "(beamline.collection_root in beamflow.toml): it cannot be transferred"
        )
    if scan.is_dir():
        try:
            scan = find_scan_file(scan).resolve()
        except ScanFormatError as exc:  # none, or several: say so before anything is recorded
            raise RunInputError(str(exc)) from None
        if not scan.is_relative_to(beamline_root):  # a link out of the collection
            raise RunInputError(
                f"scan {scan_path}: its scan file is {scan}, outside the beamline collection "
                f"root {beamline_root}: it cannot be transferred"
            )
    return scan


def transferred(scan: Path) -> Path:
    """What a run of ``scan`` (its :func:`scan_location`) moves to the cluster: a master
    file's directory (its data files sit beside it), else the file itself."""
    return scan.parent if scan.is_file() and scan.name.endswith(MASTER_SUFFIX) else scan


def flow_input_for(
    settings: Settings,
    scan_path: str | Path,
    params: dict[str, Any] | None,
    run_name: str,
    *,
    flow: str = DEFAULT_FLOW,
    function_id: str | None = None,
    fraction: float | None = None,
) -> dict[str, Any]:
    """The input of ``flow`` for one run of the scan at ``scan_path`` (a local path on the
    beamline machine: a scan directory, a ``*_master.h5`` file or a ``.cxi`` file).

    ``function_id`` defaults to the ``reconstruct`` function registered for the configured
    backend (raises :class:`RunInputError` saying how to register it when it is not).
    ``fraction`` below 1 marks a progressive run: its batch job gets ``cluster.preview``'s
    resources, a run of the whole scan ``cluster.final``'s."""
    if flow not in FLOWS:
        raise RunInputError(f"no input recipe for flow {flow!r} (known: {', '.join(FLOWS)})")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}", run_name):
        raise RunInputError(f"run name {run_name!r}: letters, digits, '_' and '-' only")
    scan = scan_location(settings, scan_path)
    beamline_root = Path(settings.beamline.collection_root).resolve()
    moved = transferred(scan)
    master = moved != scan
    is_dir = moved.is_dir()
    key = scan_key(scan)

    preview_dir = Path(settings.beamline.preview_dir).resolve()
    results_local = preview_dir / run_name
    if not results_local.is_relative_to(beamline_root):
        raise RunInputError(
            f"beamline.preview_dir {preview_dir} is outside beamline.collection_root "
            f"{beamline_root}: results could not come back"
        )

    # HPC paths are paths on another machine: pure path arithmetic, nothing resolved here.
    hpc_root = PurePosixPath(str(settings.hpc.collection_root))
    scratch = PurePosixPath(str(settings.hpc.scratch_dir))
    work = scratch / key
    raw = work / "raw" / moved.name
    run_dir = work / "runs" / run_name
    allowed = [str(scratch)]
    if settings.hpc.node_local_dir:
        allowed.append(str(settings.hpc.node_local_dir))

    if function_id is None:
        try:
            function_id = Registry(settings.registry_path, settings.backend).require_id(
                "function", FUNCTION
            )
        except RegistryError as exc:
            raise RunInputError(str(exc)) from None
    endpoint = settings.compute.endpoint_id
    if not endpoint:
        raise RunInputError("compute.endpoint_id is not set in beamflow.toml")

    reconstruction = reconstruction_params(settings, params)
    compute: dict[str, Any] = {
        "endpoint_id": endpoint,
        "function_id": function_id,
        "checkpoint_dir": str(work / "checkpoints"),
        "node_local_dir": str(settings.hpc.node_local_dir) if settings.hpc.node_local_dir else None,
        "allowed_roots": allowed,
        "user_endpoint_config": run_resources(settings, fraction),
    }
    if flow == SHARED_FS_FLOW:
        # One file system: the function reads the scan in place and writes the results
        # where the beamline reads them.
        compute.update(
            scan_path=str(scan),
            output_dir=str(results_local),
            allowed_roots=[str(beamline_root), *allowed],
        )
        return {"run_name": run_name, "compute": compute, "reconstruction": reconstruction}

    compute.update(
        scan_path=str(raw / scan.name) if master else str(raw),
        output_dir=str(run_dir),
    )
    return {
        "run_name": run_name,
        "scan_is_directory": is_dir,
        "beamline": {
            "collection_id": settings.beamline.collection_id,
            "scan_path": _collection_path(
                PurePosixPath(str(moved)), PurePosixPath(str(beamline_root)), "scan"
            ),
            "results_path": _collection_path(
                PurePosixPath(str(results_local)),
                PurePosixPath(str(beamline_root)),
                "results directory",
            ),
        },
        "hpc": {
            "collection_id": settings.hpc.collection_id,
            "scan_path": _collection_path(raw, hpc_root, "hpc.scratch_dir"),
            "results_path": _collection_path(run_dir, hpc_root, "hpc.scratch_dir"),
        },
        "compute": compute,
        "reconstruction": reconstruction,
    }


def run_resources(settings: Settings, fraction: float | None) -> dict[str, str]:
    """The Reconstruct step's ``user_endpoint_config``: the preview resources for a part of
    a scan, the final ones for all of it (a short queue for early images, a long one for
    the full reconstruction)."""
    progressive = fraction is not None and fraction < 1.0
    cluster = settings.cluster
    return (cluster.preview if progressive else cluster.final).endpoint_config()


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


def launch_run(settings: Settings, store: Store, backend: Backend, run: Run) -> Run:
    """Start a QUEUED run on the backend; the run becomes ACTIVE with its backend run id.

    Raises :class:`BackendError` (``transient`` when worth a retry) and leaves the run as it
    was: the caller decides between failing it and trying again."""
    if run.status != RunStatus.QUEUED:
        raise BackendError(f"run {run.id} is {run.status.value}, not QUEUED", step="Start")
    run_name = run_name_for(run)
    try:
        body = flow_input_for(settings, run.scan_path, run.parameters, run_name, flow=run.flow,
                              fraction=run.fraction)
    except RunInputError as exc:  # often the configuration: fixed, a retry goes through
        raise BackendError(str(exc), step="Start") from None
    label = (run.label or f"beamflow {run.scan_name} {run_name}")[:128]
    tags = ["beamflow", _safe(run.scan_name, 100)]
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
    backend: Backend,
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
        "scan": compute["scan_path"],
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
    except BackendError as exc:
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
    fields = _summary_fields(run, parsed, None)  # one file system: the files are in place
    return store.update_run(run.id, status=RunStatus.SUCCEEDED, **fields)


def start_scan_run(settings: Settings, store: Store, backend: Backend, request: RunRequest) -> Run:
    """Record and start a run of a scan: ACTIVE, or FAILED with the reason if the backend
    could not start it. Bad arguments raise :class:`RunInputError` before anything is
    recorded."""
    return _launch_or_fail(settings, store, backend, create_scan_run(settings, store, request))


def _launch_or_fail(settings: Settings, store: Store, backend: Backend, run: Run) -> Run:
    try:
        return launch_run(settings, store, backend, run)
    except BackendError as exc:
        run = store.update_run(run.id, status=RunStatus.FAILED, error=str(exc),
                               error_step=exc.step or "Start", error_kind=exc.kind)  # fmt: skip
        store.add_event(run.id, "RunFailed", f"could not start: {exc}", level="error")
        return run


# -- following runs ----------------------------------------------------------------------------
def sync_run(store: Store, backend: Backend, run: Run) -> Run:
    """Bring the stored run up to date with the backend: status, steps with timings,
    iteration progress, and at the end the product and previews (beamline-side paths) or
    the error and the step it happened in. Raises :class:`BackendError` if the backend
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
        fields.update(_success_fields(run, info))
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


class _ComputeTask(BaseModel):
    output: Any = None


class _ComputeDetails(BaseModel):
    """The part of a compute action's status that holds the function's return value."""

    result: list[Any] = Field(default_factory=list)
    results: list[_ComputeTask] = Field(default_factory=list)


class _ComputeAction(BaseModel):
    details: _ComputeDetails = Field(default_factory=_ComputeDetails)


def reconstruction_summary(output: dict[str, Any]) -> FunctionSummary | None:
    """The reconstruct function's summary in a flow's output (``$.reconstruct``, the compute
    action's status: ``details.result[0]``, or ``details.results[0].output``); None when
    there is none or it is not one."""
    try:
        details = _ComputeAction.model_validate(output.get("reconstruct")).details
    except ValidationError:
        return None
    answers = [*details.result[:1], *(task.output for task in details.results[:1])]
    for answer in answers:
        try:
            return FunctionSummary.model_validate(answer)
        except ValidationError:
            continue
    return None


def _summary_fields(run: Run, summary: FunctionSummary, base: Path | None) -> dict[str, Any]:
    """The run's fields from the function's summary: the product and previews that arrived
    under ``base`` (where the flow brought them; None: as the function wrote them, on a file
    system the beamline shares), the iterations and the verdict."""
    if base is None:
        product = summary.product
        previews = summary.previews
    else:
        arrived = base / summary.product_relative
        product = str(arrived) if arrived.exists() else None
        previews = [str(p) for p in (base / p for p in summary.previews_relative) if p.exists()]
    fields: dict[str, Any] = {
        "result": {**run.result, "summary": summary.model_dump(mode="json")},
        "error": None,
        "error_step": None,
        "error_kind": None,
        "product": product,
        "previews": previews,
        "verdict": summary.verdict,
        "verdict_reasons": summary.verdict_reasons,
    }
    if summary.iterations is not None:
        fields["iteration"] = fields["iterations_total"] = summary.iterations
    return fields


def _success_fields(run: Run, info: FlowRunInfo) -> dict[str, Any]:
    summary = reconstruction_summary(info.output)
    if summary is None:
        return {"result": {**run.result, "summary": None}, "error": None, "error_step": None,
                "error_kind": None}  # fmt: skip
    results_dir = run.result.get("results_dir")
    return _summary_fields(run, summary, Path(results_dir) if results_dir else None)


def follow_run(
    store: Store,
    backend: Backend,
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
        except BackendError as exc:
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
    backend: Backend | None = None,
) -> Run:
    """Start the one new attempt of a failed or cancelled run (same scan, flow and
    parameters; ``parent_run_id`` links them). It continues from the scan's checkpoints.

    Raises :class:`RetryRefused` when the run is not finished, succeeded, was retried
    already (with the id of that retry: two retries at once still make one run), or failed on
    bad input (a retry would not help).

    Without ``backend`` one is opened and a background thread follows the new run until it
    ends (the status page's retry button), then closes it; with one, following is the
    caller's (``beamflow runs retry --wait``)."""
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
    if backend is not None:
        return _launch_or_fail(settings, store, backend, new)
    backend = get_backend(settings)
    new = _launch_or_fail(settings, store, backend, new)
    if new.status.finished:
        backend.close()
        return new

    def follow(run: Run = new, backend: Backend = backend, store: Store = store) -> None:
        try:
            follow_run(store, backend, run)  # the store keeps one connection per thread
        except Exception:  # noqa: BLE001 - the run is recorded; following is best effort
            pass
        finally:
            backend.close()

    threading.Thread(target=follow, name=f"follow-{new.id[:8]}", daemon=True).start()
    return new


def cancel_run(
    settings: Settings,
    run_id: str,
    *,
    store: Store | None = None,
    backend: Backend | None = None,
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
    own = backend is None
    backend = backend or get_backend(settings)
    try:
        backend.cancel_run(run.backend_run_id)
        store.add_event(run.id, "CancelRequested", f"cancel sent to {backend.name}")
        return sync_run(store, backend, run)
    finally:
        if own:
            backend.close()
