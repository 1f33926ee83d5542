"""A thick sample through the reconstruction job: `beamflow simulate --slices` data in,
a product of layers out (Ptychodus reads them), the layers' preview, checkpoints that resume
bit for bit and continue with more frames, and the thickness note of a one-layer run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from job_kit import scan_with_its_probe
from typer.testing import CliRunner

from beamflow.checkpoint import IncompatibleCheckpoint, load_latest
from beamflow.cli import app
from beamflow.formats import read_product
from beamflow.ground_truth import read_ground_truth, score_product_layers
from beamflow.job.checkpoints import previews_from_checkpoint
from beamflow.job.models import ReconstructJob
from beamflow.job.run import run_reconstruction

SPACING = 4e-4


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("thick")
    return scan_with_its_probe(root, "t", positions=60, probe_size=32, photons=3e5, seed=5,
                               frames_per_file=20, slices=2, slice_spacing_m=SPACING)


def job(scan: Path, out: Path, **kw) -> ReconstructJob:
    base = dict(scan=scan, out=out, device="cpu", threads=2, iterations=6, batch=8,
                checkpoint_every=1, preview_every=0, probe=scan.parent.parent / "probe.npy",
                slices=2, slice_spacing_m=SPACING)
    base.update(kw)
    return ReconstructJob(**base)


def test_a_thick_scan_gives_a_product_of_layers_and_continues_with_more_frames(
        scan: Path, tmp_path: Path) -> None:
    run_reconstruction(job(scan, tmp_path, iterations=3, max_frames=30))
    s = run_reconstruction(job(scan, tmp_path, iterations=8))
    assert s.continuation and s.n_frames == 60  # the layers continue, grown to fit
    assert "object_layers.png" in {Path(p).name for p in s.previews}
    p = read_product(tmp_path / "product.h5")
    assert p.object.shape[0] == 2 and list(p.object_layer_spacing_m) == [SPACING]
    from ptychodus.api.io import load_product

    assert load_product(tmp_path / "product.h5").object_.num_layers == 2
    scores = score_product_layers(p, read_ground_truth(scan.parent / "ground_truth.h5"))
    assert scores.projection_nrmse < 0.3  # a short run from the true probe
    assert s.verdict == "trusted", s.verdict_reasons
    previews = previews_from_checkpoint(tmp_path / "checkpoints", tmp_path / "drawn")
    assert "object_layers" in previews


def test_layers_resume_bit_for_bit(scan: Path, tmp_path: Path) -> None:
    straight, stopped = tmp_path / "a", tmp_path / "b"
    run_reconstruction(job(scan, straight, iterations=4))
    run_reconstruction(job(scan, stopped, iterations=2))
    s = run_reconstruction(job(scan, stopped, iterations=4))
    assert s.resumed_from_iteration == 2
    a, b = read_product(straight / "product.h5"), read_product(stopped / "product.h5")
    np.testing.assert_array_equal(a.object, b.object)
    np.testing.assert_array_equal(a.loss_values, b.loss_values)


def test_a_thin_checkpoint_is_not_resumed_as_layers(scan: Path, tmp_path: Path) -> None:
    run_reconstruction(job(scan, tmp_path, iterations=2, slices=1, slice_spacing_m=None))
    with pytest.raises(IncompatibleCheckpoint, match="slices"):
        run_reconstruction(job(scan, tmp_path, iterations=4))
    assert load_latest(tmp_path / "checkpoints").iteration == 2


def test_the_command_line_takes_the_layers(scan: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "reconstruct", str(scan), "--out", str(tmp_path / "r"), "--device", "cpu",
        "--iterations", "2", "--slices", "3", "--slice-spacing", "2e-4,2e-4", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert read_product(Path(summary["product"])).object.shape[0] == 3
    bad = CliRunner().invoke(app, [
        "reconstruct", str(scan), "--out", str(tmp_path / "x"), "--slices", "3",
        "--slice-spacing", "2e-4,2e-4,2e-4"])
    assert bad.exit_code != 0 and "need 2 slice spacings" in bad.output
