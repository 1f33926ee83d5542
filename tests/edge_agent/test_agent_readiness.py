"""Readiness decided from the files: partial scans are never complete; stalls are aborts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from beamflow.formats import Geometry
from beamflow.formats.eiger import data_file_name, master_path, write_data_file, write_master
from edge_agent.scans import Readiness, assess, find_scans, scan_files

GEOMETRY = Geometry(energy_eV=8800.0, distance_m=2.0, detector_pixel_size_m=75e-6)


def start_scan(root: Path, name: str, n: int = 8, per_file: int = 4, files: int = 0) -> Path:
    """A scan's master file promising ``n`` frames, and its first ``files`` data files."""
    master = master_path(root, name)
    master.parent.mkdir(parents=True)
    positions = np.stack([np.arange(n) * 1e-7, np.zeros(n)], axis=1)
    write_master(master, geometry=GEOMETRY, frame_shape=(16, 16), positions_m=positions,
                 frames_per_file=per_file)
    for index in range(1, files + 1):
        add_file(master, index, per_file=per_file)
    return master


def add_file(master: Path, index: int, k: int = 4, per_file: int = 4) -> Path:
    name = master.name.removesuffix("_master.h5")
    path = master.parent / data_file_name(name, index)
    write_data_file(path, np.ones((k, 16, 16), np.uint32), 1 + (index - 1) * per_file)
    return path


def age(path: Path, seconds: float) -> None:
    """Make every file of the scan look ``seconds`` old."""
    t = time.time() - seconds
    for entry in scan_files(path):
        os.utime(entry.path, (t, t))


def test_scan_in_progress_is_writing_with_progress(tmp_path: Path) -> None:
    master = start_scan(tmp_path, "s1", files=1)
    state = assess(master, quiet_seconds=0.0, stall_timeout=60.0)
    assert state.readiness == Readiness.WRITING
    assert (state.frames, state.expected) == (4, 8)


def test_complete_scan_must_also_be_quiet(tmp_path: Path) -> None:
    master = start_scan(tmp_path, "s1", files=2)
    assert assess(master, quiet_seconds=30.0, stall_timeout=60.0).readiness == Readiness.WRITING
    age(master, 31)
    state = assess(master, quiet_seconds=30.0, stall_timeout=60.0)
    assert state.readiness == Readiness.COMPLETE and state.frames == 8


def test_hidden_temporary_file_means_still_writing(tmp_path: Path) -> None:
    master = start_scan(tmp_path, "s1", files=2)
    (master.parent / ".s1_data_000003.h5.tmp").write_bytes(b"\x89HDF partial")
    age(master, 100)
    assert assess(master, quiet_seconds=1.0, stall_timeout=60.0).readiness == Readiness.WRITING


def test_truncated_data_file_never_counts(tmp_path: Path) -> None:
    master = start_scan(tmp_path, "s1", files=1)
    second = add_file(master, 2)
    second.write_bytes(second.read_bytes()[:500])  # a copy cut short
    age(master, 10)
    state = assess(master, quiet_seconds=1.0, stall_timeout=60.0)
    assert state.readiness == Readiness.WRITING and state.frames == 4


def test_stalled_short_scan_is_aborted_with_the_frames_it_has(tmp_path: Path) -> None:
    master = start_scan(tmp_path, "s1", files=1)
    age(master, 200)
    state = assess(master, quiet_seconds=1.0, stall_timeout=120.0)
    assert state.readiness == Readiness.ABORTED and state.frames == 4


def test_garbage_master_is_broken_once_quiet(tmp_path: Path) -> None:
    scan_dir = tmp_path / "bad"
    scan_dir.mkdir()
    master = scan_dir / "bad_master.h5"
    master.write_bytes(b"this is not HDF5")
    assert assess(master, quiet_seconds=30.0, stall_timeout=60.0).readiness == Readiness.WRITING
    age(master, 60)
    state = assess(master, quiet_seconds=30.0, stall_timeout=60.0)
    assert state.readiness == Readiness.BROKEN
    assert "bad_master.h5" in state.error


@pytest.mark.parametrize(("fractions", "frames", "due"), [
    ([0.25, 0.5], 4, [(0.25, 2), (0.5, 4)]),
    ([0.25, 0.5], 3, [(0.25, 2)]),
    ([0.5], 8, []),  # the whole scan is the final run, not a partial one
])
def test_due_fractions(tmp_path: Path, fractions: list[float], frames: int,
                       due: list[tuple[float, int]]) -> None:
    from edge_agent.scans import ScanState

    state = ScanState(tmp_path, "s", Readiness.WRITING, frames, 8, 0.0)
    assert state.due_fractions(fractions) == due


def test_find_scans_skips_hidden_and_finds_nested(tmp_path: Path) -> None:
    start_scan(tmp_path, "a")
    start_scan(tmp_path / "day2", "b")
    (tmp_path / ".c_master.h5").write_bytes(b"")
    names = sorted(p.name for p in find_scans(tmp_path))
    assert names == ["a_master.h5", "b_master.h5"]


def test_stalled_scan_with_a_corrupt_data_file_is_broken_naming_the_file(tmp_path: Path) -> None:
    master = start_scan(tmp_path, "s1", n=12)
    add_file(master, 1)
    second = add_file(master, 2)
    second.write_bytes(second.read_bytes()[:500])  # truncated, but under its final name
    add_file(master, 3)
    age(master, 10)
    # Before the stall timeout it may still be in flight (a network FS catching up)...
    assert assess(master, quiet_seconds=1.0, stall_timeout=60.0).readiness == Readiness.WRITING
    # ...after it, the hole is a fault, not an abort: never reconstructed from file 1 alone.
    age(master, 100)
    state = assess(master, quiet_seconds=1.0, stall_timeout=60.0)
    assert state.readiness == Readiness.BROKEN
    assert second.name in state.error


def test_complete_scan_whose_master_contradicts_itself_is_broken(tmp_path: Path) -> None:
    import h5py

    master = start_scan(tmp_path, "s1")
    with h5py.File(master, "a") as f:  # fewer positions than promised frames
        for axis in ("x", "y"):
            key = f"/entry/sample/positions/{axis}"
            values = f[key][:5]
            del f[key]
            f[key] = values
    add_file(master, 1)
    add_file(master, 2)
    age(master, 10)
    state = assess(master, quiet_seconds=1.0, stall_timeout=60.0)
    assert state.readiness == Readiness.BROKEN
    assert "position" in state.error and master.name in state.error


def test_progress_can_be_skipped_while_writing(tmp_path: Path) -> None:
    master = start_scan(tmp_path, "s1", files=1)
    state = assess(master, quiet_seconds=30.0, stall_timeout=60.0, progress=False)
    assert state.readiness == Readiness.WRITING and state.frames == 0
