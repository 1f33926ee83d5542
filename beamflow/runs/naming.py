"""The names of scans and runs, as every part uses them: a scan's name (its directory, or its
file without ``_master.h5``), its key (the name plus a hash of its path: the scan's directory
on the cluster), a run's name (the scan's name plus the run id: its results' directory), and
the labels that tell scans of one name apart on the page and in the CLI.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path, PurePath

from beamflow.runs.records import Run

MASTER_SUFFIX = "_master.h5"


def safe_name(text: str, limit: int = 60) -> str:
    """``text`` as a path and tag component: letters, digits, ``_`` and ``-`` only."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-_")[:limit]
    return cleaned or "scan"


def scan_name(scan_path: Path) -> str:
    """A scan's name: its directory, or the file without ``_master.h5`` / extension."""
    if scan_path.is_file() or scan_path.suffix:
        name = scan_path.name
        if name.endswith(MASTER_SUFFIX):
            return name[: -len(MASTER_SUFFIX)]
        return scan_path.stem
    return scan_path.name


def scan_key(scan_path: Path) -> str:
    """The scan's directory name on the cluster (``hpc.scratch_dir/<scan key>/``): stable
    and unique, its name plus a hash of its path."""
    digest = hashlib.sha256(str(scan_path).encode()).hexdigest()[:8]
    return f"{safe_name(scan_name(scan_path), 48)}-{digest}"


def run_name_for(run: Run) -> str:
    """The run's name (its results' directory): the scan's name, the run id's start, and the
    attempt after the first."""
    name = f"{safe_name(run.scan_name, 60)}-{run.id[:8]}"
    return name if run.attempt <= 1 else f"{name}-{run.attempt}"


def scan_labels(name: str, paths: Iterable[str]) -> dict[str, str]:
    """Labels for the scans called ``name`` at ``paths``: the name alone when there is one
    scan, else the fewest parent directories that tell them apart, then the name
    (``a/s1``, ``b/s1``; a directory named like the scan, the usual layout, is skipped).
    A scan's directory and its master (or CXI) file are one scan, one label (runs recorded
    before the master file became the one ``scan_path`` name the directory)."""
    files = (f"{name}_master.h5", f"{name}.cxi")
    place: dict[str, str] = {}  # each path -> the scan it names (one key per scan)
    context: dict[str, tuple[str, ...]] = {}  # each scan -> the directories it lies in
    for p in set(paths):
        path = PurePath(p)
        folder = path if path.name == name and not path.suffix else path.parent
        place[p] = str(folder) if folder != path.parent or path.name in files else p
        parts = [x for x in folder.parts if x not in ("/", "\\")]
        if parts and parts[-1] == name:
            parts.pop()
        context[place[p]] = tuple(parts)
    if len(context) <= 1:
        return {p: name for p in place}
    labels = {scan: name for scan in context}
    for k in range(1, max(len(c) for c in context.values()) + 1):
        labels = {scan: "/".join([*c[-k:], name]) for scan, c in context.items()}
        if len(set(labels.values())) == len(context):
            return {p: labels[place[p]] for p in place}
    # Still alike (two scans in one directory): each by its own path.
    taken = list(labels.values())
    return {p: p if taken.count(labels[place[p]]) > 1 else labels[place[p]] for p in place}
