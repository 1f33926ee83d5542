"""`beamflow doctor --probe`: a small task on a compute worker reports its Python, Parsl,
globus-compute-endpoint and beamflow versions, user, GPUs and scratch; doctor fails, with
the fix, when they differ from the endpoint's (or beamflow from this host's).

The local backend's path runs for real on the endpoint's own GlobusComputeEngine; the
Globus path runs against globus-sdk's recorded Compute responses (the task's answer is a real
report of this machine, serialised as the service returns it)."""

from __future__ import annotations

import json
import os
import platform
import pwd
from importlib import metadata
from pathlib import Path

import globus_sdk
import pytest
from endpoint_kit import DEPLOY
from globus_compute_sdk.serialize import ComputeSerializer
from globus_sdk.testing import load_response
from globus_testkit import make_settings, register, store_tokens
from typer.testing import CliRunner

from beamflow import __version__
from beamflow.cli import app
from beamflow.config import load_config
from beamflow.globus.worker_check import PROBE, check_endpoint_workers
from beamflow.registry import Registry
from beamflow.worker_check import Reference, WorkerReport, judge, probe_worker

PARSL = metadata.version("parsl")
GCE = metadata.version("globus-compute-endpoint")


def checks_of(result) -> dict[str, dict]:  # noqa: ANN001
    return {c["name"]: c for c in json.loads(result.stdout)}


# -- the local backend, for real ------------------------------------------------------------------
@pytest.fixture
def local_workspace(tmp_path: Path) -> Path:
    assert CliRunner().invoke(app, ["init", str(tmp_path / "ws")]).exit_code == 0
    return tmp_path / "ws"


@pytest.mark.timeout(180)
def test_the_local_engine_probe_reports_the_worker(local_workspace: Path) -> None:
    config = local_workspace / "beamflow.toml"
    result = CliRunner().invoke(app, ["doctor", "--probe", "--json", "--config", str(config)])
    checks = checks_of(result)
    assert checks["worker probe"]["outcome"] == "ok", checks["worker probe"]
    assert checks["worker Parsl"] == {"name": "worker Parsl", "outcome": "ok",
                                      "detail": f"{PARSL}, as the local engine (this environment)",
                                      "fix": None}  # fmt: skip
    assert checks["worker globus-compute-endpoint"]["detail"].startswith(GCE)
    assert checks["worker beamflow"]["outcome"] == "ok"
    assert checks["worker Python"]["detail"] == platform.python_version()
    assert checks["worker user"]["detail"].startswith(pwd.getpwuid(os.getuid()).pw_name + "@")
    assert checks["worker scratch"]["outcome"] == "ok"
    assert str(local_workspace / "hpc") in checks["worker scratch"]["detail"]
    assert checks["worker GPUs"]["outcome"] in ("ok", "warn")  # no GPU here: a warning
    assert result.exit_code == 0, result.output


@pytest.mark.timeout(180)
def test_an_unwritable_scratch_fails_with_the_fix(local_workspace: Path) -> None:
    blocker = local_workspace / "not-a-dir"
    blocker.write_text("")
    config = local_workspace / "beamflow.toml"
    config.write_text(config.read_text().replace('scratch_dir = "hpc"',
                                                 'scratch_dir = "not-a-dir/scratch"'))  # fmt: skip
    result = CliRunner().invoke(app, ["doctor", "--probe", "--config", str(config)])
    assert result.exit_code == 1
    assert "FAIL  worker scratch:" in result.output and "not writable" in result.output
    assert "fix: make hpc.scratch_dir writable for" in result.output


# -- judging a report ---------------------------------------------------------------------------
def report(**changes) -> WorkerReport:  # noqa: ANN003
    base = WorkerReport.model_validate(probe_worker(None))  # this machine, as a worker
    return base.model_copy(update=changes)


def reference(**changes) -> Reference:  # noqa: ANN003
    return Reference(beamflow=__version__, parsl=PARSL, globus_compute_endpoint=GCE,
                     python=platform.python_version()).model_copy(update=changes)  # fmt: skip


def by_name(checks) -> dict:  # noqa: ANN001
    return {c.name: c for c in checks}


def test_a_parsl_that_differs_from_the_endpoints_fails_with_the_version_to_install() -> None:
    found = by_name(judge(report(parsl="2025.1.1", executable="/soft/env/bin/python"),
                          reference()))  # fmt: skip
    parsl = found["worker Parsl"]
    assert parsl.outcome == "fail" and "Manager version doesn't match" in parsl.detail
    assert f"parsl=={PARSL}" in parsl.fix and "/soft/env" in parsl.fix
    assert "constraints-worker.txt" in parsl.fix


