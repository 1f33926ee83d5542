"""`beamflow doctor --probe`: what a compute worker really runs, and whether it fits.

:func:`probe_worker` is the task: shipped to a worker as its source text (like the
reconstruct function), so it is self-contained, every import inside its body, and only
reports. It needs nothing of beamflow on the worker, so it also says when beamflow is
missing there. :func:`judge` compares its report with the reference: Parsl and
globus-compute-endpoint as the endpoint runs them (the worker pool and the endpoint's
interchange must agree, or tasks fail with "Manager version doesn't match" or hang), Python's
minor version likewise, and beamflow as the beamline host runs it (the registered function's
checksum includes the version, and its body imports beamflow on the worker).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

Outcome = Literal["ok", "warn", "fail", "skip"]


class Check(BaseModel):
    """One line of `beamflow doctor`: what was found and, when it is not ok, what to do."""

    name: str
    outcome: Outcome
    detail: str
    fix: str | None = None


def probe_worker(scratch_dir: str | None = None) -> dict:  # names only builtins: see below
    """Report the worker's Python, Parsl, globus-compute-endpoint and beamflow versions, its
    local user, the GPUs it sees and whether ``scratch_dir`` is writable. Runs on the worker:
    self-contained (its signature names builtins only: the endpoint runs the source text
    alone, where ``typing`` names would not resolve)."""
    import os
    import platform
    import pwd
    import shutil
    import socket
    import subprocess
    import sys
    import tempfile
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    gpus: list[str] = []
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
            gpus = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            gpus = []
    writable, scratch_error = None, None
    if scratch_dir:
        try:
            os.makedirs(scratch_dir, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=scratch_dir, prefix=".beamflow-probe-") as f:
                f.write(b"probe")
                f.flush()
            writable = True
        except OSError as exc:
            writable, scratch_error = False, f"{type(exc).__name__}: {exc}"
    return {
        "python": platform.python_version(),
        "parsl": version("parsl"),
        "globus_compute_endpoint": version("globus-compute-endpoint"),
        "beamflow": version("beamflow"),
        "user": pwd.getpwuid(os.getuid()).pw_name,
        "host": socket.gethostname(),
        "executable": sys.executable,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus": gpus,
        "scratch_dir": scratch_dir,
        "scratch_writable": writable,
        "scratch_error": scratch_error,
    }


class WorkerReport(BaseModel):
    """What :func:`probe_worker` returned."""

    python: str
    parsl: str | None
    globus_compute_endpoint: str | None
    beamflow: str | None
    user: str
    host: str
    executable: str
    cuda_visible_devices: str | None = None
    gpus: list[str] = []
    scratch_dir: str | None = None
    scratch_writable: bool | None = None
    scratch_error: str | None = None


class Reference(BaseModel):
    """The versions the worker must match, each with where it was learnt (said in the
    report, so a mismatch names the side to change)."""

    beamflow: str
    beamflow_from: str = "this beamline host"
    parsl: str | None = None
    parsl_from: str = "the endpoint"
    globus_compute_endpoint: str | None = None
    globus_compute_endpoint_from: str = "the endpoint"
    python: str | None = None
    python_from: str = "the endpoint"
    service_account: str | None = None
    require_gpu: bool = False
    # As the agent (`doctor --probe --as-agent`): the account is the mapped one, or the
    # agent's runs would run elsewhere; the node has the GPUs [cluster.final] asks for.
    strict_user: bool = False
    min_gpus: int | None = None


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _versions(report: WorkerReport, reference: Reference) -> list[Check]:
    env = report.executable.rsplit("/bin/", 1)[0]
    pin = "pip install -c constraints-worker.txt (deploy/, docs/deployment.md §4a)"
    checks = []
    for name, package, ours, theirs, where in (
        ("Parsl", "parsl", report.parsl, reference.parsl, reference.parsl_from),
        ("globus-compute-endpoint", "globus-compute-endpoint", report.globus_compute_endpoint,
         reference.globus_compute_endpoint, reference.globus_compute_endpoint_from),
    ):  # fmt: skip
        label = f"worker {name}"
        if theirs is None:
            checks.append(Check(name=label, outcome="warn", detail=f"{ours} ({where} does not "
                                "say which version it runs)"))  # fmt: skip
        elif ours == theirs:
            checks.append(Check(name=label, outcome="ok", detail=f"{ours}, as {where}"))
        else:
            checks.append(Check(
                name=label, outcome="fail",
                detail=f"{ours or 'not installed'} on the worker, {theirs} at {where}: the "
                "worker pool and the endpoint's interchange must run the same version "
                "(\"Manager version doesn't match\")",
                fix=f"install {package}=={theirs} in the worker environment {env} ({pin}), "
                "or upgrade the endpoint to match, then restart it",
            ))  # fmt: skip
    if reference.python and _minor(report.python) != _minor(reference.python):
        checks.append(Check(
            name="worker Python", outcome="fail",
            detail=f"{report.python} on the worker, {reference.python} at {reference.python_from}",
            fix=f"build the worker environment with Python {_minor(reference.python)}",
        ))  # fmt: skip
    else:
        checks.append(Check(name="worker Python", outcome="ok", detail=report.python))
    if report.beamflow == reference.beamflow:
        checks.append(Check(name="worker beamflow", outcome="ok",
                            detail=f"{report.beamflow}, as {reference.beamflow_from}"))  # fmt: skip
    else:
        checks.append(Check(
            name="worker beamflow", outcome="fail",
            detail=f"{report.beamflow or 'not installed'} on the worker, {reference.beamflow} "
            f"on {reference.beamflow_from}: the registered function imports beamflow there",
            fix=f"install the same wheel (beamflow {reference.beamflow}) in {env} with the "
            "constraints (docs/deployment.md §4a), or upgrade this host to the worker's",
        ))  # fmt: skip
    return checks


def judge(report: WorkerReport, reference: Reference) -> list[Check]:
    """The doctor's lines for one probe report."""
    checks = _versions(report, reference)
    where = f"{report.user}@{report.host}"
    if reference.service_account and report.user != reference.service_account:
        checks.append(Check(
            name="worker user", outcome="fail" if reference.strict_user else "warn",
            detail=f"{where}, not the service account {reference.service_account!r}",
            fix="check the endpoint's identity mapping (cluster.service_account)",
        ))  # fmt: skip
    else:
        checks.append(Check(name="worker user", outcome="ok", detail=where))
    visible = report.cuda_visible_devices
    pinned = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    if report.gpus and reference.min_gpus and len(report.gpus) < reference.min_gpus:
        checks.append(Check(
            name="worker GPUs", outcome="fail",
            detail=f"{len(report.gpus)} on the node, {reference.min_gpus} asked "
            f"([cluster.final] gpus_per_node): {'; '.join(report.gpus)}",
            fix="ask for the node's GPU count, or a partition/queue of nodes with that many",
        ))  # fmt: skip
    elif report.gpus:
        checks.append(Check(name="worker GPUs", outcome="ok",
                            detail=f"{'; '.join(report.gpus)}{pinned}"))  # fmt: skip
    else:
        checks.append(Check(
            name="worker GPUs", outcome="fail" if reference.require_gpu else "warn",
            detail=f"none visible to the worker{pinned}",
            fix="run on GPU nodes (the template's gpus_per_node, available_accelerators)",
        ))  # fmt: skip
    if report.scratch_dir is None:
        checks.append(Check(name="worker scratch", outcome="skip", detail="no scratch_dir"))
    elif report.scratch_writable:
        checks.append(Check(name="worker scratch", outcome="ok",
                            detail=f"{report.scratch_dir} is writable"))  # fmt: skip
    else:
        checks.append(Check(
            name="worker scratch", outcome="fail",
            detail=f"{report.scratch_dir} is not writable: {report.scratch_error}",
            fix=f"make hpc.scratch_dir writable for {report.user} on the compute nodes",
        ))  # fmt: skip
    return checks
