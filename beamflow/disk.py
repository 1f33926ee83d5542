"""A full disk, as an operator acts on it: which disk (a path on it), how full, and how much
a run needs there. Standard library only: the compute function, the run path, the local
transfer and the failure reports all use it."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

#: The errors of a disk with no room left: the device is full, or the user's quota is.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def bytes_text(n: float) -> str:
    """``532 KB``, ``1.2 GB``: decimal units, as df -H and file managers show them."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def no_space_error(exc: BaseException) -> OSError | None:
    """The full-disk error behind ``exc`` (itself, or what caused it), None when there is
    none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in NO_SPACE_ERRNOS:
            return current
        current = current.__cause__ or current.__context__
    return None


def free_space(path: str | Path) -> tuple[Path, int, int] | None:
    """(the existing directory measured, its disk's free bytes, total bytes) for ``path``,
    measured at its nearest existing parent; None when nothing of it can be measured."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        return None
    return where, usage.free, usage.total


def tree_bytes(path: str | Path) -> int:
    """The bytes of the file at ``path``, or of every file under the directory (links not
    followed; files that vanish while counted are skipped)."""
    path = Path(path)
    if not path.is_dir():
        try:
            return path.stat().st_size
        except OSError:
            return 0
    total = 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue
    return total
