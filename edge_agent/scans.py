"""Finding scans in the detector directory and deciding when (a part of) one is ready.

A scan is ready to read when all of these hold:

- its files are closed: the detector's file writer gives data files their final name only
  when they are closed, and no hidden temporary file of the scan is left;
- it has been quiet: no file of the scan changed for ``quiet_seconds``;
- it opens cleanly as HDF5 and holds the frames the master file promises.

A scan short of its frames that stays unchanged for ``stall_timeout`` was stopped by the
operator: it is processed with the frames it has, marked aborted. A scan that is not a
readable scan once it has gone quiet is reported as broken, with the reader's message: a
master that cannot be read or contradicts itself (positions, mask, geometry), and, once
stalled, a data file that is there under its final name but cannot be read (truncated or
corrupt; a scan with a hole is not silently reconstructed from the frames before it).

Everything here is decided from the files alone (names, sizes, modification times and the
HDF5 contents), so an agent restarted after a crash decides exactly as the one before.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from beamflow.formats import ScanFormatError, load_scan, scan_progress

MASTER_SUFFIX = "_master.h5"
CXI_SUFFIX = ".cxi"


class Readiness(StrEnum):
    WRITING = "writing"  # files changing, or fewer frames than promised and not stalled
    COMPLETE = "complete"  # every promised frame present, quiet
    ABORTED = "aborted"  # fewer frames than promised, nothing new for stall_timeout
    BROKEN = "broken"  # quiet, but not a readable scan


@dataclass(frozen=True)
class ScanState:
    """What the files of one scan say now."""

    path: Path  # the master (or .cxi) file
    name: str
    readiness: Readiness
    frames: int  # frames readable now
    expected: int | None  # frames promised
    last_change: float  # newest modification time among the scan's files
    error: str | None = None

    def due_fractions(self, fractions: Sequence[float]) -> list[tuple[float, int]]:
        """The progressive (fraction, frames) points this scan has reached, in order."""
        if not self.expected or self.frames >= self.expected:
            return []  # all frames are in: the final run comes next, no partial one
        due = []
        for f in sorted(fractions):
            needed = math.ceil(f * self.expected)
            if 0 < needed <= self.frames and needed < self.expected:
                due.append((f, needed))
        return due


def scan_name(path: Path) -> str:
    name = path.name
    return name[: -len(MASTER_SUFFIX)] if name.endswith(MASTER_SUFFIX) else path.stem


def find_scans(root: Path, max_depth: int = 2) -> Iterator[Path]:
    """Master and CXI files under ``root`` (the scan's own directory or the root itself)."""
    if not root.is_dir():
        return
    stack = [(root, 0)]
    while stack:
        directory, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue  # temporary files of the writer
            if entry.is_dir(follow_symlinks=False):
                if depth < max_depth:
                    stack.append((Path(entry.path), depth + 1))
            elif entry.name.endswith(MASTER_SUFFIX) or entry.name.endswith(CXI_SUFFIX):
                yield Path(entry.path)


def scan_files(path: Path) -> list[os.DirEntry]:
    """The files that belong to a scan: everything named after it in its directory,
    hidden temporary files included (they mean a file is still being written)."""
    name = scan_name(path)
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return []
    if path.name.endswith(CXI_SUFFIX):
        return [e for e in entries if e.name.lstrip(".").startswith(path.name)]
    return [e for e in entries if e.name.lstrip(".").startswith(name + "_")]


def assess(
    path: Path,
    *,
    quiet_seconds: float,
    stall_timeout: float,
    now: float | None = None,
    progress: bool = True,
) -> ScanState:
    """Where one scan stands now (see the module docstring for the rules).

    ``progress=False`` skips reading HDF5 while the scan is still changing (the frame count
    of a scan being written only matters for progressive runs).
    """
    now = time.time() if now is None else now
    name = scan_name(path)
    files = scan_files(path)
    last_change = 0.0
    writing = False
    for entry in files:
        try:
            last_change = max(last_change, entry.stat().st_mtime)
        except FileNotFoundError:  # renamed under us: the writer is busy
            writing = True
        if entry.name.startswith("."):
            writing = True
    quiet = not writing and now - last_change >= quiet_seconds

    def state(
        readiness: Readiness, frames: int = 0, expected: int | None = None, error: str | None = None
    ) -> ScanState:
        return ScanState(path, name, readiness, frames, expected, last_change, error)

    if not quiet:
        # Still cheap to report progress while writing: it drives progressive runs.
        frames, expected = _progress_or_none(path) if progress else (0, None)
        return state(Readiness.WRITING, frames, expected)
    try:
        frames, expected = _progress(path)
    except ScanFormatError as exc:
        return state(Readiness.BROKEN, error=str(exc))
    except OSError as exc:
        return state(Readiness.BROKEN, error=f"{path}: cannot be read: {exc}")
    if expected is None or frames >= expected:
        if frames == 0:
            return state(Readiness.BROKEN, frames, expected, f"{path}: the scan holds no frames")
        # Every frame is there: the master's own consistency (positions, mask, geometry)
        # is checked now, so a scan that cannot be reconstructed fails at once, naming why.
        problem = _validate(path, frames)
        if problem is not None:
            return state(Readiness.BROKEN, frames, expected, problem)
        return state(Readiness.COMPLETE, frames, expected)
    if now - last_change >= stall_timeout:
        if frames == 0:
            return state(
                Readiness.BROKEN,
                frames,
                expected,
                f"{path}: aborted before any frame was written ({expected} promised)",
            )
        # Short and stalled: an aborted scan if the rest simply never came, a broken one if
        # a data file is there but cannot be read (truncated or corrupt).
        problem = _validate(path, frames)
        if problem is not None:
            return state(Readiness.BROKEN, frames, expected, problem)
        return state(Readiness.ABORTED, frames, expected)
    return state(Readiness.WRITING, frames, expected)


def _validate(path: Path, frames: int) -> str | None:
    """The reader's complaint about a quiet scan that has ``frames`` readable frames, or None.

    A data file that never came is what an aborted scan looks like and is no complaint; a
    data file that is there but cannot be read (truncated or corrupt), or a master that
    contradicts itself (positions, mask, geometry), is.
    """
    if path.name.endswith(CXI_SUFFIX):
        return None  # _progress read the whole file already
    try:
        load_scan(path)
    except ScanFormatError as exc:
        if Path(exc.file) != path:
            return str(exc)  # a data file the master links to is unreadable
        if "incomplete" not in exc.problem:
            return str(exc)
    except OSError as exc:
        return f"{path}: cannot be read: {exc}"
    else:
        return None
    # Frames are missing at the end: the part there is must still be a consistent scan.
    try:
        load_scan(path, max_frames=frames)
    except ScanFormatError as exc:
        return str(exc)
    except OSError as exc:
        return f"{path}: cannot be read: {exc}"
    return None


def _progress(path: Path) -> tuple[int, int | None]:
    if path.name.endswith(CXI_SUFFIX):
        scan = load_scan(path)
        return scan.n_frames, scan.n_frames
    return scan_progress(path)


def _progress_or_none(path: Path) -> tuple[int, int | None]:
    try:
        return _progress(path)
    except (ScanFormatError, OSError):
        return 0, None
