"""`beamflow runs start --direct`: the reconstruct function submitted to the Compute endpoint
without a flow, polled over HTTPS, against globus-sdk's recorded Compute responses."""

from __future__ import annotations

import json

import globus_sdk
import pytest
from globus_compute_sdk.serialize import ComputeSerializer
from globus_sdk.testing import load_response
from globus_testkit import make_settings, register, store_tokens
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.registry import Registry, function_checksum
from beamflow.runs.store import Store
from beamflow.simulate import simulate_scan

runner = CliRunner()


# Every request goes to `responses` (the `mocked` fixture in conftest.py), never the network.
pytestmark = pytest.mark.usefixtures("mocked")


def setup(tmp_path):
    meta = load_response(globus_sdk.ComputeClientV3.submit).metadata
    settings = make_settings(tmp_path)
    config = settings.source
    config.write_text(config.read_text().replace(settings.compute.endpoint_id,
                                                 meta["endpoint_id"]))  # the fixture's
    settings.compute.endpoint_id = meta["endpoint_id"]
    store_tokens(settings)
    Registry(settings.registry_path, "globus").record(
        "function", "reconstruct", meta["function_id"], function_checksum("reconstruct")
    )
    master = simulate_scan(settings.beamline.detector_dir, "s1", positions=12, probe_size=16)
    return settings, config, master, meta


def task_doc(task_id: str, **fields) -> dict:
    return {"task_id": task_id, **fields}


def test_direct_run_submits_the_shared_fs_arguments_and_records_the_result(
    tmp_path, mocked, monkeypatch
):
    import beamflow.globus.compute as compute

    slept = []
    monkeypatch.setattr(compute.time, "sleep", slept.append)  # the poll interval, not waited
    settings, config, master, meta = setup(tmp_path)
    summary = {"iterations": 7, "product": str(tmp_path / "p.h5"), "previews": []}
    result = ComputeSerializer().serialize(summary)
    path = f"/v2/tasks/{meta['task_id']}"
    register("compute", path, task_doc(meta["task_id"], status="waiting-for-ep"))
    register("compute", path, task_doc(meta["task_id"], status="success", result=result,
                                       completion_t="1.0"))

    out = runner.invoke(app, ["runs", "start", str(master.parent), "--direct", "--json",
                              "-c", str(config)])
    assert out.exit_code == 0, out.output
    run = json.loads(out.stdout)
    assert run["status"] == "SUCCEEDED" and run["flow"] == "ptycho_shared_fs"
    assert run["iteration"] == 7 and run["product"] == summary["product"]
    assert [s["name"] for s in run["steps"]] == ["Reconstruct"]

    (submit,) = [c for c in mocked.calls if c.request.url.endswith("/submit")]
    body = json.loads(submit.request.body)
    (payload,) = body["tasks"][meta["function_id"]]
    serde = ComputeSerializer()
    _args, kwargs = (serde.deserialize(b) for b in serde.unpack_buffers(payload))
    assert set(kwargs) == {"scan_path", "output_dir", "checkpoint_dir", "node_local_dir",
                           "allowed_roots", "run_name", "parameters"}
    assert kwargs["scan_path"].endswith("s1") or kwargs["scan_path"].endswith("s1_master.h5")
    assert kwargs["parameters"]["algorithm"] == settings.reconstruction.algorithm
    polls = [c for c in mocked.calls if c.request.url.endswith(path)]
    assert len(polls) == 2 and slept == [5.0]  # pending, one poll interval, then done


def test_a_failing_function_fails_the_run_with_its_cause(tmp_path, mocked):
    settings, config, master, meta = setup(tmp_path)
    register("compute", f"/v2/tasks/{meta['task_id']}",
             task_doc(meta["task_id"], status="failed", exception="ValueError: no positions",
                      completion_t="1.0"))
    out = runner.invoke(app, ["runs", "start", str(master.parent), "--direct", "--json",
                              "-c", str(config)])
    assert out.exit_code == 1
    run = json.loads(out.stdout)
    assert run["status"] == "FAILED" and run["error_step"] == "Reconstruct"
    assert "no positions" in run["error"]
    assert Store(settings.store_path).count_runs(status="FAILED") == 1


def test_direct_needs_the_globus_backend(tmp_path):
    result = runner.invoke(app, ["init", str(tmp_path / "ws")])
    assert result.exit_code == 0
    out = runner.invoke(app, ["runs", "start", str(tmp_path), "--direct", "-c",
                              str(tmp_path / "ws" / "beamflow.toml")])
    assert out.exit_code == 2 and "globus" in out.output


def test_a_direct_run_sends_the_final_resources_to_the_endpoint(tmp_path, mocked):
    settings, config, master, meta = setup(tmp_path)
    config.write_text(config.read_text() + '\n[cluster.final]\npartition = "long"\n'
                      'walltime = "08:00:00"\n')  # fmt: skip
    register("compute", f"/v2/tasks/{meta['task_id']}",
             task_doc(meta["task_id"], status="success", completion_t="1.0",
                      result=ComputeSerializer().serialize({"iterations": 1, "previews": []})))
    out = runner.invoke(app, ["runs", "start", str(master.parent), "--direct", "--json",
                              "-c", str(config)])
    assert out.exit_code == 0, out.output
    (submit,) = [c for c in mocked.calls if c.request.url.endswith("/submit")]
    body = json.loads(submit.request.body)
    assert body["user_endpoint_config"] == {"partition": "long", "walltime": "08:00:00"}
