"""The first job of a transfer: plan the files. Each item is checked (exists, file or
directory as ``recursive`` says), directories are walked (symlinks confined to the source
root, loops visited once, other transfers' partial files passed over) and made on the
destination side; the result is the list of files to copy, counted as they are found.

Also here, because every later job uses them: the fault a file can fail with, the task's
counters, and cancellation.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from beamflow.disk import NO_SPACE_ERRNOS, bytes_text, free_space
from beamflow.local.actions import iso_time
from beamflow.local.collection_paths import inside

PARTIAL_MARK = ".beamflow-partial-"


class TransferFault(Exception):
    """A file could not be transferred; ``code`` is the Transfer fault code."""

    def __init__(self, code: str, description: str, path: Path | None = None) -> None:
        super().__init__(description)
        self.code = code
        self.description = description
        self.path = path


class Canceled(Exception):
    """The task was cancelled; raised at the next block, file or directory entry."""


def check_cancel(cancel: threading.Event) -> None:
    if cancel.is_set():
        raise Canceled


def os_fault(exc: OSError, path: Path) -> TransferFault:
    """An OS error as the Transfer fault a user reads (disk full, quota, permission, ...),
    naming the file as it is called once copied (not its hidden temporary name); a full disk
    says how much room is left on it."""
    code = {
        errno.ENOSPC: "NO_SPACE_LEFT",
        errno.EDQUOT: "QUOTA_EXCEEDED",
        errno.EACCES: "PERMISSION_DENIED",
        errno.EPERM: "PERMISSION_DENIED",
        errno.ENOENT: "FILE_NOT_FOUND",
    }.get(exc.errno or 0, "IO_ERROR")
    if PARTIAL_MARK in path.name:
        path = path.with_name(path.name[1:].split(PARTIAL_MARK)[0])
    text = f"{path}: {exc.strerror or exc}"
    measured = free_space(path) if exc.errno in NO_SPACE_ERRNOS else None
    if measured is not None:
        text += f" ({bytes_text(measured[1])} free of {bytes_text(measured[2])})"
    return TransferFault(code, text, path)


@dataclass
class PlannedFile:
    """A file to copy, with the source's size and times as they were when planned."""

    src: Path
    dst: Path
    size: int
    mtime_ns: int
    atime_ns: int


@dataclass
class TransferStats:
    files: int = 0
    directories: int = 0
    files_skipped: int = 0
    files_transferred: int = 0
    bytes_transferred: int = 0
    bytes_checksummed: int = 0
    faults: int = 0
    fault_details: list[dict[str, Any]] = field(default_factory=list)


class Tally:
    """The task's counters, written by the planner, the copier and the verifier thread and
    read by whoever asks for the task's document."""

    def __init__(self) -> None:
        self._stats = TransferStats()
        self._lock = threading.Lock()

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self._stats, name, getattr(self._stats, name) + n)

    def fault(self, fault: TransferFault) -> None:
        """Record a fault (as the task document's ``fault_details`` lists them)."""
        with self._lock:
            self._stats.faults += 1
            self._stats.fault_details.append(
                {
                    "time": iso_time(time.time()),
                    "code": fault.code,
                    "description": fault.description,
                    "path": str(fault.path) if fault.path else None,
                }
            )

    def snapshot(self) -> TransferStats:
        with self._lock:
            return replace(self._stats, fault_details=list(self._stats.fault_details))


class Planner:
    """The files of a request's items, made ready on the destination side."""

    def __init__(
        self, src_root: Path, dst_root: Path, tally: Tally, cancel: threading.Event
    ) -> None:
        self.src_root = src_root
        self.dst_root = dst_root
        self.tally = tally
        self.cancel = cancel

    def files(self, items: list[tuple[Path, Path, Any]]) -> Iterator[PlannedFile]:
        """``items``: (source path, destination path, request item) as resolved."""
        for src, dst, item in items:
            try:
                st = src.stat()
            except FileNotFoundError:
                raise TransferFault(
                    "FILE_NOT_FOUND", f"source {item.source_path} does not exist", src
                ) from None
            except PermissionError:
                raise TransferFault(
                    "PERMISSION_DENIED", f"source {item.source_path}: permission denied", src
                ) from None
            if item.recursive:
                if not stat.S_ISDIR(st.st_mode):
                    raise TransferFault(
                        "NOT_A_DIRECTORY",
                        f"source {item.source_path} is not a directory (recursive is set)",
                        src,
                    )
                yield from self.walk(src, dst)
            else:
                if stat.S_ISDIR(st.st_mode):
                    raise TransferFault(
                        "IS_A_DIRECTORY",
                        f"source {item.source_path} is a directory: set recursive to copy it",
                        src,
                    )
                self.tally.add(files=1)
                yield PlannedFile(src, dst, st.st_size, st.st_mtime_ns, st.st_atime_ns)

    def walk(self, src_dir: Path, dst_dir: Path) -> Iterator[PlannedFile]:
        """Every regular file under ``src_dir``, its directories made under ``dst_dir``."""
        seen: set[tuple[int, int]] = set()
        stack = [(src_dir, dst_dir)]
        self.mkdir(dst_dir)
        self.tally.add(directories=1)
        while stack:
            here, there = stack.pop()
            key = (here.stat().st_dev, here.stat().st_ino)
            if key in seen:
                continue  # a symlink loop: each directory once
            seen.add(key)
            try:
                entries = sorted(os.scandir(here), key=lambda e: e.name)
            except PermissionError:
                raise TransferFault(
                    "PERMISSION_DENIED", f"{here}: permission denied", here
                ) from None
            for entry in entries:
                check_cancel(self.cancel)
                if PARTIAL_MARK in entry.name:
                    continue  # another transfer's unfinished file
                path = Path(entry.path)
                if entry.is_symlink():
                    real = path.resolve(strict=False)
                    if not inside(real, self.src_root):
                        raise TransferFault(
                            "PERMISSION_DENIED",
                            f"{path} is a symlink to {real}, outside the source collection's "
                            "root; refused",
                            path,
                        )
                try:
                    st = entry.stat()  # follows symlinks (checked above)
                except FileNotFoundError:
                    if entry.is_symlink():
                        continue  # dangling link: nothing to copy
                    raise
                target = there / entry.name
                if stat.S_ISDIR(st.st_mode):
                    self.mkdir(target)
                    self.tally.add(directories=1)
                    stack.append((path, target))
                elif stat.S_ISREG(st.st_mode):
                    self.tally.add(files=1)
                    yield PlannedFile(path, target, st.st_size, st.st_mtime_ns, st.st_atime_ns)
                # sockets, fifos, devices: not data, not copied (as Globus)

    def mkdir(self, path: Path) -> None:
        """Make a destination directory, confined to the destination root."""
        try:
            path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise TransferFault(
                "NOT_A_DIRECTORY",
                f"destination {path} (or a directory above it) exists and is not a directory",
                path,
            ) from None
        except OSError as exc:
            raise os_fault(exc, path) from None
        real = path.resolve()
        if not inside(real, self.dst_root):
            raise TransferFault(
                "PERMISSION_DENIED", f"destination {path} leads outside its root", path
            )
