"""CXI files (Coherent X-ray Imaging Data Bank format): reader into the scan model, and writer.

Layout read and written (as Ptychodus reads and writes it)::

    /cxi_version                                   150
    /entry_1/data_1/data -> instrument_1/detector_1/data   (N,H,W) counts, DC in the centre
    /entry_1/sample_1/geometry_1/translation       (N,3) metres, columns (x, y, z): the probe
                                                   position relative to the sample, as
                                                   Ptychodus interprets it (no sign flip)
    /entry_1/instrument_1/detector_1/distance      metres
    /entry_1/instrument_1/detector_1/x_pixel_size, y_pixel_size   metres
    /entry_1/instrument_1/detector_1/mask          (H,W) uint32, non-zero = bad pixel
    /entry_1/instrument_1/source_1/energy          JOULES

``/entry_1/instrument_1/detector_1/data`` is read when ``data_1/data`` is absent, and
``/entry_1/data_1/translation`` when ``sample_1/geometry_1/translation`` is.

Orientation: ``/entry_1/instrument_1/detector_1/basis_vectors`` (3, 2), when present, holds
in its columns the lab-frame (x, y, z) step in metres from one pixel to the next along the
frame's first (row) and second (column) axes, as CDTools writes it, and the translation is
the sample's displacement in the lab (the CXI meaning): the probe then sits at
``−pinv(B̂)·t`` metres along (rows, columns) of the sample, B̂ the basis with unit columns.
Without basis vectors the translation is read as the probe position along lab y (rows) and
lab x (columns), no sign flip, as Ptychodus reads and writes CXI (and as :func:`write_cxi`
writes). docs/formats.md says how the PETRA III near-field file's orientation was checked.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
from pydantic import ValidationError

from beamflow.validation_text import validation_text

from ._h5 import atomic_h5, dataset, frame_stack, open_h5, read_array, read_scalar
from .errors import ScanFormatError
from .scan import EV_J, Geometry, Scan, check_positions

DATA = "/entry_1/data_1/data"
DETECTOR = "/entry_1/instrument_1/detector_1"
DETECTOR_DATA = f"{DETECTOR}/data"
TRANSLATION = "/entry_1/sample_1/geometry_1/translation"
DATA_TRANSLATION = "/entry_1/data_1/translation"
DISTANCE = f"{DETECTOR}/distance"
X_PIXEL_SIZE = f"{DETECTOR}/x_pixel_size"
Y_PIXEL_SIZE = f"{DETECTOR}/y_pixel_size"
MASK = f"{DETECTOR}/mask"
BASIS = f"{DETECTOR}/basis_vectors"
ENERGY = "/entry_1/instrument_1/source_1/energy"


def write_cxi(
    path: Path,
    frames: np.ndarray,
    positions_m: np.ndarray,
    geometry: Geometry,
    mask: np.ndarray | None = None,
    *,
    title: str | None = None,
) -> Path:
    """Write a CXI file (atomically). ``positions_m`` is (N, 2) with (y, x) columns;
    ``mask`` is True on valid pixels (stored CXI-style: non-zero = bad)."""
    path = Path(path)
    frames = np.asarray(frames)
    positions_m = np.asarray(positions_m, dtype=np.float64)
    translation = np.zeros((positions_m.shape[0], 3))
    translation[:, 0] = positions_m[:, 1]
    translation[:, 1] = positions_m[:, 0]
    with atomic_h5(path) as f:
        f["cxi_version"] = 150
        entry = f.create_group("entry_1")
        if title:
            entry["title"] = title
        det = f.create_group(DETECTOR)
        det.create_dataset(
            "data",
            data=frames,
            chunks=(1, *frames.shape[1:]),
            compression="gzip",
            compression_opts=1,
        )
        det["distance"] = geometry.distance_m
        det["x_pixel_size"] = geometry.detector_pixel_size_m
        det["y_pixel_size"] = geometry.detector_pixel_size_m
        if mask is not None:
            det["mask"] = np.where(np.asarray(mask, bool), 0, 1).astype(np.uint32)
        f.create_group("entry_1/instrument_1/source_1")["energy"] = geometry.energy_eV * EV_J
        f.create_group("entry_1/sample_1/geometry_1")["translation"] = translation
        data = f.create_group("entry_1/data_1")
        data["data"] = h5py.SoftLink(DETECTOR_DATA)
        data["translation"] = h5py.SoftLink(TRANSLATION)
    return path


def _basis(f: h5py.File, path: Path) -> np.ndarray | None:
    """The detector's basis vectors with unit columns (3, 2), or None when absent."""
    if f.get(BASIS, getlink=True) is None:
        return None
    b = read_array(f, path, BASIS, ndim=2)
    if b.shape == (2, 3):  # the CXI specification's row form
        b = b.T
    if b.shape != (3, 2):
        raise ScanFormatError(path, BASIS, f"expected shape (3, 2), found {b.shape}")
    try:
        b = b.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise ScanFormatError(path, BASIS, f"not numbers ({exc})") from exc
    norms = np.linalg.norm(b, axis=0)
    if not (np.all(np.isfinite(b)) and np.all(norms > 0)):
        raise ScanFormatError(path, BASIS, "a basis vector is zero or not finite")
    unit = b / norms
    if abs(float(unit[:, 0] @ unit[:, 1])) > 0.99:
        raise ScanFormatError(path, BASIS, "the two basis vectors are (nearly) parallel")
    return unit


