"""`beamflow doctor --probe` on the local backend: the probe task on the local compute
engine (the endpoint's own GlobusComputeEngine, configured as `compute` says), compared with
this process, which is the engine's endpoint side (its interchange runs from this
environment)."""

from __future__ import annotations

import platform
from concurrent.futures import TimeoutError as FutureTimeout
from importlib import metadata
from typing import Any

from pydantic import ValidationError

from beamflow import __version__
from beamflow.config import ConfigError, Settings
from beamflow.local.compute import engine_from_settings
from beamflow.local.engine import EngineError
from beamflow.worker_check import Check, Reference, WorkerReport, judge, probe_worker


def check_local_workers(settings: Settings, *, timeout: float = 180.0) -> list[Check]:
    """Start the engine, run the probe on one of its workers, judge it, stop the engine."""
    try:
        raw = _run_probe(settings, timeout)
        report = WorkerReport.model_validate(raw)
    except (EngineError, ConfigError, FutureTimeout, ValidationError) as exc:
        reason = f"no answer within {timeout:.0f} s" if isinstance(exc, FutureTimeout) else exc
        return [Check(
            name="worker probe", outcome="fail", detail=f"the local compute engine: {reason}",
            fix=f"read the engine's logs under {settings.state_dir}/compute-engine/ "
            "(compute.engine_config, compute.workers)",
        )]  # fmt: skip
    reference = Reference(
        beamflow=__version__,
        parsl=metadata.version("parsl"),
        parsl_from="the local engine (this environment)",
        globus_compute_endpoint=metadata.version("globus-compute-endpoint"),
        globus_compute_endpoint_from="the local engine (this environment)",
        python=platform.python_version(),
        python_from="the local engine (this environment)",
        service_account=settings.cluster.service_account,
        require_gpu=settings.reconstruction.device == "cuda",
    )
    ran = Check(name="worker probe", outcome="ok",
                detail=f"ran on the local compute engine ({report.host})")  # fmt: skip
    return [ran, *judge(report, reference)]


def _run_probe(settings: Settings, timeout: float) -> Any:
    engine = engine_from_settings(settings)
    try:
        engine.wait_ready(timeout)
        task = engine.submit(engine.pack_function(probe_worker), (),
                             {"scratch_dir": str(settings.hpc.scratch_dir)})  # fmt: skip
        task.future.result(timeout)
        outcome = engine.outcome(task)
        engine.forget(task)
    finally:
        engine.close()
    if not outcome.ok:
        error = outcome.error or {}
        raise EngineError(f"the probe failed on the worker: {error.get('type')}: "
                          f"{error.get('message')}")  # fmt: skip
    return outcome.value