def test_an_endpoint_version_mismatch_and_a_missing_beamflow_fail() -> None:
    found = by_name(judge(report(globus_compute_endpoint="4.18.0", beamflow=None), reference()))
    assert found["worker globus-compute-endpoint"].outcome == "fail"
    assert f"globus-compute-endpoint=={GCE}" in found["worker globus-compute-endpoint"].fix
    assert found["worker beamflow"].outcome == "fail"
    assert found["worker beamflow"].detail.startswith("not installed on the worker")
    other = by_name(judge(report(beamflow="0.0.9"), reference()))["worker beamflow"]
    assert other.outcome == "fail" and f"beamflow {__version__}" in other.fix


def test_python_gpus_and_account() -> None:
    found = by_name(judge(report(python="3.12.1", gpus=[]),
                          reference(python="3.11.9", require_gpu=True,
                                    service_account="beamflow")))  # fmt: skip
    assert found["worker Python"].outcome == "fail" and "3.11" in found["worker Python"].fix
    assert found["worker GPUs"].outcome == "fail"  # device = cuda: a CPU worker is wrong
    assert found["worker user"].outcome == "warn" and "'beamflow'" in found["worker user"].detail
    gpus = by_name(judge(report(gpus=["GPU 0: NVIDIA A100 (UUID: GPU-1)"],
                                cuda_visible_devices="0"), reference()))["worker GPUs"]  # fmt: skip
    assert gpus.outcome == "ok" and "A100" in gpus.detail
    assert "CUDA_VISIBLE_DEVICES=0" in gpus.detail
    unknown = by_name(judge(report(), reference(globus_compute_endpoint=None)))
    assert unknown["worker globus-compute-endpoint"].outcome == "warn"


# -- Globus Compute, at the SDK boundary ----------------------------------------------------------

def globus_setup(tmp_path: Path, *, endpoint_version: str = GCE, resources: str = ""):
    meta = load_response(globus_sdk.ComputeClientV3.submit).metadata
    load_response(globus_sdk.ComputeClientV3.register_function)
    settings = make_settings(tmp_path)
    config = settings.source
    config.write_text(config.read_text().replace(settings.compute.endpoint_id,
                                                 meta["endpoint_id"]) + resources)  # fmt: skip
    settings = load_config(config)
    store_tokens(settings)
    schema = json.loads((DEPLOY / "slurm-gpu" / "user_config_schema.json").read_text())
    register("compute", f"/v2/endpoints/{meta['endpoint_id']}",
             {"uuid": meta["endpoint_id"], "endpoint_version": endpoint_version,
              "python_version": platform.python_version(), "multi_user": True,
              "user_config_schema": schema})  # fmt: skip
    # The worker's answer: this machine's real report, as the service hands results back.
    answer = probe_worker(str(settings.hpc.scratch_dir))
    register("compute", f"/v2/tasks/{meta['task_id']}",
             {"task_id": meta["task_id"], "status": "success", "completion_t": "1.0",
              "result": ComputeSerializer().serialize(answer)})  # fmt: skip
    return settings, config, meta


@pytest.mark.usefixtures("mocked")
def test_the_probe_goes_through_globus_compute_and_passes(tmp_path: Path, mocked) -> None:
    settings, _config, meta = globus_setup(tmp_path)
    checks = by_name(check_endpoint_workers(settings, timeout=5, poll_seconds=0))
    assert checks["worker probe"].outcome == "ok", checks["worker probe"]
    assert meta["endpoint_id"] in checks["worker probe"].detail
    assert checks["worker globus-compute-endpoint"].outcome == "ok"
    assert f"endpoint {meta['endpoint_id']}" in checks["worker globus-compute-endpoint"].detail
    assert checks["worker beamflow"].outcome == "ok" and checks["worker scratch"].outcome == "ok"
    # The probe was registered as its source text, runs where it is deserialised (the
    # endpoint's way), and was submitted with the scratch directory.
    (registered,) = [c for c in mocked.calls if c.request.url.endswith("/v3/functions")]
    serde = ComputeSerializer()
    (buffer,) = serde.unpack_buffers(json.loads(registered.request.body)["function_code"])
    assert buffer.startswith("st\n")  # source text: exec'd in an empty namespace
    shipped = serde.deserialize(buffer)
    assert WorkerReport.model_validate(shipped(None)).python == platform.python_version()
    (submit,) = [c for c in mocked.calls if c.request.url.endswith("/submit")]
    (payload,) = json.loads(submit.request.body)["tasks"][meta["function_id"]]
    _args, kwargs = (serde.deserialize(b) for b in serde.unpack_buffers(payload))
    assert kwargs == {"scratch_dir": str(settings.hpc.scratch_dir)}
    assert Registry(settings.registry_path, "globus").require_id("function", PROBE) == \
        meta["function_id"]  # fmt: skip
    # Once registered, a second probe only checks the function is still there.
    register("compute", f"/v2/functions/{meta['function_id']}", {"function_uuid": "x"})
    again = by_name(check_endpoint_workers(settings, timeout=5, poll_seconds=0))
    assert again["worker probe"].outcome == "ok"
    assert len([c for c in mocked.calls if c.request.url.endswith("/v3/functions")]) == 1


