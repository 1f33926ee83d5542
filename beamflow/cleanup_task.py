"""What the retention flow's ``cleanup`` function does on the cluster: delete the copies of
raw frames and the checkpoints of scans nobody has touched for long enough.

Under each root (``hpc.scratch_dir``) every ``<scan key>/`` directory is one scan, as the
flows lay it out: ``raw/`` (the transferred frames), ``checkpoints/``, ``runs/<run name>/``
(each run's output, its product among it). Here:

- only ``raw/`` and ``checkpoints/`` are ever deleted: never ``runs/``, never anything
  holding a ``product.h5``;
- a scan is due when nothing under its directory changed for the kind's days (a run in
  flight writes there: transfers, checkpoints, outputs), and it is not in ``keep`` (the scan
  keys of runs in flight, when the caller knows them: the beamline's run store) nor marked
  with a ``.beamflow-keep`` file;
- nothing outside a root is touched: a scan directory or a target that is a symlink, or
  that resolves outside its root, is skipped and reported.

It uses the standard library only (it runs on the endpoint, where this module is imported by
the registered function's body), and reports what it deleted (or, dry, would delete) with
sizes, and what it skipped and why.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

KINDS = ("raw", "checkpoints")
KEEP_MARK = ".beamflow-keep"
PRODUCT = "product.h5"
DAY = 86400.0


def _walk_files(path: Path) -> list[os.stat_result]:
    """lstat of every file and directory under ``path`` (symlinks not followed)."""
    found = [path.lstat()]
    for top, dirs, files in os.walk(path, followlinks=False):
        for name in (*dirs, *files):
            try:
                found.append(os.lstat(os.path.join(top, name)))
            except FileNotFoundError:
                continue
    return found


def _holds_product(path: Path) -> bool:
    return any(PRODUCT in files for _top, _dirs, files in os.walk(path, followlinks=False))


def clean(
    roots: list[str],
    raw_days: float | None,
    checkpoint_days: float | None,
    keep: list[str] | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> dict[str, Any]:
    """Delete (``dry_run``: only list) what is due under ``roots``; the report is
    ``{"dry_run", "items": [{kind, path, scan_key, bytes, age_days}], "skipped": [{path,
    reason}], "bytes"}``. ``None`` days: that kind is kept for ever."""
    now = time.time() if now is None else now
    keep_keys = set(keep or ())
    days = {"raw": raw_days, "checkpoints": checkpoint_days}
    items: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for root_text in roots:
        root = Path(root_text)
        if not root.is_absolute():
            skipped.append({"path": root_text, "reason": "a root must be an absolute path"})
            continue
        if not root.is_dir():
            skipped.append({"path": root_text, "reason": "no such directory"})
            continue
        real_root = root.resolve()
        for scan_dir in sorted(root.iterdir()):
            targets = [scan_dir / kind for kind in KINDS]
            if not scan_dir.is_dir() or not any(t.exists() or t.is_symlink() for t in targets):
                continue  # not a scan's directory, or nothing left to clean
            if scan_dir.is_symlink() or not scan_dir.resolve().is_relative_to(real_root):
                skipped.append({"path": str(scan_dir), "reason": f"outside its root {root}"})
                continue
            if scan_dir.name in keep_keys:
                skipped.append({"path": str(scan_dir), "reason": "a run of this scan is in "
                                "flight"})  # fmt: skip
                continue
            if (scan_dir / KEEP_MARK).exists():
                skipped.append({"path": str(scan_dir), "reason": f"kept by {KEEP_MARK}"})
                continue
            newest = max(s.st_mtime for s in _walk_files(scan_dir))
            age = (now - newest) / DAY
            for kind in KINDS:
                limit = days[kind]
                target = scan_dir / kind
                if limit is None or not (target.exists() or target.is_symlink()):
                    continue
                if target.is_symlink() or not target.resolve().is_relative_to(real_root):
                    skipped.append({"path": str(target), "reason": f"outside its root {root}"})
                    continue
                if age < limit:
                    continue
                if _holds_product(target):
                    skipped.append({"path": str(target), "reason": f"holds a {PRODUCT}"})
                    continue
                size = sum(s.st_size for s in _walk_files(target) if stat.S_ISREG(s.st_mode))
                if not dry_run:
                    shutil.rmtree(target)
                items.append({"kind": kind, "path": str(target), "scan_key": scan_dir.name,
                              "bytes": size, "age_days": round(age, 2)})  # fmt: skip
    return {"dry_run": dry_run, "items": items, "skipped": skipped,
            "bytes": sum(i["bytes"] for i in items)}  # fmt: skip
