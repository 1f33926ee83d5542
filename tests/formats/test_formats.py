"""Scan readers: the detector layout and CXI load into one scan model; bad files fail clearly."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from beamflow.formats import (
    Geometry,
    ScanFormatError,
    load_scan,
    read_cxi,
    read_detector_scan,
    scan_progress,
    write_cxi,
)
from beamflow.formats.eiger import data_file_name, write_data_file
from beamflow.ground_truth import read_ground_truth
from beamflow.simulate import simulate_scan

N, M, K = 30, 32, 8  # positions, frame size, frames per data file


@pytest.fixture(scope="module")
def good_scan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("det")
    return simulate_scan(out, "good", positions=N, probe_size=M, photons=1e5, seed=3,
                         frames_per_file=K)  # fmt: skip


@pytest.fixture
def scan_copy(good_scan: Path, tmp_path: Path) -> Path:
    """A private copy of the good scan (master path) to damage."""
    shutil.copytree(good_scan.parent, tmp_path / "good")
    return tmp_path / "good" / good_scan.name


@pytest.fixture
def cxi_file(good_scan: Path, tmp_path: Path) -> Path:
    scan = load_scan(good_scan)
    return write_cxi(tmp_path / "good.cxi", scan.frames().astype(np.uint32), scan.positions_m,
                     scan.geometry, scan.mask)  # fmt: skip


def raises(match: str, file: Path, fn, *args, **kwargs) -> ScanFormatError:
    with pytest.raises(ScanFormatError, match=match) as info:
        fn(*args, **kwargs)
    err = info.value
    assert Path(err.file).name == file.name, f"error names {err.file}, expected {file}"
    if err.dataset == "/":  # the file itself: a sentence about it, no "/:" in the way
        assert str(err).startswith((f"{err.file}: ", f"{err.file} is ")), str(err)
        assert ": /:" not in str(err)
    else:
        assert str(err).startswith(f"{err.file}: {err.dataset}: ")
    return err


# ------------------------------------------------------------------------------------ good


def test_detector_scan_loads_with_geometry_positions_mask_and_lazy_frames(good_scan):
    scan = load_scan(good_scan)
    gt = read_ground_truth(good_scan)
    assert scan.format == "eiger" and scan.name == "good"
    assert scan.n_frames == scan.expected_frames == N and scan.complete
    assert scan.frame_shape == (M, M)
    assert scan.geometry == gt.geometry
    assert scan.object_pixel_size_m == pytest.approx(gt.object_pixel_size_m)
    np.testing.assert_array_equal(scan.positions_m, gt.nominal_positions_m)
    # mask: True = valid; every flagged Eiger pixel is invalid, nothing else
    np.testing.assert_array_equal(scan.mask, gt.pixel_mask == 0)
    assert 0 < (~scan.mask).sum() < M * M // 50
    frames = scan.frames()
    assert frames.dtype == np.float32 and frames.shape == (N, M, M)
    # a slice across a data-file boundary equals the same rows of the full read
    np.testing.assert_array_equal(scan.frames(K - 3, K + 5), frames[K - 3 : K + 5])
    with h5py.File(good_scan.parent / data_file_name("good", 2)) as f:
        np.testing.assert_array_equal(f["/entry/data/data"][0], frames[K])
    # the detector view: the bright-field disc is centred
    mean = frames.mean(axis=0)
    cy, cx = np.unravel_index(np.argmax(np.where(scan.mask, mean, 0)), mean.shape)
    assert abs(cy - M / 2) < M / 4 and abs(cx - M / 2) < M / 4


def test_hdf5plugin_is_imported_to_read_a_scan_not_to_simulate_one(good_scan, tmp_path):
    """A GPU machine may lack hdf5plugin (docs/performance.md): the simulator's in-memory
    frames and the engine run without it, and a fresh process that reads a scan still gets
    the data files' bitshuffle filter."""
    code = """import sys
import beamflow.ptycho, beamflow.simulate
from beamflow.simulate import detector_frames, make_ground_truth
gt = make_ground_truth(positions=4, probe_size=16, photons=1e4, seed=1)
detector_frames(gt, 0, 4, __import__("numpy").random.default_rng(0))
from beamflow.ground_truth import write_ground_truth  # an uncompressed file (bench_gpu's)
write_ground_truth(sys.argv[2], gt)
print("hdf5plugin" in sys.modules)
from beamflow.formats import load_scan
print(float(load_scan(sys.argv[1]).frames().sum()), "hdf5plugin" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code, str(good_scan),
                          str(tmp_path / "ground_truth.h5")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    total = float(load_scan(good_scan).frames().sum())
    assert out.stdout.split() == ["False", repr(total), "True"]


def test_directory_master_and_cxi_load_into_the_same_model(good_scan, cxi_file):
    det = load_scan(good_scan.parent)  # the scan directory
    cxi = load_scan(cxi_file)
    assert cxi.format == "cxi" and det.format == "eiger"
    assert cxi.geometry.energy_eV == pytest.approx(det.geometry.energy_eV, rel=1e-12)
    assert cxi.geometry.distance_m == det.geometry.distance_m
    assert cxi.geometry.detector_pixel_size_m == det.geometry.detector_pixel_size_m
    np.testing.assert_array_equal(cxi.positions_m, det.positions_m)
    np.testing.assert_array_equal(cxi.mask, det.mask)
    np.testing.assert_array_equal(cxi.frames(), det.frames())
    assert (cxi.n_frames, cxi.frame_shape) == (det.n_frames, det.frame_shape)


def test_cxi_file_layout_follows_the_convention(cxi_file, good_scan):
    det = load_scan(good_scan)
    with h5py.File(cxi_file) as f:
        t = f["/entry_1/sample_1/geometry_1/translation"][()]
        assert t.shape == (N, 3)
        np.testing.assert_array_equal(t[:, 0], det.positions_m[:, 1])  # x
        np.testing.assert_array_equal(t[:, 1], det.positions_m[:, 0])  # y
        energy_j = f["/entry_1/instrument_1/source_1/energy"][()]
        assert energy_j == pytest.approx(det.geometry.energy_eV * 1.602176634e-19)
        assert (f["/entry_1/instrument_1/detector_1/mask"][()] != 0).sum() == (~det.mask).sum()
        assert f["/entry_1/data_1/data"].shape == (N, M, M)


def test_negative_positions_are_legal(tmp_path):
    g = Geometry(energy_eV=8000, distance_m=3.0, detector_pixel_size_m=75e-6)
    pos = -np.abs(np.random.default_rng(0).normal(0, 1e-6, (5, 2))) - 1e-3  # all negative
    p = write_cxi(tmp_path / "neg.cxi", np.ones((5, 16, 16)), pos, g)
    scan = read_cxi(p)
    np.testing.assert_array_equal(scan.positions_m, pos)
    assert scan.mask.all()


def test_max_frames_uses_the_first_frames(good_scan):
    scan = load_scan(good_scan, max_frames=10)
    assert scan.n_frames == 10 and scan.positions_m.shape == (10, 2)
    assert scan.planned_positions_m.shape == (N, 2)
    np.testing.assert_array_equal(scan.frames(), load_scan(good_scan).frames(0, 10))


def test_error_carries_its_parts_across_pickling():
    err = pickle.loads(pickle.dumps(ScanFormatError("/a/b.h5", "/entry/x", "missing")))
    assert (err.file, err.dataset, err.problem) == ("/a/b.h5", "/entry/x", "missing")
    assert str(err) == "/a/b.h5: /entry/x: missing" and isinstance(err, ValueError)


# ------------------------------------------------------------------------------------ partial


def test_partial_scan_counts_only_complete_data_files(tmp_path):
    master = simulate_scan(tmp_path, "part", positions=N, probe_size=M, photons=1e4,
                           frames_per_file=K, stop_after=2 * K)  # fmt: skip
    assert scan_progress(master) == (2 * K, N)
    # a data file being written in place (truncated at its final name) does not count
    good = (master.parent / data_file_name("part", 2)).read_bytes()
    (master.parent / data_file_name("part", 3)).write_bytes(good[: len(good) // 2])
    assert scan_progress(master) == (2 * K, N)
    raises("truncated|corrupt", master.parent / data_file_name("part", 3), load_scan, master)

    (master.parent / data_file_name("part", 3)).unlink()
    raises("scan incomplete", master, load_scan, master)
    scan = load_scan(master, allow_partial=True)
    assert (scan.n_frames, scan.expected_frames, scan.partial) == (2 * K, N, True)
    assert scan.positions_m.shape == (2 * K, 2) and scan.planned_positions_m.shape == (N, 2)
    assert scan.frames().shape == (2 * K, M, M)
    assert load_scan(master, max_frames=K).n_frames == K  # complete up to what was asked


def test_scan_progress_before_any_data_file(tmp_path):
    master = simulate_scan(tmp_path, "none", positions=N, probe_size=M, stop_after=0)
    assert scan_progress(master) == (0, N)
    raises("no complete", master, load_scan, master, allow_partial=True)


# ------------------------------------------------------------------------------------ bad


def _edit(path: Path, fn) -> None:
    with h5py.File(path, "r+") as f:
        fn(f)


def _replace(key: str, value):
    def fn(f):
        attrs = dict(f[key].attrs)
        del f[key]
        f[key] = value
        f[key].attrs.update(attrs)

    return fn


POS = "/entry/sample/positions"
DET = "/entry/instrument/detector"
PMASK = f"{DET}/detectorSpecific/pixel_mask"


def _both(n: int):
    def fn(f):
        _replace(f"{POS}/x", np.zeros(n))(f)
        _replace(f"{POS}/y", np.zeros(n))(f)

    return fn


@pytest.mark.parametrize(
    ("edit", "match", "dataset"),
    [
        (lambda f: f.__delitem__(POS), "missing", POS),
        (lambda f: f.__delitem__(f"{POS}/x"), "missing", f"{POS}/x"),
        (_replace(f"{POS}/x", np.zeros(N - 1)), "y has 30 positions but x has 29", POS),
        (_both(N - 2), "frame/position count mismatch", POS),
        (_replace(f"{POS}/y", np.full(N, np.nan)), "non-finite", POS),
        (_replace(f"{POS}/y", np.linspace(-5, 5, N)), "must be in metres", POS),  # µm as m
        (_replace(f"{POS}/y", np.zeros((N, 2))), "expected rank 1", f"{POS}/y"),
        (lambda f: f.__delitem__("/entry/instrument/detector/detector_distance"), "missing",
         "/entry/instrument/detector/detector_distance"),
        (lambda f: f.__delitem__("/entry/instrument/beam/incident_wavelength"), "missing",
         "/entry/instrument/beam/incident_wavelength"),
        (_replace(f"{DET}/detector_distance", -2.0), "distance_m", DET),
        (_replace(PMASK, np.zeros((M, M + 1), np.uint32)), "differs from the frame shape", PMASK),
        (_replace("/entry/instrument/detector/detectorSpecific/nimages", np.uint32(N + 5)),
         "frame/position count mismatch", POS),
        (lambda f: f.__delitem__("/entry/data"), "missing", "/entry/data"),
    ],
)  # fmt: skip
def test_bad_master_raises_naming_file_dataset_and_problem(scan_copy, edit, match, dataset):
    _edit(scan_copy, edit)
    err = raises(match, scan_copy, load_scan, scan_copy)
    assert err.dataset == dataset


def test_data_file_with_wrong_rank(scan_copy):
    data = scan_copy.parent / data_file_name("good", 2)
    with h5py.File(data, "w") as f:
        f["/entry/data/data"] = np.zeros((M, M), np.uint32)
    err = raises("rank 3", data, load_scan, scan_copy)
    assert err.dataset == "/entry/data/data"


def test_data_file_with_frames_of_another_shape(scan_copy):
    data = scan_copy.parent / data_file_name("good", 2)
    write_data_file(data, np.zeros((K, M, M + 2), np.uint32), K + 1)
    raises("differs from the first data file", data, load_scan, scan_copy)


def test_non_square_frames(tmp_path):
    g = Geometry(energy_eV=8000, distance_m=3.0, detector_pixel_size_m=75e-6)
    p = write_cxi(tmp_path / "rect.cxi", np.ones((4, 16, 20)), np.zeros((4, 2)), g)
    raises("square", p, load_scan, p)


def test_missing_data_file_is_an_incomplete_scan(scan_copy):
    (scan_copy.parent / data_file_name("good", 3)).unlink()
    raises("incomplete", scan_copy, load_scan, scan_copy)
    assert scan_progress(scan_copy) == (2 * K, N)


def test_truncated_data_file(scan_copy):
    data = scan_copy.parent / data_file_name("good", 1)
    raw = data.read_bytes()
    data.write_bytes(raw[: len(raw) - 200])
    raises("truncated|corrupt", data, load_scan, scan_copy)
    assert scan_progress(scan_copy) == (0, N)  # never raises on a broken data file


@pytest.mark.parametrize("content", [b"", b"this is not HDF5\n" * 10])
def test_empty_or_non_hdf5_master(tmp_path, content):
    p = tmp_path / "x_master.h5"
    p.write_bytes(content)
    raises("empty file" if not content else "not an HDF5 file", p, load_scan, p)
    raises("empty file" if not content else "not an HDF5 file", p, scan_progress, p)


def test_truncated_master(scan_copy):
    raw = scan_copy.read_bytes()
    scan_copy.write_bytes(raw[: len(raw) // 2])
    raises("truncated or corrupt", scan_copy, read_detector_scan, scan_copy)


def test_directory_without_scan_and_missing_path(tmp_path):
    raises("no \\*_master.h5 or \\*.cxi", tmp_path, load_scan, tmp_path)
    raises("no such file", tmp_path / "nope.cxi", load_scan, tmp_path / "nope.cxi")


# ------------------------------------------------------------------------------------ bad CXI

T = "/entry_1/sample_1/geometry_1/translation"
E = "/entry_1/instrument_1/source_1/energy"
DATA = "/entry_1/instrument_1/detector_1/data"


@pytest.mark.parametrize(
    ("edit", "match", "dataset"),
    [
        (lambda f: (f.__delitem__(T), f.__delitem__("/entry_1/data_1/translation")), "missing", T),
        (_replace(T, np.zeros((N - 1, 3))), "frame/position count mismatch", T),
        (_replace(T, np.full((N, 3), np.nan)), "non-finite", T),
        (_replace(T, np.zeros(N)), "expected rank 2", T),
        (_replace(T, np.zeros((N, 5))), r"\(N, 3\)", T),
        (_replace(DATA, np.zeros((N, M), np.uint32)), "rank 3", "/entry_1/data_1/data"),
        (lambda f: f.__delitem__(E), "missing", E),
        (_replace(E, 8800.0), "joules", E),
        (lambda f: f.__delitem__("/entry_1/instrument_1/detector_1/distance"), "missing",
         "/entry_1/instrument_1/detector_1/distance"),
        (_replace("/entry_1/instrument_1/detector_1/mask", np.zeros((3, M))),
         "differs from the frame shape", "/entry_1/instrument_1/detector_1/mask"),
    ],
)  # fmt: skip
def test_bad_cxi_raises_naming_file_dataset_and_problem(cxi_file, edit, match, dataset):
    _edit(cxi_file, edit)
    err = raises(match, cxi_file, load_scan, cxi_file)
    assert err.dataset == dataset


@pytest.mark.parametrize("kind", ["empty", "text", "truncated"])
def test_broken_cxi_files(cxi_file, kind):
    raw = cxi_file.read_bytes()
    data = {"empty": b"", "text": b"x,y\n1,2\n", "truncated": raw[: len(raw) // 3]}[kind]
    cxi_file.write_bytes(data)
    raises({"empty": "empty", "text": "not an HDF5", "truncated": "truncated"}[kind], cxi_file,
           load_scan, cxi_file)  # fmt: skip
