"""The beamline's optics: recorded in the master file, read into the scan, used as the probe."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from beamflow.formats import ScanFormatError, ZonePlateOptics, load_scan, read_product
from beamflow.formats.eiger import ZONE_PLATE, read_detector_scan, write_master
from beamflow.ground_truth import read_ground_truth, score_product
from beamflow.job.models import ReconstructJob
from beamflow.job.run import run_reconstruction
from beamflow.ptycho.probe import ZonePlate, zone_plate_probe
from beamflow.simulate import (
    DEFAULT_GEOMETRY,
    PUPIL_RADIUS_FRACTION,
    make_ground_truth,
    simulate_scan,
)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("optics")
    return simulate_scan(root, "s", positions=40, probe_size=32, seed=5, frames_per_file=20)


@pytest.fixture
def copy(small: Path, tmp_path: Path) -> Path:
    shutil.copytree(small.parent, tmp_path / "s")
    return tmp_path / "s" / small.name


def _optics_probe(optics: ZonePlateOptics, m: int, dx: float) -> np.ndarray:
    zp = ZonePlate(diameter_m=optics.diameter_m, outer_zone_width_m=optics.outer_zone_width_m,
                   central_stop_fraction=optics.central_stop_fraction)
    return zone_plate_probe(m, dx, DEFAULT_GEOMETRY.energy_eV, zp, optics.defocus_m)[0]


def _nrmse(a: np.ndarray, b: np.ndarray) -> float:
    """NRMSE of b against a after normalising both and removing the global phase."""
    a = a / np.linalg.norm(a)
    b = b / np.linalg.norm(b)
    b = b * np.exp(-1j * np.angle(np.vdot(b, a)))
    return float(np.linalg.norm(a - b))


# ----------------------------------------------------------------------------- the file


def test_master_round_trips_the_optics(tmp_path: Path) -> None:
    optics = ZonePlateOptics(diameter_m=120e-6, outer_zone_width_m=50e-9,
                             central_stop_fraction=0.4, defocus_m=-0.3e-3)
    path = tmp_path / "x_master.h5"
    write_master(path, geometry=DEFAULT_GEOMETRY, frame_shape=(16, 16),
                 positions_m=np.zeros((3, 2)), frames_per_file=3, optics=optics)
    with h5py.File(path) as f:
        assert f[ZONE_PLATE].attrs["NX_class"] == "NXfresnel_zone_plate"
        assert f[f"{ZONE_PLATE}/outer_diameter"].attrs["units"] == "m"
    with h5py.File(path, "a") as f:  # data inside the master: the scan reads without files
        del f["/entry/data/data_000001"]
        f["/entry/data/data_000001"] = np.zeros((3, 16, 16), np.uint32)
    got = read_detector_scan(path).optics
    assert got is not None
    for key, value in optics.model_dump().items():
        assert getattr(got, key) == pytest.approx(value, rel=1e-12)


def test_simulated_scan_records_its_optics_and_ground_truth_agrees(small: Path) -> None:
    scan = load_scan(small)
    gt = read_ground_truth(small.parent)
    assert scan.optics is not None and scan.optics == gt.optics
    # NA = λ/(2 d_r) is the bright-field disc: R·p = z·NA
    na = DEFAULT_GEOMETRY.wavelength_m / (2 * scan.optics.outer_zone_width_m)
    radius_px = DEFAULT_GEOMETRY.distance_m * na / DEFAULT_GEOMETRY.detector_pixel_size_m
    assert radius_px == pytest.approx(PUPIL_RADIUS_FRACTION * 32)


def test_missing_optics_is_fine(copy: Path) -> None:
    with h5py.File(copy, "a") as f:
        del f[ZONE_PLATE]
    assert load_scan(copy).optics is None


def _set(key: str, value):
    def edit(f: h5py.File) -> None:
        attrs = dict(f[key].attrs) if key in f else {}
        if key in f:
            del f[key]
        f[key] = value
        f[key].attrs.update(attrs)
    return edit


def _units(key: str, units: str):
    def edit(f: h5py.File) -> None:
        f[key].attrs["units"] = units
    return edit


def _not_a_group(f: h5py.File) -> None:
    del f[ZONE_PLATE]
    f[ZONE_PLATE] = 1.0


@pytest.mark.parametrize(
    ("edit", "dataset", "match"),
    [
        (_set(f"{ZONE_PLATE}/outer_diameter", -1e-4), "outer_diameter", "positive"),
        (_set(f"{ZONE_PLATE}/outermost_zone_width", "wide"), "outermost_zone_width", "number"),
        (_set(f"{ZONE_PLATE}/outermost_zone_width", [1e-7, 2e-7]), "outermost_zone_width",
         "scalar"),
        (_set(f"{ZONE_PLATE}/central_stop_diameter", 2e-4), "central_stop_diameter", "outer"),
        (_set(f"{ZONE_PLATE}/defocus", np.nan), "defocus", "finite"),
        (_units(f"{ZONE_PLATE}/defocus", "furlong"), "defocus", "units"),
        (lambda f: f.__delitem__(f"{ZONE_PLATE}/outer_diameter"), "outer_diameter", "missing"),
        (_not_a_group, ZONE_PLATE, "group"),
    ],
)
def test_malformed_optics_raise_naming_the_dataset(copy: Path, edit, dataset: str,
                                                   match: str) -> None:
    with h5py.File(copy, "a") as f:
        edit(f)
    with pytest.raises(ScanFormatError, match=match) as info:
        load_scan(copy)
    assert info.value.dataset.endswith(dataset) and info.value.file == str(copy)


# ----------------------------------------------------------------------------- the probe


@pytest.mark.parametrize("m", [32, 64])
def test_optics_probe_is_the_simulated_probe_but_for_its_astigmatism(m: int) -> None:
    gt = make_ground_truth(positions=4, probe_size=m, seed=0)
    probe = _optics_probe(gt.optics, m, gt.object_pixel_size_m)
    assert _nrmse(gt.probe, probe) < 0.3
    # the wrong twin (conjugate) or the opposite defocus sign would be a bad start
    assert _nrmse(gt.probe, np.conj(probe)) > 1.0
    flipped = gt.optics.model_copy(update={"defocus_m": -gt.optics.defocus_m})
    assert _nrmse(gt.probe, _optics_probe(flipped, m, gt.object_pixel_size_m)) > 1.0
    # In the far field the phase difference across the bright-field annulus is the
    # simulator's astigmatism (nx² − ny²) alone: defocus or scale errors would leave a rest.
    n = np.fft.fftfreq(m) * m
    ny, nx = np.meshgrid(n, n, indexing="ij")
    radius = PUPIL_RADIUS_FRACTION * m
    ring = (np.hypot(ny, nx) > 0.6 * radius) & (np.hypot(ny, nx) < 0.85 * radius)
    diff = np.fft.fft2(gt.probe) * np.conj(np.fft.fft2(probe))
    phase = np.angle(diff[ring] * np.exp(-1j * np.angle(diff[ring].sum())))
    basis = np.stack([((nx**2 - ny**2) / radius**2)[ring], np.ones(int(ring.sum()))], 1)
    coef, *_ = np.linalg.lstsq(basis, phase, rcond=None)
    assert np.std(phase) > 0.1  # the astigmatism is there ...
    assert np.std(phase - basis @ coef) < 0.05  # ... and nothing else
    amp_p, amp_q = np.abs(np.fft.fft2(gt.probe)), np.abs(np.fft.fft2(probe))
    assert _nrmse(amp_p, amp_q) < 0.12  # the same annulus (edges soft differently)


# ----------------------------------------------------------------------------- reconstruct


@pytest.fixture(scope="module")
def scan64(tmp_path_factory) -> tuple[Path, Path]:
    """A 64 px scan (where the mean-diffraction guess stalls) and its copy without optics."""
    root = tmp_path_factory.mktemp("optics64")
    master = simulate_scan(root, "s", positions=80, probe_size=64, seed=1, frames_per_file=40)
    bare = root / "bare"
    shutil.copytree(master.parent, bare)
    with h5py.File(bare / master.name, "a") as f:
        del f[ZONE_PLATE]
    return master, bare / master.name


def _run(scan: Path, out: Path, **kw) -> tuple[float, object]:
    job = ReconstructJob(scan=scan, out=out, device="cpu", threads=2, iterations=15,
                         checkpoint_every=0, preview_every=0, **kw)
    summary = run_reconstruction(job)
    product = read_product(summary.product)
    return score_product(product, read_ground_truth(scan.parent.parent / "s")).nrmse, summary


def test_reconstruction_from_the_optics_beats_the_data_guess(scan64, tmp_path: Path) -> None:
    with_optics, bare = scan64
    nrmse_optics, s_optics = _run(with_optics, tmp_path / "optics")
    nrmse_data, s_data = _run(bare, tmp_path / "data")
    assert s_optics.initial_probe == "optics" and s_data.initial_probe == "data"
    assert "initial probe from optics" in read_product(s_optics.product).comments
    # measured: ≈0.03 from the optics, ≈0.4 from the mean diffraction (seed 1, 15 iterations)
    assert nrmse_optics < 0.08
    assert nrmse_optics < 0.5 * nrmse_data


def test_a_probe_file_takes_precedence_over_the_optics(small: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "p.npy", read_ground_truth(small.parent).probe)
    job = ReconstructJob(scan=small, out=tmp_path / "o", device="cpu", threads=2, iterations=2,
                         checkpoint_every=0, preview_every=0, probe=tmp_path / "p.npy")
    assert run_reconstruction(job).initial_probe == "file"
