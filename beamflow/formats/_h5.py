"""HDF5 helpers shared by the readers: clear errors, units, atomic writes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np

from beamflow.atomic import atomic_path

from .errors import ScanFormatError

_LENGTH_UNITS = {
    "m": 1.0,
    "meter": 1.0,
    "metre": 1.0,
    "meters": 1.0,
    "metres": 1.0,
    "mm": 1e-3,
    "millimeter": 1e-3,
    "millimetre": 1e-3,
    "um": 1e-6,
    "µm": 1e-6,
    "micron": 1e-6,
    "microns": 1e-6,
    "micrometer": 1e-6,
    "nm": 1e-9,
    "nanometer": 1e-9,
    "angstrom": 1e-10,
    "a": 1e-10,
    "å": 1e-10,
    "ang": 1e-10,
}


def register_filters() -> None:
    """Register hdf5plugin's filters (the Eiger data files' bitshuffle/LZ4) with h5py.

    Every HDF5 file this package reads goes through :func:`open_h5`, which calls this
    first; a writer that compresses imports hdf5plugin where it asks for the filter
    (``eiger._compression``). Importing it only then (not when the package is imported)
    lets the simulator, its ground truth and the engine run where hdf5plugin is not
    installed (a GPU machine lent without it, docs/performance.md).
    """
    import hdf5plugin  # noqa: F401, PLC0415  (the import registers the filters)


@contextlib.contextmanager
def open_h5(path: Path) -> Iterator[h5py.File]:
    """Open an HDF5 file for reading, turning every way it can fail into a ScanFormatError."""
    register_filters()
    if not path.exists():
        raise ScanFormatError(path, "/", "file does not exist")
    if path.is_dir():
        raise ScanFormatError(path, "/", "is a directory, not a file")
    if path.stat().st_size == 0:
        raise ScanFormatError(path, "/", "empty file (0 bytes)")
    try:
        is_hdf5 = h5py.is_hdf5(path)
    except OSError as exc:
        raise ScanFormatError(path, "/", f"cannot read file: {exc}") from exc
    if not is_hdf5:
        raise ScanFormatError(path, "/", "not an HDF5 file (no HDF5 signature)")
    try:
        # No HDF5 file locking for reads: detector file systems (NFS, GPFS) often refuse
        # locks, and our writers never modify a file after renaming it into place.
        f = h5py.File(path, "r", locking=False)
    except OSError as exc:
        raise ScanFormatError(path, "/", f"truncated or corrupt HDF5 file ({exc})") from exc
    try:
        yield f
    finally:
        f.close()


def dataset(f: h5py.File, path: Path, key: str) -> h5py.Dataset:
    """The dataset at ``key``, or a ScanFormatError saying it is missing or not a dataset."""
    try:
        link = f.get(key, getlink=True)
        obj = f.get(key) if link is not None else None
    except (OSError, KeyError, RuntimeError) as exc:
        raise ScanFormatError(path, key, f"cannot be read ({exc})") from exc
    if link is None:
        raise ScanFormatError(path, key, "missing")
    if obj is None:
        raise ScanFormatError(path, key, "link points to nothing (dangling link)")
    if not isinstance(obj, h5py.Dataset):
        raise ScanFormatError(path, key, f"expected a dataset, found a {type(obj).__name__}")
    return obj


def frame_stack(f: h5py.File, path: Path, key: str, count: str = "N") -> h5py.Dataset:
    """The frames at ``key``: a dataset of rank 3 (``count``, H, W) holding at least one
    frame, or a ScanFormatError saying what it holds instead."""
    ds = dataset(f, path, key)
    if ds.ndim != 3:
        raise ScanFormatError(
            path, key,
            f"frames must be rank 3 ({count}, H, W), found rank {ds.ndim} (shape {ds.shape})",
        )  # fmt: skip
    if ds.shape[0] == 0:
        raise ScanFormatError(path, key, "holds no frames")
    return ds


def read_array(f: h5py.File, path: Path, key: str, ndim: int | None = None) -> np.ndarray:
    ds = dataset(f, path, key)
    if ndim is not None and ds.ndim != ndim:
        raise ScanFormatError(
            path, key, f"expected rank {ndim}, found rank {ds.ndim} (shape {ds.shape})"
        )
    try:
        return np.asarray(ds[()])
    except (OSError, ValueError) as exc:
        raise ScanFormatError(path, key, f"cannot be read ({exc})") from exc


def read_scalar(f: h5py.File, path: Path, key: str) -> float:
    value = read_array(f, path, key)
    if value.size != 1:
        raise ScanFormatError(path, key, f"expected a scalar, found shape {value.shape}")
    try:
        out = float(value.reshape(()))
    except (TypeError, ValueError) as exc:
        raise ScanFormatError(path, key, f"not a number ({value!r})") from exc
    if not np.isfinite(out):
        raise ScanFormatError(path, key, f"not finite ({out})")
    return out


def read_length_m(f: h5py.File, path: Path, key: str, default_units: str = "m") -> float:
    """A length in metres, honouring a NeXus ``units`` attribute (m, mm, um, nm, angstrom)."""
    value = read_scalar(f, path, key)
    return value * length_scale(f[key], path, key, default_units)


def length_scale(ds: h5py.Dataset, path: Path, key: str, default_units: str = "m") -> float:
    units = ds.attrs.get("units", default_units)
    if isinstance(units, bytes):
        units = units.decode("utf-8", "replace")
    units = str(units).strip().lower()
    if units not in _LENGTH_UNITS:
        raise ScanFormatError(path, key, f"unknown length units {units!r}")
    return _LENGTH_UNITS[units]


@contextlib.contextmanager
def atomic_h5(path: Path, tmp_name: str | None = None) -> Iterator[h5py.File]:
    """Write an HDF5 file under a temporary name, fsync, then rename it into place.

    A reader (or a directory watcher) never sees a half-written file under the final name.
    ``tmp_name`` fixes the temporary name (the simulator uses detector-like hidden names);
    by default a unique hidden name in the same directory is used.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, tmp_name=tmp_name) as tmp, h5py.File(tmp, "w") as f:
        yield f
