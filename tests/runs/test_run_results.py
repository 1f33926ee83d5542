"""What a flow run brings back, parsed once where it arrives: a running step's progress and
the reconstruct function's summary (product and previews where the flow put them, the
iterations, the verdict), through the shared run path."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from runs_kit import QuietRunBackend
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.config import Settings, load_config
from beamflow.registry import Registry, register_functions
from beamflow.runs.backend import FlowRunInfo, StepInfo
from beamflow.runs.lifecycle import start_scan_run, sync_run
from beamflow.runs.records import RunStatus
from beamflow.runs.request import RunRequest
from beamflow.runs.store import Store


class OneRunBackend(QuietRunBackend):
    """A backend whose one run says what the test puts in ``info``."""

    def __init__(self) -> None:
        self.info: FlowRunInfo | None = None

    def start_run(self, flow: str, body: dict, *, label: str, tags: list[str]) -> str:
        self.info = FlowRunInfo(backend_run_id="b1", status=RunStatus.ACTIVE)
        return "b1"

    def get_run(self, backend_run_id: str) -> FlowRunInfo:
        assert self.info is not None
        return self.info


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    assert CliRunner().invoke(app, ["init", str(tmp_path / "ws")]).exit_code == 0
    settings = load_config(tmp_path / "ws" / "beamflow.toml")
    register_functions(Registry(settings.registry_path, "local"),
                       create=lambda name: str(uuid.uuid4()),
                       update=lambda name, function_id: function_id)  # fmt: skip
    return settings


def started(settings: Settings, backend: OneRunBackend):  # noqa: ANN201
    scan = Path(settings.beamline.detector_dir) / "s1"
    scan.mkdir(parents=True)
    (scan / "s1_master.h5").write_bytes(b"")  # a scan directory (never read here)
    store = Store(settings.store_path)
    run = start_scan_run(settings, store, backend, RunRequest(scan_path=scan))
    assert run.status == RunStatus.ACTIVE
    return store, run


def test_progress_is_read_from_the_running_step(settings: Settings) -> None:
    backend = OneRunBackend()
    store, run = started(settings, backend)
    step = StepInfo(name="Reconstruct", status="ACTIVE", started_at=1.0,
                    details={"type": "Action", "iteration": 12, "iterations_total": 40,
                             "loss": 0.5})  # fmt: skip
    backend.info = FlowRunInfo(backend_run_id="b1", status=RunStatus.ACTIVE, steps=[step])
    run = sync_run(store, backend, run)
    assert (run.current_step, run.iteration, run.iterations_total) == ("Reconstruct", 12, 40)
    # Details that are not progress (a negative count, text) are no progress at all.
    for details in ({"iteration": -1}, {"iteration": "twelve"}, {"type": "Action"}):
        assert StepInfo(name="x", status="ACTIVE", details=details).progress is None


def test_the_summary_gives_product_previews_iterations_and_verdict(settings: Settings) -> None:
    backend = OneRunBackend()
    store, run = started(settings, backend)
    results = Path(run.result["results_dir"])
    (results / "previews").mkdir(parents=True)
    (results / "product.h5").write_bytes(b"h5")
    (results / "previews" / "object_phase.png").write_bytes(b"png")
    summary = {"iterations": 40, "product": "/hpc/x/product.h5", "product_relative": "product.h5",
               "previews_relative": ["previews/object_phase.png", "previews/probe.png"],
               "verdict": "suspect", "verdict_reasons": ["the probe collapsed"],
               "host": "gpu-node-7"}  # fmt: skip
    output = {"reconstruct": {"status": "SUCCEEDED", "details": {"result": [summary]}}}
    backend.info = FlowRunInfo(backend_run_id="b1", status=RunStatus.SUCCEEDED, output=output)
    run = sync_run(store, backend, run)
    assert run.status == RunStatus.SUCCEEDED
    assert run.product == str(results / "product.h5")
    assert run.previews == [str(results / "previews/object_phase.png")]  # probe never came
    assert (run.iteration, run.iterations_total) == (40, 40)
    assert (run.verdict, run.verdict_reasons) == ("suspect", ["the probe collapsed"])
    assert run.result["summary"]["host"] == "gpu-node-7"  # a newer function's field is kept


def test_a_summary_that_is_not_one_is_no_summary(settings: Settings) -> None:
    backend = OneRunBackend()
    store, run = started(settings, backend)
    output = {"reconstruct": {"details": {"results": [{"output": {"iterations": "many"}}]}}}
    backend.info = FlowRunInfo(backend_run_id="b1", status=RunStatus.SUCCEEDED, output=output)
    run = sync_run(store, backend, run)
    assert run.status == RunStatus.SUCCEEDED
    assert (run.product, run.verdict, run.result["summary"]) == (None, None, None)


def test_what_the_compute_function_returns_is_a_function_summary(tmp_path: Path) -> None:
    """The contract between functions/reconstruct.py and the run path, on a real (small)
    reconstruction: every field the run path reads comes back, typed."""
    from beamflow.job.models import FunctionSummary
    from beamflow.simulate import simulate_scan
    from functions.reconstruct import reconstruct

    master = simulate_scan(tmp_path / "hpc" / "raw", "s1", positions=40, probe_size=32)
    out = tmp_path / "hpc" / "runs" / "r1"
    answer = reconstruct(scan_path=str(master.parent), output_dir=str(out),
                         allowed_roots=[str(tmp_path / "hpc")], run_name="r1",
                         parameters={"iterations": 2, "preview_every": 0, "device": "cpu"})
    summary = FunctionSummary.model_validate(answer)
    assert summary.model_dump(include=set(answer)) == answer  # nothing lost or reshaped
    assert (summary.iterations, summary.run_name) == (2, "r1")
    assert summary.verdict in ("trusted", "suspect")
    assert (out / summary.product_relative).is_file()
    assert summary.previews_relative and all((out / p).is_file()
                                             for p in summary.previews_relative)
