"""beamflow.job: the job end to end, checkpoints, exact resume, continuation, refusal."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from job_kit import scan_with_its_probe

from beamflow.checkpoint import IncompatibleCheckpoint, list_checkpoints, load_latest
from beamflow.formats import ScanFormatError, read_product
from beamflow.ground_truth import read_ground_truth, score_product
from beamflow.job.live_previews import LivePreviews
from beamflow.job.models import ReconstructJob
from beamflow.job.run import run_reconstruction
from beamflow.ptycho.algorithms import opr as opr_module
from beamflow.ptycho.arrays import cpu_ffts
from beamflow.ptycho.quality import previews as previews_module
from beamflow.ptycho.quality.previews import PREVIEW_NAMES

N_POS = 40


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("detector")
    return scan_with_its_probe(root, "s", positions=N_POS, probe_size=32, photons=2e5, seed=3,
                               frames_per_file=10)


def job(scan: Path, out: Path, **kw) -> ReconstructJob:
    base = dict(scan=scan, out=out, device="cpu", threads=2, iterations=6, batch=8,
                checkpoint_every=1, preview_every=0, probe=scan.parent.parent / "probe.npy")
    base.update(kw)
    return ReconstructJob(**base)


def product_arrays(out: Path) -> dict[str, np.ndarray]:
    p = read_product(out / "product.h5")
    return {"object": p.object, "probe": p.probe, "loss": p.loss_values,
            "x": p.probe_position_x_m, "y": p.probe_position_y_m}


class Crash(Exception):
    pass


def crash_at(k: int):
    def progress(done, total, loss):
        if done == k:
            raise Crash(f"simulated crash at iteration {k}")
    return progress


def test_fresh_run_writes_product_previews_checkpoints(scan: Path, tmp_path: Path) -> None:
    s = run_reconstruction(job(scan, tmp_path, iterations=12))
    assert s.iterations == 12 and s.iterations_this_run == 12 and s.n_frames == N_POS
    assert s.resumed_from_iteration is None and not s.continuation
    assert s.device == "cpu" and s.seconds_per_iteration > 0
    assert s.fft == cpu_ffts()[0]  # FFTW where the fftw extra is installed
    assert Path(s.product) == tmp_path / "product.h5"
    assert sorted(Path(p).name for p in s.previews) == [
        "convergence.png", "object_amplitude.png", "object_phase.png", "object_phase_full.png",
        "probe.png"]
    assert all(Path(p).parent == tmp_path / "previews" for p in s.previews)
    ck = load_latest(tmp_path / "checkpoints")
    assert ck.iteration == 12 and Path(s.checkpoint) == ck.path
    assert ck.meta["state"]["iteration"] == 12
    # algorithm "auto" (the default) is rPIE in the far field, and says so everywhere
    assert ck.fingerprint["hard"]["algorithm"] == "rpie"
    assert s.algorithm == "rpie" and s.parameters["algorithm"] == "rpie"
    assert ck.fingerprint["data"]["n"] == N_POS
    p = read_product(tmp_path / "product.h5")
    assert p.object.dtype == np.complex64 and len(p.loss_values) == 12
    assert p.loss_values[-1] < p.loss_values[0]
    # the reconstruction is of this scan, in the product's coordinates
    gt = read_ground_truth(scan.parent / "ground_truth.h5")
    assert score_product(p, gt).nrmse < 0.3


def test_exact_resume_is_bit_identical(scan: Path, tmp_path: Path) -> None:
    straight, crashed = tmp_path / "a", tmp_path / "b"
    run_reconstruction(job(scan, straight, iterations=8))
    with pytest.raises(Crash):
        run_reconstruction(job(scan, crashed, iterations=8), progress=crash_at(5))
    assert not (crashed / "product.h5").exists()
    s = run_reconstruction(job(scan, crashed, iterations=8))
    assert s.resumed_from_iteration is not None and 1 <= s.resumed_from_iteration <= 5
    assert s.iterations == 8 and s.iterations_this_run == 8 - s.resumed_from_iteration
    a, b = product_arrays(straight), product_arrays(crashed)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_resume_when_already_done_runs_nothing(scan: Path, tmp_path: Path) -> None:
    run_reconstruction(job(scan, tmp_path, iterations=4))
    before = product_arrays(tmp_path)
    s = run_reconstruction(job(scan, tmp_path, iterations=4))
    assert s.resumed_from_iteration == 4 and s.iterations_this_run == 0 and s.iterations == 4
    np.testing.assert_array_equal(product_arrays(tmp_path)["object"], before["object"])


def test_more_frames_of_the_same_scan_continue(scan: Path, tmp_path: Path) -> None:
    first = run_reconstruction(job(scan, tmp_path, iterations=5, max_frames=N_POS // 2))
    assert first.n_frames == N_POS // 2
    half = read_product(tmp_path / "product.h5")
    s = run_reconstruction(job(scan, tmp_path, iterations=4))
    assert s.continuation and s.resumed_from_iteration == 5
    assert s.n_frames == N_POS and s.iterations == 9  # 4 more over the new data
    p = read_product(tmp_path / "product.h5")
    assert len(p.probe_position_x_m) == N_POS and len(p.loss_values) == 9
    # the history goes on from the first half's, and so do its positions (same frame)
    np.testing.assert_array_equal(p.loss_values[:5], half.loss_values)
    np.testing.assert_allclose(p.probe_position_x_m[: N_POS // 2], half.probe_position_x_m,
                               rtol=0, atol=1e-12)
    # killed during the continuation, it resumes the continuation (not a fresh start)
    with pytest.raises(Crash):
        run_reconstruction(job(scan, tmp_path, iterations=8), progress=crash_at(11))
    s = run_reconstruction(job(scan, tmp_path, iterations=8))
    assert not s.continuation and s.iterations == 5 + 8


def test_hard_mismatch_is_refused_naming_each_difference(scan: Path, tmp_path: Path) -> None:
    run_reconstruction(job(scan, tmp_path, iterations=2))
    with pytest.raises(IncompatibleCheckpoint) as ei:
        run_reconstruction(job(scan, tmp_path, algorithm="dm", probe_modes=2))
    msg = str(ei.value)
    assert "algorithm: stored 'rpie' vs current 'dm'" in msg
    assert "probe_modes: stored 1 vs current 2" in msg
    assert "--no-resume" in msg
    # nothing was overwritten by the refused run
    assert load_latest(tmp_path / "checkpoints").iteration == 2


def test_fewer_frames_are_refused(scan: Path, tmp_path: Path) -> None:
    run_reconstruction(job(scan, tmp_path, iterations=2))
    with pytest.raises(IncompatibleCheckpoint, match="fewer items"):
        run_reconstruction(job(scan, tmp_path, max_frames=N_POS - 5))


def test_soft_changes_are_logged_and_allowed(scan: Path, tmp_path: Path, caplog) -> None:
    run_reconstruction(job(scan, tmp_path, iterations=2))
    with caplog.at_level(logging.INFO, logger="beamflow.job"):
        s = run_reconstruction(job(scan, tmp_path, iterations=4, batch=4))
    assert s.resumed_from_iteration == 2
    assert "batch_size: stored 8 vs current 4" in caplog.text


def test_no_resume_starts_over(scan: Path, tmp_path: Path) -> None:
    run_reconstruction(job(scan, tmp_path, iterations=3))
    s = run_reconstruction(job(scan, tmp_path, iterations=2, resume=False, algorithm="epie"))
    assert s.resumed_from_iteration is None and s.iterations == 2
    assert [it for it, _ in list_checkpoints(tmp_path / "checkpoints")] == [2, 1]


def test_l1_and_l2_levels(scan: Path, tmp_path: Path) -> None:
    s = run_reconstruction(job(scan, tmp_path / "out", iterations=6, checkpoint_every=3,
                               l1_dir=tmp_path / "local", l1_every=1))
    (l1,) = list((tmp_path / "local").iterdir())
    assert load_latest(l1).iteration == 6
    assert {it for it, _ in list_checkpoints(tmp_path / "out" / "checkpoints")} <= {3, 6}
    # the node-local copy is the newest: after losing L2's newest file, L1 is used
    Path(s.checkpoint).unlink()
    (tmp_path / "out" / "checkpoints" / "LATEST.json").unlink()
    s2 = run_reconstruction(job(scan, tmp_path / "out", iterations=7,
                                l1_dir=tmp_path / "local"))
    assert s2.resumed_from_iteration == 6


def test_broken_l2_keeps_reconstructing_and_reports(scan: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the checkpoint directory should be")
    s = run_reconstruction(job(scan, tmp_path / "out", iterations=3, checkpoint_dir=blocker))
    assert s.iterations == 3 and (tmp_path / "out" / "product.h5").exists()
    assert s.checkpoint is None
    assert s.checkpoint_errors and str(blocker) in s.checkpoint_errors[0]


def test_bad_scan_names_the_file(tmp_path: Path, scan: Path) -> None:
    bad = tmp_path / "s"
    shutil.copytree(scan.parent, bad)
    (bad / "s_data_000002.h5").write_bytes(b"this is not HDF5")
    with pytest.raises(ScanFormatError, match="s_data_000002.h5"):
        run_reconstruction(job(bad / "s_master.h5", tmp_path / "out"))
    with pytest.raises(ScanFormatError, match="no such file"):
        run_reconstruction(job(tmp_path / "missing_master.h5", tmp_path / "out"))


def test_flat_compute_function_kwargs_are_accepted(tmp_path: Path, scan: Path) -> None:
    j = ReconstructJob(scan=scan, out=tmp_path, algorithm="lsqml", iterations=7, probe_modes=2,
                       batch=None, node_local_dir=tmp_path / "l1", aborted=True,
                       checkpoint_dir=tmp_path / "ck", name="run-1")
    assert j.params.algorithm == "lsqml" and j.params.iterations == 7
    assert j.params.probe_modes == 2 and j.l1_dir == tmp_path / "l1"
    assert j.allow_partial and j.l2_dir == tmp_path / "ck"
    json.dumps(j.model_dump(mode="json"))


def test_previews_from_the_latest_checkpoint_by_another_reader(scan: Path, tmp_path: Path) -> None:
    from beamflow.job.checkpoints import previews_from_checkpoint

    assert previews_from_checkpoint(tmp_path / "out" / "checkpoints", tmp_path / "p") is None
    run_reconstruction(job(scan, tmp_path / "out", iterations=3))
    files = previews_from_checkpoint(tmp_path / "out" / "checkpoints", tmp_path / "p")
    assert sorted(files) == sorted(PREVIEW_NAMES)
    assert all(p.stat().st_size > 1000 and p.parent == tmp_path / "p" for p in files.values())


def test_previews_are_drawn_around_the_probe_positions(
        scan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's final previews and those from a checkpoint get the positions, so the
    never-illuminated border is dimmed and the colour window is the illuminated region's."""
    from beamflow.job.checkpoints import previews_from_checkpoint

    seen: list[np.ndarray | None] = []
    real = previews_module.write_previews

    def spy(*args, **kwargs):
        seen.append(kwargs.get("positions_px"))
        return real(*args, **kwargs)

    monkeypatch.setattr(previews_module, "write_previews", spy)
    run_reconstruction(job(scan, tmp_path / "out", iterations=3, preview_every=0))
    previews_from_checkpoint(tmp_path / "out" / "checkpoints", tmp_path / "p")
    assert len(seen) == 2
    ck = load_latest(tmp_path / "out" / "checkpoints")
    for positions in seen:
        assert positions is not None and np.shape(positions) == (N_POS, 2)
        assert np.allclose(positions, ck.arrays["positions_px"])


