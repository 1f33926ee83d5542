"""The beamline simulator: determinism, physics, Eiger-style files, frames appearing over time."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

import beamflow.simulate as sim
from beamflow.formats import load_scan, scan_progress
from beamflow.formats.eiger import data_file_name
from beamflow.ground_truth import read_ground_truth
from beamflow.simulate import diffraction, make_ground_truth, model_intensities, simulate_scan

N, M, K, PHOTONS = 48, 32, 16, 2e5


@pytest.fixture(scope="module")
def scan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simulate_scan(tmp_path_factory.mktemp("a"), "s", positions=N, probe_size=M,
                         photons=PHOTONS, seed=11, frames_per_file=K)  # fmt: skip


def h5_datasets(path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    with h5py.File(path) as f:
        f.visititems(
            lambda k, v: out.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None
        )
    return out


def test_same_seed_same_files_other_seed_other_data(scan, tmp_path):
    again = simulate_scan(tmp_path / "b", "s", positions=N, probe_size=M, photons=PHOTONS,
                          seed=11, frames_per_file=K)  # fmt: skip
    names = sorted(p.name for p in scan.parent.iterdir())
    assert names == sorted(p.name for p in again.parent.iterdir())
    assert names == ["ground_truth.h5", "s_data_000001.h5", "s_data_000002.h5",
                     "s_data_000003.h5", "s_master.h5"]  # fmt: skip
    for name in names:
        a, b = h5_datasets(scan.parent / name), h5_datasets(again.parent / name)
        assert a.keys() == b.keys(), name
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name}:{key}")
    other = simulate_scan(tmp_path / "c", "s", positions=N, probe_size=M, photons=PHOTONS,
                          seed=12, frames_per_file=K)  # fmt: skip
    assert not np.array_equal(load_scan(other).frames(), load_scan(scan).frames())


def test_ground_truth_file_matches_make_ground_truth(scan):
    gt = read_ground_truth(scan.parent)
    ref = make_ground_truth(N, M, PHOTONS, seed=11)
    for key in ("object", "probe", "positions_px", "positions_m", "nominal_positions_m",
                "pixel_mask"):  # fmt: skip
        np.testing.assert_array_equal(getattr(gt, key), getattr(ref, key), err_msg=key)
    assert gt.object_pixel_size_m == ref.object_pixel_size_m == load_scan(scan).object_pixel_size_m
    assert gt.geometry == ref.geometry


def test_physically_sensible_sample_probe_and_scan():
    gt = make_ground_truth(200, 64, 1e6, seed=0)
    amp, phase = np.abs(gt.object), np.angle(gt.object)
    assert 0.68 < amp.min() < 0.85 and amp.max() <= 1.0 + 1e-6
    assert 1.0 < phase.max() < 2.2 and phase.min() >= 0
    assert 20e-9 < gt.object_pixel_size_m < 100e-9  # tens of nanometres
    # the probe fits its window: little power near the edges, none of it a plain Gaussian
    p = np.abs(gt.probe) ** 2
    border = p.copy()
    border[8:-8, 8:-8] = 0
    assert border.sum() < 0.03 * p.sum()
    # sub-pixel positions with jitter of ~10 nm about the planned ones, all inside the object
    frac = gt.positions_px - np.floor(gt.positions_px)
    assert 0.2 < frac.std() < 0.4
    jitter = (gt.positions_m - gt.nominal_positions_m).std()
    assert 5e-9 < jitter < 15e-9
    assert (gt.positions_px >= 0).all()
    assert (gt.positions_px + 64 <= np.array(gt.object.shape)).all()
    # Fermat spiral at ~75 % overlap: nearest neighbours ≈ a quarter of the probe diameter
    c = gt.positions_m / gt.object_pixel_size_m
    d = np.hypot(*(c[:, None] - c[None]).transpose(2, 0, 1))
    np.fill_diagonal(d, np.inf)
    nn = np.median(d.min(axis=1))
    assert 0.15 * 0.45 * 64 < nn < 0.35 * 0.45 * 64


def test_counts_match_the_photon_setting(scan):
    gt = read_ground_truth(scan)
    model = model_intensities(gt)
    # the probe is scaled so the mean model counts per frame are the photon setting
    assert model.sum(axis=(1, 2)).mean() == pytest.approx(PHOTONS, rel=1e-4)
    frames = load_scan(scan).frames()
    valid = gt.mask
    measured, expected = frames[:, valid].sum(), model[:, valid].sum()
    assert abs(measured - expected) < 5 * np.sqrt(expected)  # Poisson: σ = √mean
    assert frames[:, valid].sum(axis=1).mean() == pytest.approx(PHOTONS, rel=0.05)


def test_ground_truth_reproduces_frames_within_poisson_noise(scan):
    gt = read_ground_truth(scan)
    frames = load_scan(scan).frames()
    model = model_intensities(gt)
    sel = (model >= 5) & gt.mask[None]
    chi2 = ((frames - model) ** 2 / model)[sel].mean()
    assert chi2 == pytest.approx(1.0, abs=0.05), chi2
    # and a forward model one pixel off does not
    shifted = diffraction(gt.object, gt.probe, gt.positions_px + [0.0, 1.0])
    assert ((frames - shifted) ** 2 / shifted)[sel].mean() > 1.5


def test_bad_pixels_dead_zero_hot_bright_all_flagged(scan):
    gt = read_ground_truth(scan)
    frames = load_scan(scan).frames()
    dead = (gt.pixel_mask & 2) != 0
    hot = (gt.pixel_mask & 8) != 0
    assert dead.any() and hot.any() and not (dead & hot).any()
    assert (frames[:, dead] == 0).all()
    assert (frames[:, hot].mean(axis=0) > 500).all()
    assert set(np.unique(gt.pixel_mask)) <= {0, 2, 8}


def test_files_are_written_as_an_eiger_writes_them(scan):
    d = scan.parent
    with h5py.File(scan) as f:
        assert f["entry"].attrs["NX_class"] == "NXentry"
        assert f["entry/data"].attrs["NX_class"] == "NXdata"
        for i in (1, 2, 3):
            link = f["entry/data"].get(f"data_{i:06d}", getlink=True)
            assert isinstance(link, h5py.ExternalLink)
            assert (link.filename, link.path) == (data_file_name("s", i), "/entry/data/data")
        det = f["entry/instrument/detector"]
        assert det["x_pixel_size"].attrs["units"] == "m"
        assert det["detectorSpecific/nimages"][()] == N
        assert det["detectorSpecific/pixel_mask"].dtype == np.uint32
        wl = f["entry/instrument/beam/incident_wavelength"]
        assert wl.attrs["units"] == "angstrom"
        assert wl[()] == pytest.approx(12398.42 / 8800.0, rel=1e-5)
        assert f["entry/sample/positions/y"].shape == (N,)
        # the links resolve to the frames through HDF5 itself
        assert f["entry/data/data_000003"].shape == (N - 2 * K, M, M)
    for i, n in ((1, K), (3, N - 2 * K)):
        with h5py.File(d / data_file_name("s", i)) as f:
            ds = f["/entry/data/data"]
            assert ds.dtype == np.uint32 and ds.shape == (n, M, M) and ds.chunks == (1, M, M)
            assert "32008" in ds._filters  # the bitshuffle filter (with LZ4)
            assert ds.attrs["image_nr_low"] == (i - 1) * K + 1
    assert not list(d.glob(".*"))  # no temporary files left behind
    umask = os.umask(0)
    os.umask(umask)
    for p in d.iterdir():  # readable like any file the user writes (not mkstemp's 0600)
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask, p


def test_frames_appear_over_time_at_the_rate(tmp_path, monkeypatch):
    """Data files are written when their last frame is 'acquired' at rate_hz (fake clock)."""
    now = [100.0]
    written: list[tuple[float, int]] = []
    monkeypatch.setattr(sim.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(sim.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    master = simulate_scan(
        tmp_path, "r", positions=10, probe_size=16, frames_per_file=3, rate_hz=2.0,
        progress=lambda done, total: written.append((now[0], done)),
    )  # fmt: skip
    assert [n for _, n in written] == [3, 6, 9, 10]
    assert [t - 100.0 for t, _ in written] == pytest.approx([1.5, 3.0, 4.5, 5.0])
    assert scan_progress(master) == (10, 10)


def test_a_concurrent_reader_sees_only_complete_files(tmp_path):
    """Real clock: a watcher polling during the scan sees progress in whole data files."""
    seen: list[tuple[int, int | None]] = []
    errors: list[BaseException] = []
    done = threading.Event()
    master_path = tmp_path / "w" / "w_master.h5"

    def watch() -> None:
        while not done.is_set():
            try:
                if master_path.exists():
                    seen.append(scan_progress(master_path))
                    for p in master_path.parent.glob("w_data_*.h5"):
                        with h5py.File(p) as f:  # anything under a final name opens cleanly
                            assert f["/entry/data/data"].shape[0] == 2
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                errors.append(exc)
            done.wait(0.01)

    t = threading.Thread(target=watch)
    t.start()
    try:
        simulate_scan(tmp_path, "w", positions=8, probe_size=16, frames_per_file=2, rate_hz=20)
    finally:
        done.set()
        t.join()
    assert not errors, errors
    counts = [c for c, _ in seen]
    assert counts == sorted(counts) and all(c % 2 == 0 for c in counts)
    assert all(e == 8 for _, e in seen)
    assert any(0 < c < 8 for c in counts), counts  # the scan was visibly in progress
    assert scan_progress(master_path) == (8, 8)


def test_aborted_scan_promises_more_than_it_delivers(tmp_path):
    master = simulate_scan(tmp_path, "ab", positions=20, probe_size=16, frames_per_file=4,
                           stop_after=10)  # fmt: skip
    assert scan_progress(master) == (10, 20)
    assert load_scan(master, allow_partial=True).n_frames == 10


def test_refuses_to_overwrite_unless_asked(scan, tmp_path):
    simulate_scan(tmp_path, "x", positions=4, probe_size=16)
    with pytest.raises(FileExistsError):
        simulate_scan(tmp_path, "x", positions=4, probe_size=16)
    simulate_scan(tmp_path, "x", positions=6, probe_size=16, overwrite=True, frames_per_file=6)
    assert scan_progress(tmp_path / "x" / "x_master.h5") == (6, 6)
    assert not (tmp_path / "x" / data_file_name("x", 2)).exists()


def test_cli_simulate(tmp_path):
    from beamflow.cli import app

    args = ["--positions", "12", "--probe-size", "16", "--frames-per-file", "5", "--seed", "3"]
    res = CliRunner().invoke(app, ["simulate", str(tmp_path), "--name", "c1", *args])
    assert res.exit_code == 0, res.output
    scan = load_scan(tmp_path / "c1")
    assert (scan.n_frames, scan.frame_shape) == (12, (16, 16))
    assert (tmp_path / "c1" / "ground_truth.h5").exists()
    again = CliRunner().invoke(app, ["simulate", str(tmp_path), "--name", "c1"])
    assert again.exit_code == 1 and "already holds" in again.output
    usage = CliRunner().invoke(app, ["simulate", str(tmp_path), "--name", "c2", "--pattern", "zig"])
    assert usage.exit_code == 2


def test_cli_simulate_a_drifting_fly_scan(tmp_path):
    """`beamflow simulate --probe-drift PX` writes a fly scan whose beam drifts (the ground
    truth keeps the drift); near field and drifts that leave the window are one-line errors."""
    from beamflow.cli import app

    args = ["--positions", "12", "--probe-size", "16", "--frames-per-file", "6", "--seed", "3"]
    runner = CliRunner()
    for name, extra in (("steady", []), ("fly", ["--probe-drift", "0.5"])):
        res = runner.invoke(app, ["simulate", str(tmp_path), "--name", name, *args, *extra])
        assert res.exit_code == 0, res.output
    assert "--opr-modes" in res.output  # the hint for reconstructing it
    steady = read_ground_truth(tmp_path / "steady" / "ground_truth.h5")
    fly = read_ground_truth(tmp_path / "fly" / "ground_truth.h5")
    assert steady.probe_drift_px is None
    np.testing.assert_allclose(fly.probe_drift_px, sim.fly_scan_drift(12, 0.5))
    np.testing.assert_array_equal(fly.object, steady.object)  # the same sample, another beam
    frames = [load_scan(tmp_path / n).frames() for n in ("steady", "fly")]
    assert not np.array_equal(*frames)

    near = runner.invoke(app, ["simulate", str(tmp_path), "--name", "nf", *args,
                               "--propagation", "near-field", "--probe-drift", "0.5"])
    assert near.exit_code == 2
    lines = near.output.strip().splitlines()
    assert len(lines) == 1 and "--probe-drift" in lines[0] and "near-field" in lines[0], lines
    assert not (tmp_path / "nf").exists()
    big = runner.invoke(app, ["simulate", str(tmp_path), "--name", "big", *args,
                              "--probe-drift", "3"])
    assert big.exit_code == 2 and "at most 2" in big.output, big.output
    negative = runner.invoke(app, ["simulate", str(tmp_path), "--name", "neg", *args,
                                   "--probe-drift", "-1"])
    assert negative.exit_code == 2
