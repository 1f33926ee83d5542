"""The results transfer of flows/ptycho_reconstruct.json copies product.h5 and previews/
back: the compute function always leaves a previews/ directory (empty when no preview could
be drawn), so a run whose previews failed still brings its product home."""

from __future__ import annotations

from pathlib import Path

import pytest
from flow_kit import FUNCTION_ID, scan_workspace

import flows
from beamflow.job.models import ReconstructSummary
from beamflow.local.interpreter import FlowRunner
from beamflow.local.transfer import LocalTransferProvider
from beamflow.runs.flow_input import flow_input_for
from functions.reconstruct import reconstruct


@pytest.fixture
def settings(tmp_path: Path):  # noqa: ANN201
    return scan_workspace(tmp_path, master=b"raw")


def no_preview_reconstruction(monkeypatch) -> None:  # noqa: ANN001
    """A reconstruction that writes its product but no preview (drawing them failed)."""

    def run_reconstruction(job, progress):  # noqa: ANN001, ANN202
        (job.out / "product.h5").write_bytes(b"product")
        return ReconstructSummary(
            iterations=1, iterations_this_run=1, seconds_per_iteration=None, final_loss=0.1,
            device="cpu", fft="pocketfft", product=str(job.out / "product.h5"), previews=[],
            resumed_from_iteration=None, continuation=False, checkpoint=None,
            checkpoint_errors=[], n_frames=1, algorithm="rpie", seconds=0.1,
            object_pixel_size_m=1e-8, verdict="trusted", verdict_reasons=[], verdict_metrics={})

    monkeypatch.setattr("beamflow.job.run.run_reconstruction", run_reconstruction)


class FunctionProvider:
    """Compute, in this process: the real function with the flow's kwargs."""

    def start(self, body, context):  # noqa: ANN001, ANN201
        from beamflow.local.actions import ActionStatus

        (task,) = body["tasks"]
        result = reconstruct(**task["kwargs"])
        return ActionStatus(action_id="c1", status="SUCCEEDED", details={"result": [result]})

    def status(self, action_id):  # noqa: ANN001, ANN201  # pragma: no cover - never ACTIVE
        raise AssertionError

    def cancel(self, action_id):  # noqa: ANN001, ANN201  # pragma: no cover
        raise AssertionError


def test_a_run_without_previews_still_brings_its_product_back(settings, monkeypatch) -> None:  # noqa: ANN001
    no_preview_reconstruction(monkeypatch)
    body = flow_input_for(settings, settings.beamline.detector_dir / "s1", {}, "s1-r1",
                          function_id=FUNCTION_ID)  # fmt: skip
    transfer = LocalTransferProvider.from_settings(settings)
    try:
        runner = FlowRunner(
            flows.load_definition("ptycho_reconstruct"),
            {transfer.url: transfer, "https://compute.actions.globus.org/v3": FunctionProvider()},
            input_schema=flows.load_schema("ptycho_reconstruct"),
            poll_interval=0.05,  # real time: the local transfers copy in threads
            max_poll_interval=0.05,
        )
        result = runner.run(body)
    finally:
        transfer.close()
    assert result.status == "SUCCEEDED", result.output.get("failure")
    back = settings.beamline.preview_dir / "s1-r1"
    assert (back / "product.h5").read_bytes() == b"product"
    assert (back / "previews").is_dir() and list((back / "previews").iterdir()) == []


def test_the_function_leaves_an_empty_previews_directory(tmp_path: Path, monkeypatch) -> None:
    no_preview_reconstruction(monkeypatch)
    scan = tmp_path / "s1.cxi"
    scan.write_bytes(b"")
    out = tmp_path / "out"
    summary = reconstruct(scan_path=str(scan), output_dir=str(out), allowed_roots=[str(tmp_path)])
    assert summary["previews"] == [] and (out / "previews").is_dir()
