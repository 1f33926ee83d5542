"""Finding scans in the detector directory and deciding when (a part of) one is ready.

A scan is ready to read when all of these hold:

- its files are closed: the detector's file writer gives data files their final name only
  when they are closed, and no hidden temporary file of the scan is left;
- it has been quiet: no file of the scan changed for ``quiet_seconds``;
- it opens cleanly as HDF5 and holds the frames the master file promises;
- the frames it reads hold no NaN, no infinity and no negative count on a valid pixel: a
  sample (:data:`SAMPLE_FRAMES`, spread over the scan) and the last frame of every data
  file (decoded anyway, to check the file is whole). A detector that wrote garbage is caught
  here, in milliseconds, naming the frame, not on the cluster after the transfer.

Only what lies inside the detector directory is read: a master that is a symbolic link to a
file outside it is refused without being opened (the agent must not be a way to read
another directory), and a symbolic link to a directory is not followed (reported as
skipped, with why).

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
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from beamflow.formats import (
    Scan,
    ScanFormatError,
    invalid_counts,
    load_scan,
    scan_progress_detail,
)

MASTER_SUFFIX = "_master.h5"
CXI_SUFFIX = ".cxi"
# Files that look like HDF5 to an operator: the ones worth saying why they are not read.
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".nxs", ".nx5")
_DATA_FILE = re.compile(r"^(?P<name>.+)_data_\d{6}\.h5$")
SAMPLE_FRAMES = 8  # frames read at readiness to catch NaN/inf/negative data


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
    # Why a scan is still WRITING, for the operator: "not quiet", "frames" (short of the
    # frames promised) or "unreadable" (a data file there but not readable), with the words.
    wait: str = ""
    reason: str = ""
    blocker: str | None = None  # the data file that stops the count, when unreadable

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


def _directories(root: Path, max_depth: int) -> Iterator[tuple[Path, list[os.DirEntry]]]:
    """Each directory under ``root`` (down to ``max_depth``) with its visible entries."""
    if not root.is_dir():
        return
    stack = [(root, 0)]
    while stack:
        directory, depth = stack.pop()
        try:  # hidden entries are the writer's temporary files
            entries = [e for e in os.scandir(directory) if not e.name.startswith(".")]
        except OSError:
            continue
        yield directory, entries
        for entry in entries:
            if depth < max_depth and entry.is_dir(follow_symlinks=False):
                stack.append((Path(entry.path), depth + 1))


def _is_scan(name: str) -> bool:
    return name.endswith(MASTER_SUFFIX) or name.endswith(CXI_SUFFIX)


def find_scans(root: Path, max_depth: int = 2) -> Iterator[Path]:
    """Master and CXI files under ``root`` (the scan's own directory or the root itself)."""
    for _, entries in _directories(root, max_depth):
        for entry in entries:
            if _is_scan(entry.name) and not entry.is_dir(follow_symlinks=False):
                yield Path(entry.path)


def skip_reason(path: Path, siblings: set[str]) -> str | None:
    """Why an HDF5-looking file is not read as a scan, or None when it is a scan or part of
    one. ``siblings``: the names in its directory. Files beside a scan's master (its ground
    truth, a log) are that scan's business, not reported."""
    name = path.name
    if name.startswith(".") or _is_scan(name) or not name.lower().endswith(HDF5_SUFFIXES):
        return None
    data = _DATA_FILE.match(name)
    if data is not None:
        master = data["name"] + MASTER_SUFFIX
        if master in siblings:
            return None
        return f"a data file without its master file: {master} is not there (yet)"
    if any(_is_scan(n) for n in siblings):
        return None
    return (
        f"not a scan master: the agent reads detector master files (*{MASTER_SUFFIX}) and "
        f"CXI files (*{CXI_SUFFIX})"
    )


def skipped_in(directory: Path, entries: list[os.DirEntry] | None = None) -> list[tuple[Path, str]]:
    """(file, why) for each HDF5-looking file directly in ``directory`` that is not read."""
    if entries is None:
        try:
            entries = [e for e in os.scandir(directory) if not e.name.startswith(".")]
        except OSError:
            return []
    names = {e.name for e in entries}
    out = []
    for entry in entries:
        if entry.is_symlink() and entry.is_dir():
            target = os.path.realpath(entry.path)
            out.append((Path(entry.path), (
                f"a symbolic link to the directory {target}: not followed; the agent reads "
                "scans inside the detector directory only (move or copy the scan here)"
            )))  # fmt: skip
            continue
        reason = skip_reason(Path(entry.path), names)
        if reason is not None and entry.is_file(follow_symlinks=False):
            out.append((Path(entry.path), reason))
    return sorted(out)


def find_skipped(root: Path, max_depth: int = 2) -> Iterator[tuple[Path, str]]:
    """(file, why) for the HDF5-looking files under ``root`` that are not scans."""
    for directory, entries in _directories(root, max_depth):
        yield from skipped_in(directory, entries)


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


def outside(path: Path, root: Path) -> str | None:
    """Why ``path`` (a master or CXI file found under ``root``) is not read because it is
    really elsewhere (a symbolic link out of ``root``), or None. Nothing is opened: links
    are resolved by name."""
    real = Path(os.path.realpath(path))
    if real.is_relative_to(os.path.realpath(root)):
        return None
    return (
        f"{path}: a symbolic link to {real}, outside the detector directory {root}: refused "
        "without being read (move or copy the scan into the detector directory)"
    )


def assess(
    path: Path,
    *,
    quiet_seconds: float,
    stall_timeout: float,
    now: float | None = None,
    progress: bool = True,
    root: Path | None = None,
) -> ScanState:
    """Where one scan stands now (see the module docstring for the rules).

    ``progress=False`` skips reading HDF5 while the scan is still changing (the frame count
    of a scan being written only matters for progressive runs). ``root``: the detector
    directory; a scan that is a symbolic link out of it is BROKEN, and never opened.
    """
    now = time.time() if now is None else now
    name = scan_name(path)
    refusal = None if root is None else outside(path, root)
    if refusal is not None:
        return ScanState(path, name, Readiness.BROKEN, 0, None, 0.0, refusal)
    files = scan_files(path)
    last_change = 0.0
    in_flight: str | None = None  # a file still being written, by name
    for entry in files:
        try:
            last_change = max(last_change, entry.stat().st_mtime)
        except FileNotFoundError:  # renamed under us: the writer is busy
            in_flight = in_flight or entry.name
        if entry.name.startswith("."):
            in_flight = in_flight or entry.name
    quiet = in_flight is None and now - last_change >= quiet_seconds

    def state(
        readiness: Readiness, frames: int = 0, expected: int | None = None,
        error: str | None = None, **why: str | None,
    ) -> ScanState:
        return ScanState(path, name, readiness, frames, expected, last_change, error, **why)

    if not quiet:
        # Still cheap to report progress while writing: it drives progressive runs.
        frames, expected, _ = _progress_or_none(path) if progress else (0, None, None)
        if in_flight is not None:
            reason = f"not quiet yet: {in_flight} is still being written"
        else:
            reason = (
                f"not quiet yet: files changed {max(0.0, now - last_change):.1f} s ago, "
                f"read once unchanged for {quiet_seconds:g} s"
            )
        return state(Readiness.WRITING, frames, expected, wait="not quiet", reason=reason)
    try:
        frames, expected, blocker = _progress(path)
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
        if frames == 0 and blocker is None:
            return state(
                Readiness.BROKEN,
                frames,
                expected,
                f"{path}: aborted before any frame was written ({expected} promised)",
            )
        # Short and stalled: an aborted scan if the rest simply never came, a broken one if
        # a data file is there but cannot be read (truncated or corrupt).
        problem = _validate(path, frames) if blocker is None else str(blocker)
        if problem is not None:
            return state(Readiness.BROKEN, frames, expected, problem)
        return state(Readiness.ABORTED, frames, expected)
    left = max(0.0, stall_timeout - (now - last_change))
    if blocker is not None:
        # Under its final name a data file should be whole; on a network file system it
        # may still be catching up, so the scan waits for the stall timeout before it is
        # reported broken. The operator sees why now.
        reason = (
            f"unreadable: {blocker}; {frames} of {expected} frames readable; reported as "
            f"broken if nothing changes for {left:.0f} s more"
        )
        return state(Readiness.WRITING, frames, expected, wait="unreadable", reason=reason,
                     blocker=blocker.file)
    reason = (
        f"waiting for {expected - frames} more frame(s): {frames} of {expected} readable; "
        f"processed as aborted if nothing new comes for {left:.0f} s more"
    )
    return state(Readiness.WRITING, frames, expected, wait="frames", reason=reason)


def _validate(path: Path, frames: int) -> str | None:
    """The reader's complaint about a quiet scan that has ``frames`` readable frames, or None.

    A data file that never came is what an aborted scan looks like and is no complaint; a
    data file that is there but cannot be read (truncated or corrupt), or a master that
    contradicts itself (positions, mask, geometry), is.
    """
    try:
        return _sample_problem(load_scan(path))
    except ScanFormatError as exc:
        if Path(exc.file) != path:
            return str(exc)  # a data file the master links to is unreadable
        if "incomplete" not in exc.problem:
            return str(exc)
    except OSError as exc:
        return f"{path}: cannot be read: {exc}"
    # Frames are missing at the end: the part there is must still be a consistent scan.
    try:
        return _sample_problem(load_scan(path, max_frames=frames))
    except ScanFormatError as exc:
        return str(exc)
    except OSError as exc:
        return f"{path}: cannot be read: {exc}"


def _sample_problem(scan: Scan) -> str | None:
    """The first frame read at readiness with a NaN, an infinity or a negative count on a
    valid pixel, named by its file and frame as the reconstruction names it; None if they
    are clean. The frames read: :data:`SAMPLE_FRAMES` spread over the scan (first and last
    included), and the last frame of each data file (the reader decodes it anyway, to check
    the file is whole)."""
    if scan.n_frames == 0:
        return None
    spread = np.linspace(0, scan.n_frames - 1, SAMPLE_FRAMES).round().astype(int)
    for index in sorted({*spread.tolist(), *scan.checked_frames}):
        found = invalid_counts(scan.frames(int(index), int(index) + 1)[:, scan.mask])
        if found is None:
            continue
        what = found[0]
        file, key, where = scan.locate(int(index))
        return str(ScanFormatError(file, key, (
            f"{where}: {what} on a valid detector pixel (found when the scan was checked, "
            "before the transfer); mark such pixels invalid in the detector's pixel mask (or "
            "fix the file)"
        )))  # fmt: skip
    return None


def _progress(path: Path) -> tuple[int, int | None, ScanFormatError | None]:
    if path.name.endswith(CXI_SUFFIX):
        scan = load_scan(path)
        return scan.n_frames, scan.n_frames, None
    return scan_progress_detail(path)


def _progress_or_none(path: Path) -> tuple[int, int | None, ScanFormatError | None]:
    try:
        return _progress(path)
    except (ScanFormatError, OSError):
        return 0, None, None