def read_cxi(path: Path, *, max_frames: int | None = None, allow_partial: bool = False) -> Scan:
    """Read a CXI file into the scan model (``allow_partial`` is accepted for symmetry; a CXI
    file is written whole)."""
    del allow_partial
    path = Path(path)
    with open_h5(path) as f:
        data_key = DATA if f.get(DATA, getlink=True) is not None else DETECTOR_DATA
        ds = frame_stack(f, path, data_key)
        n, h, w = (int(s) for s in ds.shape)
        if h != w:
            raise ScanFormatError(path, data_key, f"frames must be square, found {h}×{w}")
        if np.issubdtype(ds.dtype, np.complexfloating) or not np.issubdtype(ds.dtype, np.number):
            raise ScanFormatError(path, data_key, f"frames must be real numbers, found {ds.dtype}")
        try:
            ds[n - 1]
        except (OSError, ValueError) as exc:
            raise ScanFormatError(
                path, data_key, f"last frame cannot be read: truncated or corrupt ({exc})"
            ) from exc

        tkey = TRANSLATION if f.get(TRANSLATION, getlink=True) is not None else DATA_TRANSLATION
        if f.get(tkey, getlink=True) is None:
            raise ScanFormatError(path, TRANSLATION, "missing: the file has no scan positions")
        t = read_array(f, path, tkey, ndim=2)
        if t.shape[1] not in (2, 3):
            raise ScanFormatError(
                path, tkey, f"translation must be (N, 3) (x, y, z), found shape {t.shape}"
            )
        basis = _basis(f, path)
        try:
            t3 = np.zeros((t.shape[0], 3))
            t3[:, : t.shape[1]] = t.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise ScanFormatError(path, tkey, f"not numbers ({exc})") from exc
        # Without a basis (Ptychodus): the probe position, rows = y, columns = x. With one:
        # the sample's displacement, so the probe moves the other way over the sample.
        planned = t3[:, [1, 0]] if basis is None else -(t3 @ np.linalg.pinv(basis).T)
        if planned.shape[0] != n:
            raise ScanFormatError(
                path,
                tkey,
                f"frame/position count mismatch: {n} frames but {planned.shape[0]} positions",
            )

        energy_j = read_scalar(f, path, ENERGY)
        px = read_scalar(f, path, X_PIXEL_SIZE)
        py = read_scalar(f, path, Y_PIXEL_SIZE)
        if not np.isclose(px, py, rtol=1e-6):
            raise ScanFormatError(
                path, X_PIXEL_SIZE, f"non-square pixels ({px} m × {py} m) are not supported"
            )
        if energy_j > 1e-10:  # eV or keV stored by mistake
            raise ScanFormatError(
                path, ENERGY, f"{energy_j} is not an energy in joules (x-rays are ~1e-15 J)"
            )
        try:
            geometry = Geometry(
                energy_eV=energy_j / EV_J,
                distance_m=read_scalar(f, path, DISTANCE),
                detector_pixel_size_m=px,
            )
        except ValidationError as exc:
            problem = validation_text(exc, show_input=True, first_only=True)
            raise ScanFormatError(path, DETECTOR, f"invalid geometry: {problem}") from exc

        if f.get(MASK, getlink=True) is not None:
            m = read_array(f, path, MASK, ndim=2)
            if m.shape != (h, w):
                raise ScanFormatError(
                    path, MASK, f"shape {m.shape} differs from the frame shape {(h, w)}"
                )
            mask = m == 0
        else:
            mask = np.ones((h, w), dtype=bool)

    planned = check_positions(path, tkey, planned, geometry, h)
    n_use = n if max_frames is None else min(n, int(max_frames))

    def read(start: int, stop: int) -> np.ndarray:
        with open_h5(path) as fh:
            try:
                return np.asarray(dataset(fh, path, data_key)[start:stop], dtype=np.float32)
            except (OSError, ValueError) as exc:
                raise ScanFormatError(
                    path, data_key, f"frames {start}..{stop - 1} cannot be read ({exc})"
                ) from exc

    return Scan(
        name=path.stem,
        source=path,
        format="cxi",
        geometry=geometry,
        positions_m=planned[:n_use].copy(),
        planned_positions_m=planned,
        mask=mask,
        n_frames=n_use,
        expected_frames=n,
        _read=read,
        # A CXI file is plain HDF5: its frames are indexed from 0.
        _locate=lambda i: (path, data_key, f"frame index {i} (counted from 0)"),
    )
