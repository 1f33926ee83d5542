"""What benchmarks/gpu_check.sh relies on: bench_gpu.py's scan cache (each big scan is
simulated once, in a process of its own, and loaded by every step after) and its scores
made in worker processes; the wheel list it carries to the GPU machine."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
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
    here = [s["nrmse"] for s in bench_gpu.score(objects, case, workers=0)]
    assert here == sorted(here) and here[0] > 0  # more noise, higher NRMSE
    there = [s["nrmse"] for s in bench_gpu.score(objects, case, workers=3)]
    assert there == pytest.approx(here, rel=1e-12)


def test_a_thick_scan_is_cached_under_its_layers_and_scored_per_layer(bench_gpu, tmp_path,
                                                                      monkeypatch):
    """A thick case is the scan of as many layers (its own cache entry, the thin one left
    alone); its lines score the projection and each layer; --thin-frames reconstructs the
    layers from the thin scan and scores their projection alone."""
    spacings = (4e-4,)
    thick = bench_gpu.load_case(tmp_path, "far", N, M, 3, 2, spacings)
    assert thick["gt"].object.shape[0] == 2 and thick["slices"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"far_{N}x{M}_2layers_0.0004m_seed3_{part}"
        for part in ("frames.npy", "ground_truth.h5", "region.npy")]
    monkeypatch.setattr(bench_gpu, "simulate", lambda *a: pytest.fail(f"simulated again: {a}"))
    _same_scan(bench_gpu.load_case(tmp_path, "far", N, M, 3, 2, spacings), thick)

    layers = thick["gt"].object
    perfect, swapped = bench_gpu.score([layers, layers[::-1].copy()], thick, workers=0)
    assert perfect["nrmse"] == pytest.approx(perfect["projection_nrmse"], abs=1e-5)
    assert perfect["nrmse"] < 0.01 and max(perfect["layer_nrmse"]) < 0.1  # registration
    assert len(perfect["cutoff_cycles_per_px"]) == 2
    # The same projection, each layer holding the other's content.
    assert swapped["projection_nrmse"] < 0.01 and min(swapped["layer_nrmse"]) > 0.5

    monkeypatch.undo()
    thin = bench_gpu.load_case(tmp_path, "far", N, M, 3, 2, spacings, thin_frames=True)
    assert thin["thin_frames"] and thin["gt"].object.ndim == 2  # the thin scan
    flat = np.stack([thin["gt"].object, np.ones_like(thin["gt"].object)])
    (got,) = bench_gpu.score([flat], thin, workers=0)
    assert got["nrmse"] < 0.01 and got["layer_nrmse"] is None


@pytest.mark.parametrize("field", ["far", "near"])
@pytest.mark.parametrize("modes", [1, 2])
@pytest.mark.parametrize("algorithm", ["rpie", "lsqml", "epie"])
def test_the_floor_model_is_a_floor_of_the_engines_traffic_with_layers_and_modes(
    bench_gpu, field, modes, algorithm
):
    """The floor (bytes_per_iteration) never exceeds what the engine's GPU code path moves
    on the counting stand-in, and neither does each extra layer's share of it: the pass
    tables count no step the code does not make."""
    args = argparse.Namespace(sites=0, seed=0, batch=None, modes=modes)
    counted, floor = [], []
    for slices in (1, 2, 3):
        case = bench_gpu.load_case(None, field, N, M, 3, slices, (4e-4,) * (slices - 1))
        batch = None if algorithm == "epie" else 16
        counted.append(bench_gpu.count_launches(case, algorithm, args, batch)[1])
        floor.append(bench_gpu.bytes_per_iteration(algorithm, field == "near", N, M, modes, 4,
                                                   slices))
    assert all(c >= f for c, f in zip(counted, floor, strict=True)), (counted, floor)
    assert floor[2] - floor[1] == floor[1] - floor[0] > 0  # the same for every layer
    assert counted[1] - counted[0] >= floor[1] - floor[0]
    assert counted[2] - counted[1] >= floor[2] - floor[1]


def test_the_floor_model_of_a_thin_single_mode_scan_is_the_pass_table(bench_gpu):
    """21 passes for PIE, 36 for LSQ-ML, 30 for DM, 12 more in the near field; layers add
    24 (PIE) and 27 (LSQ-ML) passes each; modes multiply the stack's passes, not the
    windows' (4 of PIE's 21)."""
    n, m = 10, 8
    p = 8 * n * m * m
    for algorithm, passes, layer in (("rpie", 21, 24), ("epie", 21, 24), ("lsqml", 36, 27),
                                     ("dm", 30, None)):
        frames = 2 * n * m * m  # uint16 counts
        assert bench_gpu.bytes_per_iteration(algorithm, False, n, m, 1, 2) == passes * p + frames
        assert bench_gpu.bytes_per_iteration(algorithm, True, n, m, 1, 0) == (passes + 12) * p
        if layer is not None:
            assert bench_gpu.bytes_per_iteration(algorithm, False, n, m, 1, 0, 3) == (
                passes + 2 * layer) * p
    assert bench_gpu.bytes_per_iteration("rpie", False, n, m, 6, 0) == (6 * 17 + 4) * p
    with pytest.raises(KeyError):  # DM models no layers: no floor for them
        bench_gpu.bytes_per_iteration("dm", False, n, m, 1, 0, 2)


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


def _gpu_check_commands(tmp_path: Path, only: str) -> tuple[list[str], list[list[str]]]:
    """Run ``gpu_check.sh run`` with an interpreter that only records its arguments: the
    steps it ran (summary.txt) and every command it gave the interpreter."""
    calls = tmp_path / "calls.jsonl"
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"with open({str(calls)!r}, 'a') as f:\n"
                    "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "OUT": str(out),
           "PYTHON": str(fake), "GPU_CHECK_ONLY": only, "GPU_CHECK_WHEELS": str(tmp_path / "none"),
           "GPU_CHECK_SCANS": str(tmp_path / "scans"), "GPU_CHECK_SITE": str(tmp_path / "site")}
    subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "run"], env=env,
                   cwd=ROOT, check=True, capture_output=True, timeout=120)
    steps = [line.split()[0] for line in (out / "summary.txt").read_text().splitlines()]
    return steps, [json.loads(line) for line in calls.read_text().splitlines()]


def test_gpu_check_runs_the_thick_steps_it_is_asked_for_with_commands_bench_gpu_takes(
    bench_gpu, tmp_path
):
    """GPU_CHECK_ONLY="thick xpkg": the thick samples' steps alone, the cheap first, and only
    the scans they read simulated (the thin 4000 x 128², its three-layer version, the thin
    16384 x 128²); each bench_gpu.py command parses, and the cross-package case is the
    issue's: 16384 x 128², 6 probe modes, 6 layers, batch 1024."""
    steps, calls = _gpu_check_commands(tmp_path, "thick xpkg")
    assert steps == ["thick-ratio-4000x128", "thick-3layers-4000x128", "xpkg-lsqml-16384x128",
                     "xpkg-rpie-16384x128"]
    bench = [c[1:] for c in calls if c and c[0] == "benchmarks/bench_gpu.py"]
    simulated = sorted(" ".join(c[c.index("--fields"):]) for c in bench if "--simulate-only" in c)
    assert simulated == ["--fields far --cases 16384x128",
                         "--fields far --cases 4000x128",
                         "--fields far --cases 4000x128 --slices 3 --slice-spacing 1e-4"]
    runs = [bench_gpu.parse_args(c) for c in bench if "--simulate-only" not in c]
    assert len(runs) == 4 and all(a.no_ptychi and a.device == "cuda" for a in runs)
    ratio, three, lsqml, rpie = runs
    assert ratio.slices == [1, 2, 3, 6] and ratio.thin_frames
    assert three.slices == [3] and three.spacings[3] == (1e-4, 1e-4) and not three.thin_frames
    for args, algorithm in ((lsqml, "lsqml"), (rpie, "rpie")):
        assert (args.cases, args.modes, args.slices, args.batch, args.algorithms) == (
            ["16384x128"], 6, [6], [1024], [algorithm])


def test_gpu_check_only_simulates_nothing_for_steps_that_read_no_scan(tmp_path):
    steps, calls = _gpu_check_commands(tmp_path, "pytest")
    assert steps == ["pytest-gpu"]
    assert not [c for c in calls if "--simulate-only" in c]
