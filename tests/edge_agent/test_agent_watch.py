"""Filesystem events reduced to "look at this scan again", on inotify and on polling."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edge_agent.scans import find_scans
from edge_agent.watch import ChangedScans, scans_in, start_observer


def wait_for(handler: ChangedScans, want: Path, timeout: float = 20.0) -> set[Path]:
    """Directories reported until ``want`` is among them (or the timeout)."""
    seen: set[Path] = set()
    deadline = time.monotonic() + timeout
    while want not in seen and time.monotonic() < deadline:
        handler.wakeup.wait(0.1)
        seen |= handler.take()
    return seen


@pytest.mark.parametrize("kind", ["inotify", "polling", "auto"])
def test_a_file_renamed_into_a_scan_directory_reports_that_directory(
    tmp_path: Path, kind: str
) -> None:
    scan_dir = tmp_path / "day1" / "s1"
    scan_dir.mkdir(parents=True)
    handler = ChangedScans()
    observer = start_observer(tmp_path, handler, kind, poll_seconds=0.1)
    try:
        time.sleep(0.2)  # the polling observer's first snapshot
        tmp = scan_dir / ".s1_data_000001.h5.tmp"
        tmp.write_bytes(b"frames")
        tmp.rename(scan_dir / "s1_data_000001.h5")  # how the detector's writer finishes a file
        assert scan_dir in wait_for(handler, scan_dir)
    finally:
        observer.stop()
        observer.join(5)


def test_a_new_scan_directory_is_reported(tmp_path: Path) -> None:
    handler = ChangedScans()
    observer = start_observer(tmp_path, handler, "inotify")
    try:
        (tmp_path / "s2").mkdir()
        (tmp_path / "s2" / "s2_master.h5").write_bytes(b"x")
        seen = wait_for(handler, tmp_path / "s2")
        assert tmp_path / "s2" in seen
        assert scans_in(tmp_path / "s2") == [tmp_path / "s2" / "s2_master.h5"]
    finally:
        observer.stop()
        observer.join(5)


def test_reading_a_file_does_not_wake_the_agent(tmp_path: Path) -> None:
    """The agent opens scans to count frames; its own reads must not make it look again
    (a busy loop of reads waking reads)."""
    scan_dir = tmp_path / "s1"
    scan_dir.mkdir()
    master = scan_dir / "s1_master.h5"
    master.write_bytes(b"x" * 100)
    handler = ChangedScans()
    observer = start_observer(tmp_path, handler, "inotify")
    try:
        time.sleep(0.2)
        handler.take()
        for _ in range(5):
            master.read_bytes()
        marker = tmp_path / "marker"
        marker.write_bytes(b"")  # an event we know comes, after the reads
        seen = wait_for(handler, tmp_path)
        assert tmp_path in seen and scan_dir not in seen
    finally:
        observer.stop()
        observer.join(5)


def test_scans_in_lists_master_and_cxi_files_but_not_hidden_ones(tmp_path: Path) -> None:
    for name in ("a_master.h5", "b.cxi", ".c_master.h5", "a_data_000001.h5", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in scans_in(tmp_path)] == ["a_master.h5", "b.cxi"]
    assert scans_in(tmp_path / "missing") == []
    assert sorted(p.name for p in find_scans(tmp_path)) == ["a_master.h5", "b.cxi"]
