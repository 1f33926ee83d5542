"""``load_scan``: one entry point for every scan input the CLI and the job accept."""

from __future__ import annotations

from pathlib import Path

from ._h5 import open_h5
from .cxi import read_cxi
from .eiger import MASTER_SUFFIX, read_detector_scan
from .errors import ScanFormatError
from .scan import Scan


def find_scan_file(path: Path) -> Path:
    """The file to read for ``path``: itself, or the one master/CXI file in a scan directory."""
    path = Path(path)
    if not path.exists():
        raise ScanFormatError(path, "/", "no such file or directory")
    if not path.is_dir():
        return path
    candidates = sorted(path.glob(f"*{MASTER_SUFFIX}")) or sorted(path.glob("*.cxi"))
    if not candidates:
        raise ScanFormatError(path, "/", f"directory holds no *{MASTER_SUFFIX} or *.cxi file")
    if len(candidates) > 1:
        names = ", ".join(c.name for c in candidates)
        raise ScanFormatError(path, "/", f"directory holds several scans ({names}); name one")
    return candidates[0]


def load_scan(
    path: str | Path, *, max_frames: int | None = None, allow_partial: bool = False
) -> Scan:
    """Load a scan from a ``*_master.h5`` file, a scan directory holding one, or a ``.cxi`` file.

    ``allow_partial``: for a scan still being written (or aborted), use the frames of the
    data files complete now instead of failing. ``max_frames``: use at most that many.
    Raises ScanFormatError (file, dataset, problem) for anything unusable.
    """
    file = find_scan_file(Path(path))
    if file.suffix.lower() == ".cxi":
        return read_cxi(file, max_frames=max_frames, allow_partial=allow_partial)
    if not file.name.endswith(MASTER_SUFFIX):
        with open_h5(file) as f:  # sniff: a CXI file under another extension
            is_cxi = "entry_1" in f
        if is_cxi:
            return read_cxi(file, max_frames=max_frames, allow_partial=allow_partial)
    return read_detector_scan(file, max_frames=max_frames, allow_partial=allow_partial)