@pytest.mark.usefixtures("mocked")
def test_an_endpoint_of_another_version_fails_the_doctor(tmp_path: Path, monkeypatch) -> None:
    _settings, config, _meta = globus_setup(tmp_path, endpoint_version="4.18.2")
    monkeypatch.setattr("beamflow.globus.compute.time.sleep", lambda s: None)
    from beamflow.globus import doctor

    monkeypatch.setattr(doctor, "run_checks", lambda settings: [])  # the probe alone
    result = CliRunner().invoke(app, ["doctor", "--probe", "--probe-timeout", "5", "--json",
                                      "--config", str(config)])  # fmt: skip
    assert result.exit_code == 1
    gce = checks_of(result)["worker globus-compute-endpoint"]
    assert gce["outcome"] == "fail" and "4.18.2" in gce["detail"]
    assert f"globus-compute-endpoint=={GCE}" not in gce["fix"]  # install the endpoint's
    assert "globus-compute-endpoint==4.18.2" in gce["fix"]


@pytest.mark.usefixtures("mocked")
def test_a_probe_that_never_answers_says_where_to_look(tmp_path: Path, monkeypatch) -> None:
    meta = load_response(globus_sdk.ComputeClientV3.submit).metadata
    settings, _config, _ = globus_setup(tmp_path)
    import responses

    responses.replace(responses.GET, f"https://compute.api.globus.org/v2/tasks/{meta['task_id']}",
                      json={"task_id": meta["task_id"], "status": "waiting-for-ep"})  # fmt: skip
    checks = check_endpoint_workers(settings, timeout=0.01, poll_seconds=0.02)
    (probe,) = checks
    assert probe.outcome == "fail" and "no result within" in probe.detail
    assert "endpoint.log" in probe.fix


@pytest.mark.usefixtures("mocked")
def test_resources_the_endpoint_template_refuses_fail_the_probe(tmp_path: Path) -> None:
    settings, _config, _meta = globus_setup(
        tmp_path, resources='\n[cluster.preview]\nqueue = "debug"\n'
        '[cluster.final]\npartition = "long"\nwalltime = "08:00:00"\n')  # fmt: skip
    checks = by_name(check_endpoint_workers(settings, timeout=5, poll_seconds=0))
    preview = checks["cluster.preview"]  # a PBS variable sent to a Slurm endpoint
    assert preview.outcome == "fail" and "'queue'" in preview.detail
    assert "partition" in preview.fix and "walltime" in preview.fix
    assert checks["cluster.final"].outcome == "ok"


@pytest.mark.usefixtures("mocked")
def test_as_the_agent_the_probe_goes_with_the_final_resources_and_the_mapped_account(
        tmp_path: Path, mocked, monkeypatch) -> None:
    """`doctor --probe --as-agent`: the agent's client credentials, [cluster.final] as the
    task's user_endpoint_config, and the worker must run as the service account."""
    me = pwd.getpwuid(os.getuid()).pw_name
    monkeypatch.setenv("BEAMFLOW_GLOBUS__CLIENT_SECRET", "s3cret")
    settings, _config, meta = globus_setup(
        tmp_path, resources=f'\n[cluster]\nservice_account = "{me}"\n'
        '[cluster.final]\npartition = "long"\nwalltime = "08:00:00"\n')  # fmt: skip
    checks = by_name(check_endpoint_workers(settings, timeout=5, poll_seconds=0, as_agent=True))
    assert checks["worker probe"].outcome == "ok"
    assert "as the agent's client" in checks["worker probe"].detail
    assert checks["worker user"].outcome == "ok"
    (submit,) = [c for c in mocked.calls if c.request.url.endswith("/submit")]
    sent = json.loads(submit.request.body)
    assert sent["user_endpoint_config"] == {"partition": "long", "walltime": "08:00:00"}
    other = settings.model_copy(deep=True)
    other.cluster.service_account = "beamflow-svc"
    register("compute", f"/v2/functions/{meta['function_id']}", {"function_uuid": "x"})
    again = check_endpoint_workers(other, timeout=5, poll_seconds=0, as_agent=True)
    user = by_name(again)["worker user"]
    assert user.outcome == "fail" and "'beamflow-svc'" in user.detail  # not a warning now
