"""What benchmarks/gpu_check.sh relies on: bench_gpu.py's scan cache (each big scan is
simulated once, in a process of its own, and loaded by every step after) and its scores
made in worker processes; the wheel list it carries to the GPU machine."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from beamflow.constraints import read_constraints

ROOT = Path(__file__).resolve().parents[1]
N, M = 30, 16  # a scan small enough to simulate in a blink


def _bench(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its functions pickle by name, for worker processes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench_gpu() -> ModuleType:
    return _bench("bench_gpu")


def _same_scan(got: dict, expected: dict) -> None:
    np.testing.assert_array_equal(got["frames"], expected["frames"])
    np.testing.assert_array_equal(got["region"], expected["region"])
    for field in ("object", "probe", "positions_px", "mask"):
        np.testing.assert_array_equal(getattr(got["gt"], field), getattr(expected["gt"], field))
    assert got["gt"].propagation == expected["gt"].propagation


@pytest.mark.parametrize("field", ["far", "near"])
def test_a_cached_scan_is_the_simulated_one_and_is_not_simulated_again(
    bench_gpu, tmp_path, monkeypatch, field
):
    fresh = bench_gpu.cached_scan(tmp_path, field, N, M, 3)
    stem = f"{field}_{N}x{M}_seed3"
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # arrays and an HDF5 file, no pickle
        f"{stem}_frames.npy", f"{stem}_ground_truth.h5", f"{stem}_region.npy"]

    def no_simulation(*args):
        raise AssertionError(f"simulated again: {args}")

    monkeypatch.setattr(bench_gpu, "simulate", no_simulation)
    _same_scan(bench_gpu.cached_scan(tmp_path, field, N, M, 3), fresh)
    with pytest.raises(AssertionError, match="simulated again"):  # another seed is another scan
        bench_gpu.cached_scan(tmp_path, field, N, M, 4)


def test_a_half_written_cache_entry_is_simulated_again(bench_gpu, tmp_path):
    """A step killed before the ground truth leaves frames alone: not a scan."""
    expected = bench_gpu.simulate("far", N, M, 3)
    np.save(tmp_path / f"far_{N}x{M}_seed3_frames.npy", np.zeros((N, M, M), np.float32))
    np.save(tmp_path / f"far_{N}x{M}_seed3_region.npy", np.zeros(3))
    _same_scan(bench_gpu.cached_scan(tmp_path, "far", N, M, 3), expected)
    _same_scan(bench_gpu.cached_scan(tmp_path, "far", N, M, 3), expected)  # now complete


def test_scores_from_worker_processes_are_the_ones_made_here(bench_gpu):
    case = bench_gpu.simulate("far", N, M, 3)
    truth = case["gt"].object
    rng = np.random.default_rng(0)
    objects = [truth * (1 + 0.1 * k * rng.standard_normal(truth.shape)) for k in (1, 2, 3)]
    here = bench_gpu.score(objects, case, workers=0)
    assert here == sorted(here) and here[0] > 0  # more noise, higher NRMSE
    assert bench_gpu.score(objects, case, workers=3) == pytest.approx(here, rel=1e-12)


def _wheel_list() -> list[str]:
    lines = (ROOT / "benchmarks" / "gpu_wheels.txt").read_text().splitlines()
    return [s for line in lines if (s := line.split("#")[0].strip())]


def test_every_carried_wheel_is_pinned():
    """gpu_check.sh prepare takes a bare name's version from the worker constraints, so the
    GPU machine runs the versions the tests passed with; Pty-Chi is bench_ptychi.py's."""
    pins = read_constraints((ROOT / "deploy" / "constraints-worker.txt").read_text())
    wheels = _wheel_list()
    assert "pydantic" in wheels and "hdf5plugin" not in wheels
    for name in wheels:
        if "==" not in name:
            assert name in pins, f"{name}: no pin in deploy/constraints-worker.txt"
    assert _bench("bench_ptychi").PTYCHI in wheels