def test_previews_command_renders_the_latest_checkpoint(scan: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from beamflow.cli import app

    runner = CliRunner()
    ck = tmp_path / "out" / "checkpoints"
    ck.mkdir(parents=True)
    empty = runner.invoke(app, ["previews", str(ck), "--out", str(tmp_path / "p")])
    assert empty.exit_code == 1 and "no verified checkpoint" in empty.output
    missing = runner.invoke(app, ["previews", str(tmp_path / "nope"), "--out", str(tmp_path)])
    assert missing.exit_code == 1 and "not a directory" in missing.output
    run_reconstruction(job(scan, tmp_path / "out", iterations=3))
    ok = runner.invoke(app, ["previews", str(ck), "--out", str(tmp_path / "p")])
    assert ok.exit_code == 0, ok.output
    assert sorted(p.name for p in (tmp_path / "p").glob("*.png")) == sorted(
        f"{name}.png" for name in PREVIEW_NAMES)


def test_live_previews_show_the_variable_probes_weights(
        scan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With opr_modes, every live state handed to the helper carries the weights of that
    iteration, and the helper draws probe_variation.png from them."""
    handed: list[tuple[LivePreviews, np.ndarray | None]] = []
    submit = LivePreviews.submit

    def recorded(self, *args, **kwargs):
        handed.append((self, kwargs.get("opr_weights")))
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(LivePreviews, "submit", recorded)
    monkeypatch.setattr(opr_module, "LEARNING_DELAY", 0)  # the weights change from the start
    run_reconstruction(job(scan, tmp_path, iterations=6, preview_every=2,
                           preview_min_seconds=0, checkpoint_every=0,
                           params={"algorithm": "rpie", "opr_modes": 2}))
    assert len(handed) == 2  # after iterations 2 and 4 (6 is the final previews')
    weights = [w for _, w in handed]
    assert all(w is not None and w.shape == (N_POS, 2) for w in weights)
    assert not np.array_equal(weights[0], weights[1])  # each iteration's own
    live = handed[0][0]
    assert live.drawn >= 1 and live.errors == [], live.errors
    assert live.files["probe_variation"].name == "probe_variation.png"


def test_live_previews_are_drawn_by_the_helper_during_the_run(
        scan: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With live previews on, the job hands its states to the helper (whose drawings are
    the previews until the final ones), waits for none of them, and leaves no bundle."""
    with caplog.at_level(logging.INFO, logger="beamflow.job.live_previews"):
        s = run_reconstruction(job(scan, tmp_path, iterations=8, preview_every=2,
                                   preview_min_seconds=0))
    drawn = [r.getMessage() for r in caplog.records if "drawn by the helper" in r.getMessage()]
    assert len(drawn) == 1 and int(drawn[0].split()[2]) >= 1, drawn
    names = {Path(p).name for p in s.previews}
    assert names == {f"{name}.png" for name in PREVIEW_NAMES}
    assert not any(p.name.startswith(".live-preview") for p in (tmp_path / "previews").iterdir())
