"""Answers that name their cause: a diverged run says what the data suggest, a near field
without a focus distance says what to give and why, lengths read in sensible units, and
`--strict` turns a suspect result into exit status 2 for scripts (the product is written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.formats import read_product
from beamflow.formats.cxi import write_cxi
from beamflow.job.models import ReconstructJob, length_text
from beamflow.job.run import run_reconstruction
from beamflow.ptycho.engine import Reconstructor
from beamflow.simulate import detector_frames, make_near_field_ground_truth, simulate_scan


@pytest.fixture(scope="module")
def holograms(tmp_path_factory) -> Path:
    """A near-field cone-beam scan as CXI, which records no focus distance."""
    gt = make_near_field_ground_truth(positions=40, probe_size=32, photons=1e7, seed=1)
    frames = detector_frames(gt, 0, gt.n_positions, np.random.default_rng(5))
    root = tmp_path_factory.mktemp("nf")
    assert gt.geometry.detector_pixel_size_m == pytest.approx(55e-6)
    return write_cxi(root / "nf.cxi", frames.astype(np.float32), gt.positions_m, gt.geometry,
                     gt.mask)


@pytest.fixture(scope="module")
def far_scan(tmp_path_factory) -> Path:
    return simulate_scan(tmp_path_factory.mktemp("ff"), "ff", positions=30, probe_size=32,
                         photons=2e5, seed=2, frames_per_file=30)


def job(scan: Path, out: Path, **kw) -> ReconstructJob:
    return ReconstructJob(scan=scan, out=out, device="cpu", threads=1, preview_every=0,
                          checkpoint_every=0, **kw)


@pytest.mark.parametrize(("metres", "text"), [
    (55e-6, "55 µm"), (179e-9, "179 nm"), (3.65e-3, "3.65 mm"), (1.12, "1.12 m"),
    (0.5e-9, "0.5 nm"), (999e-9, "999 nm"), (999.7e-9, "1 µm"), (1e-6, "1 µm"),
    (12.0, "12 m")])
def test_lengths_read_in_sensible_units(metres, text):
    assert length_text(metres) == text


def _diverge(monkeypatch):
    def run(self, n=None, callback=None):
        raise FloatingPointError("reconstruction diverged at iteration 3 (rpie): loss is inf")

    monkeypatch.setattr(Reconstructor, "run", run)


def test_a_divergence_names_the_regime_the_data_are_in(holograms, tmp_path, monkeypatch):
    _diverge(monkeypatch)
    with pytest.raises(FloatingPointError) as exc:
        run_reconstruction(job(holograms, tmp_path / "out", iterations=5))
    message = str(exc.value)
    assert message.startswith("reconstruction diverged at iteration 3 (rpie): loss is inf.")
    assert "near-field holograms" in message and "try --propagation near-field" in message


def test_a_divergence_in_the_right_regime_says_only_what_happened(far_scan, tmp_path,
                                                                  monkeypatch):
    _diverge(monkeypatch)
    with pytest.raises(FloatingPointError) as exc:
        run_reconstruction(job(far_scan, tmp_path / "out", iterations=5))
    assert str(exc.value) == "reconstruction diverged at iteration 3 (rpie): loss is inf"


def test_the_cli_and_the_compute_function_carry_the_cause(holograms, tmp_path, monkeypatch):
    _diverge(monkeypatch)
    result = CliRunner().invoke(app, ["reconstruct", str(holograms), "--out",
                                      str(tmp_path / "out"), "--iterations", "5",
                                      "--device", "cpu", "--config", str(_empty(tmp_path))])
    assert result.exit_code == 1
    assert "try --propagation near-field" in result.output

    from functions.reconstruct import reconstruct

    with pytest.raises(RuntimeError, match="try --propagation near-field"):
        reconstruct(scan_path=str(holograms), output_dir=str(tmp_path / "fn"),
                    allowed_roots=[str(holograms.parent), str(tmp_path)],
                    parameters={"iterations": 5, "device": "cpu"})


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "beamflow.toml"
    path.write_text("")
    return path


def test_near_field_without_a_focus_distance_names_the_option_and_why(holograms, tmp_path):
    summary = run_reconstruction(job(holograms, tmp_path / "parallel", iterations=3,
                                     propagation="near-field"))
    assert summary.object_pixel_size_m == pytest.approx(55e-6)
    [note] = [n for n in summary.notes if "--focus-distance" in n]
    assert "--focus-distance" in note and "(55 µm)" in note
    assert "detector pixel" in note and "magnifies" in note
    if summary.verdict == "suspect":
        assert note in summary.verdict_reasons

    cone = run_reconstruction(job(holograms, tmp_path / "cone", iterations=3,
                                  propagation="near-field", focus_distance_m=3.65e-3))
    assert not any("--focus-distance" in n for n in cone.notes), cone.notes
    assert cone.object_pixel_size_m < 1e-6

    result = CliRunner().invoke(app, ["reconstruct", str(holograms), "--out",
                                      str(tmp_path / "cli"), "--iterations", "2",
                                      "--propagation", "near-field", "--device", "cpu",
                                      "--preview-every", "0", "--config", str(_empty(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "object pixel 55 µm" in result.output
    assert "--focus-distance" in " ".join(result.output.split())


def test_strict_exits_2_on_a_suspect_result_and_still_writes_the_product(holograms, tmp_path):
    base = ["reconstruct", str(holograms), "--iterations", "4", "--device", "cpu",
            "--preview-every", "0", "--json", "--config", str(_empty(tmp_path))]
    # Far field on holograms: suspect (the regime check).
    lenient = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "a")])
    assert lenient.exit_code == 0
    assert json.loads(lenient.output.strip().splitlines()[-1])["verdict"] == "suspect"
    strict = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "b"), "--strict"])
    assert strict.exit_code == 2
    summary = json.loads(strict.output.strip().splitlines()[-1])
    assert summary["verdict"] == "suspect"
    assert read_product(tmp_path / "b" / "product.h5").verdict == "suspect"
    # ... and every preview of it says so in its title
    assert len(summary["previews"]) == 5
    for path in summary["previews"]:
        assert _png_text(Path(path))["Title"].startswith("SUSPECT"), path


def test_strict_exits_0_on_a_trusted_result(holograms, tmp_path):
    result = CliRunner().invoke(app, [
        "reconstruct", str(holograms), "--out", str(tmp_path / "ok"), "--iterations", "60",
        "--device", "cpu", "--preview-every", "0", "--json", "--strict",
        "--propagation", "near-field", "--focus-distance", "3.65e-3",
        "--config", str(_empty(tmp_path))])
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["verdict"] == "trusted", summary["verdict_reasons"]
    assert result.exit_code == 0
    previews = {Path(p).stem: _png_text(Path(p)) for p in summary["previews"]}
    assert not any("SUSPECT" in t["Title"] for t in previews.values())
    floor = summary["verdict_metrics"]["noise_floor"]
    assert f"noise floor {floor:.4g}" in previews["convergence"]["Description"]


def _png_text(path: Path) -> dict[str, str]:
    from PIL import Image

    with Image.open(path) as img:
        return dict(img.text)
