"""The Globus Compute function the flows call: reconstruct one scan on a GPU node.

The body is self-contained (every import is inside it): globus-compute serialises the
function, and the endpoint runs it without this module. It needs beamflow installed on the
endpoint (the same version: the registered checksum includes it).

Flow kwargs (``flows/ptycho_reconstruct.json``, task kwargs)::

    reconstruct(scan=..., output_dir=..., allowed_roots=[...], parameters={...},
                checkpoint_dir=..., node_local_dir=None, run_name=...)

Every path must resolve (symlinks followed, ``..`` collapsed) inside one of
``allowed_roots``; anything else is refused before a byte is read. The GPU is the one the
endpoint pinned for this worker (``CUDA_VISIBLE_DEVICES``, which the endpoint's
``available_accelerators`` sets, on the endpoint and in the local backend's engine alike); the
function never widens it.
Errors raise ``ValueError`` (bad input: nothing to retry) or ``RuntimeError`` (the
reconstruction failed), both built-ins so they deserialise anywhere, with the scan and the
cause in the message.
"""

# No "from __future__ import annotations": the pydantic models are built inside the body
# from real annotation objects, wherever the body is deserialised.
from typing import Any


def reconstruct(
    *,
    scan: str,
    output_dir: str,
    allowed_roots: list[str],
    parameters: dict[str, Any] | None = None,
    checkpoint_dir: str | None = None,
    node_local_dir: str | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    """Reconstruct ``scan`` into ``output_dir`` (product.h5, previews/); return a summary.

    The steps, each a function below: check the request, confine its paths, pick the
    device, build the job, run it (with progress for the run directory), report.
    """
    import contextlib
    import os
    import socket
    import time
    from pathlib import Path
    from typing import Any

    from pydantic import BaseModel, ConfigDict, Field, ValidationError

    try:
        from beamflow.atomic import atomic_write_json
        from beamflow.reconstruct import run_reconstruction
        from beamflow.reconstruct_job import ReconstructJob, RunParameters
        from beamflow.validation_text import validation_text
    except ImportError as exc:
        raise RuntimeError(
            f"scan {scan!r}: beamflow.reconstruct is not importable on this endpoint ({exc}); "
            "install beamflow (same version as the registered function) in its environment"
        ) from None

    label = scan if isinstance(scan, str) else repr(scan)

    class Request(BaseModel):
        model_config = ConfigDict(extra="forbid")

        scan: str = Field(min_length=1)
        output_dir: str = Field(min_length=1)
        allowed_roots: list[str] = Field(min_length=1, max_length=16)
        parameters: RunParameters = Field(default_factory=RunParameters)
        checkpoint_dir: str | None = None
        node_local_dir: str | None = None
        run_name: str | None = Field(default=None, max_length=200)

    class Paths(BaseModel):
        scan: Path
        out: Path
        checkpoints: Path
        node_local: Path | None

    def checked_request() -> Request:
        try:
            return Request(scan=scan, output_dir=output_dir, allowed_roots=allowed_roots,
                           parameters=parameters or {}, checkpoint_dir=checkpoint_dir,
                           node_local_dir=node_local_dir, run_name=run_name)
        except ValidationError as exc:
            problems = validation_text(exc)
            raise ValueError(f"scan {label}: invalid arguments: {problems}") from None

    def confined_paths(request: Request) -> Paths:
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
        return Paths(
            scan=confined(request.scan, "scan", must_exist=True),
            out=out,
            checkpoints=confined(request.checkpoint_dir or str(out / "checkpoints"),
                                 "checkpoint_dir", must_exist=False),
            node_local=confined(request.node_local_dir, "node_local_dir", must_exist=False)
            if request.node_local_dir else None,
        )

    def pinned_device(asked: str, visible: str | None) -> str:
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

    def built_job(params: RunParameters, paths: Paths, device: str) -> ReconstructJob:
        try:
            # Every run parameter is a job field of the same name (the engine's settings
            # and aborted as the job's shorthands); the device is the one decided above.
            return ReconstructJob(scan=paths.scan, out=paths.out,
                                  checkpoint_dir=paths.checkpoints,
                                  node_local_dir=paths.node_local,
                                  **params.model_dump(exclude={"device"}), device=device)
        except (ValidationError, TypeError, ValueError) as exc:
            raise ValueError(f"scan {label}: invalid reconstruction job: {exc}") from None

    def progress_writer(out: Path):  # noqa: ANN202 - the job's Progress callable
        """Progress for whoever watches the run directory (the local backend shows it as
        the iteration count); written atomically, at most about once a second."""
        progress_file = out / "progress.json"
        last_write = [0.0]

        def progress(done: int, target: int, loss: float | None) -> None:
            now = time.time()
            if now - last_write[0] < 1.0 and done < target:
                return
            last_write[0] = now
            record = {"iteration": done, "iterations_total": target, "loss": loss, "time": now}
            with contextlib.suppress(OSError):  # a courtesy; the reconstruction goes on
                atomic_write_json(progress_file, record, durable=False)

        return progress

    def ran(job: ReconstructJob) -> dict[str, Any]:
        """The job's summary (JSON); its failure as bad input or a failed reconstruction."""
        try:
            return run_reconstruction(job, progress_writer(job.out)).model_dump(mode="json")
        except Exception as exc:
            kind = type(exc).__name__
            # Bad data is the user's to fix; everything else is a failed reconstruction.
            bad_input = ("ScanFormatError", "ReconstructError", "IncompatibleCheckpoint")
            error = ValueError if kind in bad_input else RuntimeError
            raise error(f"scan {label}: reconstruction failed: {kind}: {exc}") from None

    def report(request: Request, paths: Paths, device: str, visible: str | None,
               data: dict[str, Any], elapsed: float) -> dict[str, Any]:
        out = paths.out
        product = Path(str(data.get("product") or out / "product.h5"))
        previews = [Path(str(p)) for p in data.get("previews") or []]

        def relative(p: Path) -> str:
            return str(p.relative_to(out)) if p.is_relative_to(out) else p.name

        return {
            "scan": str(paths.scan),
            "run_name": request.run_name,
            "algorithm": request.parameters.algorithm,
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

    request = checked_request()
    paths = confined_paths(request)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    device = pinned_device(request.parameters.device, visible)
    job = built_job(request.parameters, paths, device)
    # The flow's results transfer copies previews/ recursively: it must exist (empty when no
    # preview could be drawn) or the whole run would fail at its last step.
    (paths.out / "previews").mkdir(parents=True, exist_ok=True)
    started = time.time()
    summary = ran(job)
    return report(request, paths, device, visible, summary, time.time() - started)
