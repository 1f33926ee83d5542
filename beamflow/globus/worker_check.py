"""`beamflow doctor --probe` on Globus: the probe task through the configured Compute
endpoint, compared with what the endpoint reports of itself (its globus-compute-endpoint and
Python) and with this beamline host (beamflow; Parsl as pinned, which the service does not
report for the endpoint)."""

from __future__ import annotations

import hashlib
from importlib import metadata

from pydantic import ValidationError

from beamflow import __version__
from beamflow import registry as reg
from beamflow.config import Settings, is_uuid
from beamflow.globus import compute
from beamflow.globus.auth import INTERACTIVE, GlobusAuth, NetworkPolicy
from beamflow.runs.backend import RunBackendError
from beamflow.worker_check import Check, Reference, WorkerReport, judge, probe_worker

PROBE = "worker_probe"  # its registry name (not a shipped function: never in a flow)


def probe_checksum() -> str:
    return hashlib.sha256(f"{compute.function_source(probe_worker)}\0{__version__}".encode()
                          ).hexdigest()  # fmt: skip


def _probe_function(settings: Settings, auth: GlobusAuth) -> str:
    """The probe's function id, registered once per version (kept in the registry)."""
    registry = reg.Registry(settings.registry_path, "globus")
    result = registry.ensure(
        "function", PROBE, probe_checksum(),
        create=lambda _name: compute.register_function(
            auth, probe_worker, description=f"beamflow worker probe ({__version__})"),
        exists=lambda function_id: compute.function_exists(auth, function_id),
    )  # fmt: skip
    assert result.id is not None
    return result.id


def check_endpoint_workers(
    settings: Settings, *, network: NetworkPolicy = INTERACTIVE, timeout: float = 600.0,
    poll_seconds: float = 5.0, as_agent: bool = False,
) -> list[Check]:
    """Run the probe on a worker of ``compute.endpoint_id`` and judge it; never raises for
    what it finds. ``as_agent``: as the agent's final runs go (its client credentials, the
    ``[cluster.final]`` resources, the mapped account, the GPUs)."""
    endpoint = settings.compute.endpoint_id
    if not is_uuid(endpoint) or not is_uuid(settings.globus.client_id):
        return [Check(name="worker probe", outcome="skip",
                      detail="needs globus.client_id and compute.endpoint_id")]  # fmt: skip
    if as_agent and not settings.globus.client_secret:
        return [Check(
            name="worker probe", outcome="fail",
            detail="--as-agent runs the probe with the agent's client credentials, and this "
            "environment has none (BEAMFLOW_GLOBUS__CLIENT_SECRET)",
            fix="run it as the agent: `sudo beamflow-as-agent doctor --probe --as-agent` "
            "(deploy/systemd/beamflow-as-agent reads /etc/beamflow/agent.env)",
        )]  # fmt: skip
    scratch = str(settings.hpc.scratch_dir)
    resources = settings.cluster.final.endpoint_config() if as_agent else None
    try:
        with GlobusAuth(settings, network=network) as auth:
            auth.require_login()
            about = compute.endpoint_metadata(auth, endpoint)
            function_id = _probe_function(settings, auth)
            raw = compute.run_direct(auth, endpoint, function_id, {"scratch_dir": scratch},
                                     timeout=timeout, poll_seconds=poll_seconds,
                                     user_endpoint_config=resources)  # fmt: skip
        report = WorkerReport.model_validate(raw)
    except (RunBackendError, reg.RegistryError) as exc:
        return [Check(
            name="worker probe", outcome="fail", detail=str(exc),
            fix="is the endpoint online and do its batch jobs start? Read the user endpoint's "
            "endpoint.log and submit_scripts/ on the login node (a worker pool whose Parsl "
            "differs from the endpoint's may never take a task)",
        )]  # fmt: skip
    except ValidationError as exc:
        return [Check(name="worker probe", outcome="fail",
                      detail=f"the probe's answer is not a worker report: {exc}")]  # fmt: skip
    reference = Reference(
        beamflow=__version__,
        parsl=metadata.version("parsl"),
        parsl_from="the pinned version (this host, deploy/constraints-worker.txt; the service "
        "does not report the endpoint's Parsl)",
        globus_compute_endpoint=about.get("endpoint_version") or None,
        globus_compute_endpoint_from=f"endpoint {endpoint}",
        python=about.get("python_version") or None,
        python_from=f"endpoint {endpoint}",
        service_account=settings.cluster.service_account,
        require_gpu=settings.reconstruction.device == "cuda" or (
            as_agent and settings.reconstruction.device != "cpu"),
        strict_user=as_agent,
        min_gpus=settings.cluster.final.gpus_per_node if as_agent else None,
    )
    how = (f" as the agent's client {settings.globus.client_id} with [cluster.final] "
           f"{resources or '{} (the template defaults)'}" if as_agent else "")
    ran = Check(name="worker probe", outcome="ok",
                detail=f"ran on {report.host} through endpoint {endpoint}{how}")  # fmt: skip
    return [ran, *judge(report, reference), *resources_checks(settings, about)]


def resources_checks(settings: Settings, about: dict) -> list[Check]:
    """``[cluster.preview]`` and ``[cluster.final]`` against the template schema the endpoint
    published: a variable it does not take fails every such run at Reconstruct."""
    import jsonschema

    schema = about.get("user_config_schema")
    checks = []
    for kind in ("preview", "final"):
        config = getattr(settings.cluster, kind).endpoint_config()
        name = f"cluster.{kind}"
        if not config:
            continue
        if not isinstance(schema, dict) or not schema:
            checks.append(Check(name=name, outcome="warn", detail=f"{config}: the endpoint "
                                "published no template schema to check them against"))  # fmt: skip
            continue
        problems = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(config)]
        if problems:
            allowed = ", ".join(sorted(schema.get("properties", {}))) or "none"
            checks.append(Check(
                name=name, outcome="fail",
                detail=f"the endpoint's template refuses {config}: {'; '.join(problems)}",
                fix=f"use only variables its user_config_schema.json allows ({allowed})",
            ))  # fmt: skip
        else:
            checks.append(Check(name=name, outcome="ok", detail=f"{config} fit the template"))
    return checks
