"""Atomic file writes: readers (and directory watchers) see the old file or the complete new
one under the final name, never a partial one. The one way beamflow writes a file in place.

A temporary file is made beside the target (same directory, so the rename stays on one file
system), written, optionally fsynced, given the permissions a plain ``open()`` would give it,
and renamed over the target; on any error it is removed. ``durable=True`` also fsyncs the
file and its directory, so the new file survives a power cut (records and products);
``durable=False`` is for files that are rewritten often and regenerated after a crash
(progress, previews): a stale one is fine, a torn one is not.

The checkpoint store keeps its own sequence (beamflow.checkpoint.store) because its crash
tests stop between each step of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_json", "fsync_dir"]


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the file system allows it)."""
    with contextlib.suppress(OSError):  # not every file system lets one fsync a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _default_mode() -> int:
    # mkstemp makes 0600 files; other accounts (a transfer service, the status page's user)
    # must be able to read what beamflow writes, as with a plain open().
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(
    path: str | Path, *, durable: bool = True, tmp_name: str | None = None
) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; renamed over ``path`` when the block ends
    without an error, removed when it raises. ``tmp_name`` fixes the temporary name (the
    simulator uses detector-like hidden names); by default it is unique and hidden."""
    target = Path(path)
    if tmp_name is None:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp = Path(name)
    else:
        tmp = target.parent / tmp_name
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.chmod(tmp, _default_mode())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        fsync_dir(target.parent)


def atomic_write_bytes(path: str | Path, data: bytes, *, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_json(path: str | Path, data: Any, *, durable: bool = True) -> Path:
    """Write ``data`` as indented, key-sorted JSON to ``path`` atomically."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    return atomic_write_bytes(path, text.encode("utf-8"), durable=durable)
