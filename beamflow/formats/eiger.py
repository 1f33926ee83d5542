"""Dectris-Eiger-style NeXus/HDF5 scans: the layout, its writer (for the simulator) and reader.

Layout (one scan = one directory ``NAME/``)::

    NAME/NAME_master.h5                     written first, atomically (temp name + rename)
      /entry                                 NXentry
        /data                                NXdata
          data_000001 -> ExternalLink("NAME_data_000001.h5", "/entry/data/data")  ...
        /instrument                          NXinstrument
          /beam/incident_wavelength          Å (units attr), as an Eiger writes it
          /beam/propagation                  optional, beamflow's: "far-field" | "near-field"
          /beam/focus_distance               optional, beamflow's: focus-to-sample distance
                                             z1 of a near-field cone beam (m, units attr)
          /detector/x_pixel_size, y_pixel_size, detector_distance     m (units attrs)
          /detector/detectorSpecific/nimages, ntrigger   expected frames = nimages·ntrigger
          /detector/detectorSpecific/pixel_mask          uint32, non-zero = bad (Eiger bits)
          /detector/detectorSpecific/x_pixels_in_detector, y_pixels_in_detector
          /zone_plate                        NXfresnel_zone_plate (optional, all in m with
                                             units attrs): outer_diameter, outermost_zone_width,
                                             central_stop_diameter (optional, 0 = none),
                                             defocus (optional, 0 = in focus): sample − focus
                                             along the beam, positive = downstream of the focus
        /sample/positions/y, /sample/positions/x        (N,) float64, metres (units attrs)
    NAME/NAME_data_000001.h5 ...            /entry/data/data (K,H,W) uint32, one chunk per
                                             frame, bitshuffle+LZ4; attrs image_nr_low/high
                                             (1-based, inclusive). Each written under a hidden
                                             temporary name and renamed when closed, so a
                                             reader only ever sees complete data files.

Positions are the probe position relative to the sample (the negative of the sample stage
displacement), in metres, ``y`` and ``x`` in the detector's row/column directions; they are
planned up front, one per expected frame. The reader also accepts
``/entry/instrument/beam/incident_energy`` (eV) when no wavelength is present, and length
``units`` attributes m/mm/um/nm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
from pydantic import ValidationError

from beamflow.validation_text import validation_text

from ._h5 import (
    atomic_h5,
    dataset,
    frame_stack,
    length_scale,
    open_h5,
    read_array,
    read_length_m,
    read_scalar,
)
from .errors import ScanFormatError
from .scan import Geometry, Scan, ZonePlateOptics, check_positions

MASTER_SUFFIX = "_master.h5"
DATA_GROUP = "/entry/data"
DATA_KEY = "/entry/data/data"
DETECTOR = "/entry/instrument/detector"
SPECIFIC = f"{DETECTOR}/detectorSpecific"
PIXEL_MASK = f"{SPECIFIC}/pixel_mask"
NIMAGES = f"{SPECIFIC}/nimages"
NTRIGGER = f"{SPECIFIC}/ntrigger"
X_PIXEL_SIZE = f"{DETECTOR}/x_pixel_size"
Y_PIXEL_SIZE = f"{DETECTOR}/y_pixel_size"
DISTANCE = f"{DETECTOR}/detector_distance"
WAVELENGTH = "/entry/instrument/beam/incident_wavelength"
ENERGY = "/entry/instrument/beam/incident_energy"
POSITIONS = "/entry/sample/positions"
POS_Y = f"{POSITIONS}/y"
POS_X = f"{POSITIONS}/x"
PROPAGATION = "/entry/instrument/beam/propagation"
FOCUS_DISTANCE = "/entry/instrument/beam/focus_distance"
PROPAGATION_MODELS = ("far-field", "near-field")
ZONE_PLATE = "/entry/instrument/zone_plate"
ZP_DIAMETER = f"{ZONE_PLATE}/outer_diameter"
ZP_OUTER_ZONE = f"{ZONE_PLATE}/outermost_zone_width"
ZP_STOP = f"{ZONE_PLATE}/central_stop_diameter"
ZP_DEFOCUS = f"{ZONE_PLATE}/defocus"

#: Eiger pixel_mask bits (non-zero = do not use the pixel).
MASK_GAP, MASK_DEAD, MASK_COLD, MASK_HOT, MASK_NOISY = 1, 2, 4, 8, 16

_LINK_RE = re.compile(r"^data_(\d{6})$")


def scan_name(master: Path) -> str:
    n = Path(master).name
    return n[: -len(MASTER_SUFFIX)] if n.endswith(MASTER_SUFFIX) else Path(master).stem


def master_path(out_dir: Path, name: str) -> Path:
    return Path(out_dir) / name / f"{name}{MASTER_SUFFIX}"


def data_file_name(name: str, index: int) -> str:
    """Data file ``index`` (1-based) of scan ``name``: ``NAME_data_000001.h5``."""
    return f"{name}_data_{index:06d}.h5"


# --------------------------------------------------------------------------------- writing


def _attrs(obj: h5py.HLObject, **attrs: object) -> None:
    for k, v in attrs.items():
        obj.attrs[k] = v


def write_master(
    path: Path,
    *,
    geometry: Geometry,
    frame_shape: tuple[int, int],
    positions_m: np.ndarray,
    frames_per_file: int,
    pixel_mask: np.ndarray | None = None,
    count_time_s: float = 0.1,
    description: str = "Dectris EIGER2 (beamflow simulator)",
    start_time: str | None = None,
    optics: ZonePlateOptics | None = None,
    propagation: str | None = None,
    focus_distance_m: float | None = None,
) -> None:
    """Write a master file promising ``len(positions_m)`` frames, atomically.

    Links to every planned data file are written now (dangling until the data file
    appears), as the frame count and positions are known before the scan starts.
    ``optics``: the zone plate and sample defocus, written as ``/entry/instrument/zone_plate``.
    """
    path = Path(path)
    name = scan_name(path)
    positions_m = np.asarray(positions_m, dtype=np.float64)
    n_frames = positions_m.shape[0]
    n_files = -(-n_frames // frames_per_file)
    h, w = frame_shape
    with atomic_h5(path) as f:
        entry = f.create_group("entry")
        _attrs(entry, NX_class="NXentry")
        if start_time is not None:
            entry["start_time"] = start_time
        data = entry.create_group("data")
        _attrs(data, NX_class="NXdata")
        for i in range(1, n_files + 1):
            data[f"data_{i:06d}"] = h5py.ExternalLink(data_file_name(name, i), DATA_KEY)
        inst = entry.create_group("instrument")
        _attrs(inst, NX_class="NXinstrument")
        beam = inst.create_group("beam")
        _attrs(beam, NX_class="NXbeam")
        wl = beam.create_dataset("incident_wavelength", data=geometry.wavelength_m / 1e-10)
        _attrs(wl, units="angstrom")
        if propagation is not None:
            beam["propagation"] = propagation
        if focus_distance_m is not None:
            _attrs(beam.create_dataset("focus_distance", data=focus_distance_m), units="m")
        det = inst.create_group("detector")
        _attrs(det, NX_class="NXdetector")
        det["description"] = description
        for key, value in (
            ("x_pixel_size", geometry.detector_pixel_size_m),
            ("y_pixel_size", geometry.detector_pixel_size_m),
            ("detector_distance", geometry.distance_m),
        ):
            _attrs(det.create_dataset(key, data=value), units="m")
        _attrs(det.create_dataset("count_time", data=count_time_s), units="s")
        det["bit_depth_image"] = np.uint32(32)
        spec = det.create_group("detectorSpecific")
        _attrs(spec, NX_class="NXcollection")
        spec["nimages"] = np.uint32(n_frames)
        spec["ntrigger"] = np.uint32(1)
        spec["x_pixels_in_detector"] = np.uint32(w)
        spec["y_pixels_in_detector"] = np.uint32(h)
        mask = np.zeros(frame_shape, np.uint32) if pixel_mask is None else pixel_mask
        spec.create_dataset("pixel_mask", data=np.asarray(mask, dtype=np.uint32), **_compression())
        if optics is not None:
            zp = inst.create_group("zone_plate")
            _attrs(zp, NX_class="NXfresnel_zone_plate")
            for key, value in (
                ("outer_diameter", optics.diameter_m),
                ("outermost_zone_width", optics.outer_zone_width_m),
                ("central_stop_diameter", optics.central_stop_fraction * optics.diameter_m),
                ("defocus", optics.defocus_m),
            ):
                _attrs(zp.create_dataset(key, data=float(value)), units="m")
            _attrs(
                zp["defocus"],
                description="sample position minus focus position along the beam; "
                "positive = sample downstream of the focus",
            )
        sample = entry.create_group("sample")
        _attrs(sample, NX_class="NXsample")
        pos = sample.create_group("positions")
        _attrs(
            pos,
            NX_class="NXcollection",
            description="probe position relative to the sample, one per frame, planned",
        )
        _attrs(pos.create_dataset("y", data=positions_m[:, 0]), units="m")
        _attrs(pos.create_dataset("x", data=positions_m[:, 1]), units="m")


def _compression() -> dict:
    import hdf5plugin  # noqa: PLC0415  (imported where used: _h5.register_filters says why)

    return dict(hdf5plugin.Bitshuffle(nelems=0, cname="lz4"))


def write_data_file(path: Path, frames: np.ndarray, image_nr_low: int) -> None:
    """Write one data file (frames ``image_nr_low`` … , 1-based) atomically, as an Eiger does."""
    frames = np.asarray(frames)
    if frames.ndim != 3:
        raise ValueError(f"frames must be (K, H, W), got {frames.shape}")
    k, h, w = frames.shape
    with atomic_h5(Path(path)) as f:
        entry = f.create_group("entry")
        _attrs(entry, NX_class="NXentry")
        g = entry.create_group("data")
        _attrs(g, NX_class="NXdata")
        ds = g.create_dataset(
            "data", data=frames.astype(np.uint32, copy=False), chunks=(1, h, w), **_compression()
        )
        _attrs(
            ds, image_nr_low=np.uint64(image_nr_low), image_nr_high=np.uint64(image_nr_low + k - 1)
        )


# --------------------------------------------------------------------------------- reading


def _data_links(f: h5py.File, master: Path) -> list[tuple[str, Path, str]]:
    """(link name, file, dataset key) for each ``/entry/data/data_NNNNNN``, in order."""
    group = f.get(DATA_GROUP)
    if not isinstance(group, h5py.Group):
        raise ScanFormatError(master, DATA_GROUP, "missing (no data links)")
    names = sorted(k for k in group if _LINK_RE.match(k))
    if not names:
        raise ScanFormatError(master, DATA_GROUP, "no data_NNNNNN links")
    out = []
    for i, n in enumerate(names, start=1):
        if int(_LINK_RE.match(n).group(1)) != i:
            raise ScanFormatError(
                master, f"{DATA_GROUP}/{n}", f"data links not numbered 1..N (expected data_{i:06d})"
            )
        link = group.get(n, getlink=True)
        key = f"{DATA_GROUP}/{n}"
        if isinstance(link, h5py.ExternalLink):
            target = Path(link.filename)
            # Link targets come from the file's writer: keep them inside the scan directory.
            if target.is_absolute() or ".." in target.parts:
                raise ScanFormatError(
                    master, key, f"external link leaves the scan directory: {link.filename}"
                )
            out.append((key, master.parent / target, link.path))
        elif isinstance(link, h5py.HardLink):
            out.append((key, master, key))  # frames stored inside the master itself
        else:
            raise ScanFormatError(master, key, f"unsupported link type {type(link).__name__}")
    return out


def _probe_data(
    file: Path, key: str, link: str, master: Path
) -> tuple[int, tuple[int, int], np.dtype]:
    """Frames in one data file, checking it opens and its last frame decodes."""
    if not file.exists():
        raise ScanFormatError(master, link, f"data file {file.name} does not exist (yet)")
    with open_h5(file) as f:
        ds = frame_stack(f, file, key, count="K")
        try:
            last = ds[ds.shape[0] - 1]
        except (OSError, ValueError) as exc:
            raise ScanFormatError(
                file, key, f"last frame cannot be read: truncated or corrupt ({exc})"
            ) from exc
        if not np.issubdtype(last.dtype, np.number) or np.issubdtype(
            last.dtype, np.complexfloating
        ):
            raise ScanFormatError(file, key, f"frames must be real numbers, found {ds.dtype}")
        return int(ds.shape[0]), (int(ds.shape[1]), int(ds.shape[2])), ds.dtype


def _expected_frames(f: h5py.File, master: Path) -> int | None:
    if NIMAGES not in f:
        return None
    n = read_scalar(f, master, NIMAGES)
    t = read_scalar(f, master, NTRIGGER) if NTRIGGER in f else 1.0
    if n < 0 or t < 0 or n != int(n) or t != int(t):
        raise ScanFormatError(
            master, NIMAGES, f"frame count must be a whole number ≥ 0, found {n}×{t}"
        )
    return int(n) * int(t)


def scan_progress(master_path: Path) -> tuple[int, int | None]:
    """(frames readable now, frames the master promises) — cheap, for readiness checks.

    Counts the frames of complete, readable data files in link order and stops at the first
    missing or unreadable one, so a data file still being written never counts. Raises
    ScanFormatError only when the master itself cannot be read.
    """
    count, expected, _ = scan_progress_detail(master_path)
    return count, expected


def scan_progress_detail(master_path: Path) -> tuple[int, int | None, ScanFormatError | None]:
    """:func:`scan_progress` and why the count stops where it does: None when the next data
    file is simply not there (yet), else the reader's complaint about the data file that is
    there under its final name but cannot be read (truncated, corrupt, wrong rank)."""
    master = Path(master_path)
    with open_h5(master) as f:
        expected = _expected_frames(f, master)
        links = _data_links(f, master)
    count = 0
    for link, file, key in links:
        if not file.exists():
            return count, expected, None
        try:
            n, _, _ = _probe_data(file, key, link, master)
        except ScanFormatError as exc:
            return count, expected, exc
        count += n
    return count, expected, None


def _geometry(f: h5py.File, master: Path) -> Geometry:
    px = read_length_m(f, master, X_PIXEL_SIZE)
    py = read_length_m(f, master, Y_PIXEL_SIZE)
    if not np.isclose(px, py, rtol=1e-6):
        raise ScanFormatError(
            master, X_PIXEL_SIZE, f"non-square pixels ({px} m × {py} m) are not supported"
        )
    distance = read_length_m(f, master, DISTANCE)
    if WAVELENGTH in f:
        wl = read_scalar(f, master, WAVELENGTH) * length_scale(
            f[WAVELENGTH], master, WAVELENGTH, "angstrom"
        )
        if wl <= 0:
            raise ScanFormatError(master, WAVELENGTH, f"wavelength must be positive, found {wl} m")
        energy = 1.239841984e-6 / wl
    elif ENERGY in f:
        energy = read_scalar(f, master, ENERGY)
    else:
        raise ScanFormatError(master, WAVELENGTH, f"missing (and no {ENERGY} either)")
    try:
        return Geometry(energy_eV=energy, distance_m=distance, detector_pixel_size_m=px)
    except ValidationError as exc:
        problem = validation_text(exc, show_input=True, first_only=True)
        raise ScanFormatError(master, DETECTOR, f"invalid geometry: {problem}") from exc


def _positions(f: h5py.File, master: Path) -> np.ndarray:
    if POSITIONS not in f:
        raise ScanFormatError(master, POSITIONS, "missing: the master file has no scan positions")
    y = read_array(f, master, POS_Y, ndim=1)
    x = read_array(f, master, POS_X, ndim=1)
    if y.shape != x.shape:
        raise ScanFormatError(
            master, POSITIONS, f"y has {y.shape[0]} positions but x has {x.shape[0]}"
        )
    try:
        ys = y.astype(np.float64) * length_scale(f[POS_Y], master, POS_Y)
        xs = x.astype(np.float64) * length_scale(f[POS_X], master, POS_X)
    except (TypeError, ValueError) as exc:
        raise ScanFormatError(master, POSITIONS, f"positions are not numbers ({exc})") from exc
    return np.stack([ys, xs], axis=1)


def _regime(f: h5py.File, master: Path) -> tuple[str | None, float | None]:
    """The propagation regime and cone-beam focus distance the master records, if any."""
    propagation = None
    if PROPAGATION in f:
        raw = dataset(f, master, PROPAGATION)[()]
        propagation = raw.decode() if isinstance(raw, bytes) else str(raw)
        if propagation not in PROPAGATION_MODELS:
            raise ScanFormatError(master, PROPAGATION, f"must be one of "
                                  f"{', '.join(PROPAGATION_MODELS)}, found {propagation!r}")
    focus = None
    if FOCUS_DISTANCE in f:
        focus = read_length_m(f, master, FOCUS_DISTANCE)
        if not (np.isfinite(focus) and focus > 0):
            raise ScanFormatError(master, FOCUS_DISTANCE, f"must be positive, found {focus} m")
    return propagation, focus


def _optics(f: h5py.File, master: Path) -> ZonePlateOptics | None:
    """The zone plate and defocus, or None when the master records no zone plate."""
    if ZONE_PLATE not in f:
        return None
    if not isinstance(f.get(ZONE_PLATE), h5py.Group):
        raise ScanFormatError(master, ZONE_PLATE, "expected a group (NXfresnel_zone_plate)")
    diameter = read_length_m(f, master, ZP_DIAMETER)
    if diameter <= 0:
        raise ScanFormatError(master, ZP_DIAMETER, f"must be positive, found {diameter} m")
    zone = read_length_m(f, master, ZP_OUTER_ZONE)
    if zone <= 0:
        raise ScanFormatError(master, ZP_OUTER_ZONE, f"must be positive, found {zone} m")
    stop = read_length_m(f, master, ZP_STOP) if ZP_STOP in f else 0.0
    if not 0 <= stop < diameter:
        raise ScanFormatError(
            master, ZP_STOP, f"must be in [0, outer_diameter = {diameter} m), found {stop} m"
        )
    defocus = read_length_m(f, master, ZP_DEFOCUS) if ZP_DEFOCUS in f else 0.0
    return ZonePlateOptics(
        diameter_m=diameter,
        outer_zone_width_m=zone,
        central_stop_fraction=stop / diameter,
        defocus_m=defocus,
    )


def read_detector_scan(
    path: Path, *, max_frames: int | None = None, allow_partial: bool = False
) -> Scan:
    """Read an Eiger-style scan from its master file.

    Without ``allow_partial`` every frame the master promises must be present and readable
    (else ScanFormatError, naming the file). With it, the frames of the complete data files
    present now are used (a scan still being written, or one aborted early). ``max_frames``
    uses at most that many frames.
    """
    master = Path(path)
    header = _read_master(master)
    frames = _find_frames(master, header, max_frames, allow_partial)
    n_use = _frames_to_use(master, header, frames, max_frames, allow_partial)
    mask = _usable_pixels(master, header.mask_raw, frames.shape)
    planned = check_positions(master, POSITIONS, header.planned, header.geometry, frames.shape[0])
    return Scan(
        name=scan_name(master),
        source=master,
        format="eiger",
        geometry=header.geometry,
        positions_m=planned[:n_use].copy(),
        planned_positions_m=planned,
        mask=mask,
        n_frames=n_use,
        expected_frames=header.expected,
        _read=frames.read,
        _locate=frames.locate,
        checked_frames=tuple(end for end in frames.last_frames if end < n_use),
        optics=header.optics,
        propagation=header.propagation,
        focus_distance_m=header.focus_distance,
    )


@dataclass(frozen=True)
class _Master:
    """What the master file says about the scan."""

    expected: int | None  # frames promised (nimages·ntrigger), if recorded
    links: list[tuple[str, Path, str]]
    planned: np.ndarray  # (N, 2) positions, metres
    mask_raw: np.ndarray | None
    geometry: Geometry
    optics: ZonePlateOptics | None
    propagation: str | None
    focus_distance: float | None


def _read_master(master: Path) -> _Master:
    """Step 1: the master file's metadata, with one position per promised frame."""
    with open_h5(master) as f:
        expected = _expected_frames(f, master)
        links = _data_links(f, master)
        planned = _positions(f, master)
        mask_raw = read_array(f, master, PIXEL_MASK, ndim=2) if PIXEL_MASK in f else None
        geometry = _geometry(f, master)
        optics = _optics(f, master)
        propagation, focus_distance = _regime(f, master)
    header = _Master(expected, links, planned, mask_raw, geometry, optics, propagation,
                     focus_distance)
    if header.expected is not None and header.planned.shape[0] != header.expected:
        raise ScanFormatError(
            master,
            POSITIONS,
            f"frame/position count mismatch: {header.planned.shape[0]} positions "
            f"but the master promises {header.expected} frames",
        )
    return header


@dataclass(frozen=True)
class _Frames:
    """The frames found in the data files: where each lies, and how to read a range."""

    master: Path
    segments: list[tuple[Path, str, int, int]]  # (file, key, first frame, count)
    shape: tuple[int, int]

    @property
    def total(self) -> int:
        return sum(count for _, _, _, count in self.segments)

    @property
    def last_frames(self) -> list[int]:
        """The scan index of each data file's last frame (decoded when the file was found)."""
        return [first + count - 1 for _, _, first, count in self.segments]

    def read(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start, *self.shape), dtype=np.float32)
        for file, key, first, count in self.segments:
            lo, hi = max(start, first), min(stop, first + count)
            if lo >= hi:
                continue
            with open_h5(file) as fh:
                try:
                    out[lo - start : hi - start] = dataset(fh, file, key)[lo - first : hi - first]
                except (OSError, ValueError) as exc:
                    raise ScanFormatError(
                        file, key, f"frames {lo - first}..{hi - first - 1} cannot be read ({exc})"
                    ) from exc
        return out

    def locate(self, index: int) -> tuple[Path, str, str]:
        for file, key, first, count in self.segments:
            if first <= index < first + count:
                # Eiger numbers images from 1 (image_nr_low/high), in the file and the scan.
                return file, key, (f"frame {index - first + 1} of {count} in this file "
                                   f"(image {index + 1} of the scan, counted from 1)")
        return self.master, DATA_GROUP, f"image {index + 1} of the scan (counted from 1)"


def _find_frames(
    master: Path, header: _Master, max_frames: int | None, allow_partial: bool
) -> _Frames:
    """Step 2: the data files in link order, each opened and its last frame decoded; all of
    one frame shape. With ``allow_partial`` the scan stops at the first missing or unreadable
    file, else that file fails the read."""
    segments: list[tuple[Path, str, int, int]] = []
    total = 0
    frame_shape: tuple[int, int] | None = None
    for link, file, key in header.links:
        if max_frames is not None and total >= max_frames:
            break
        if not file.exists() and not allow_partial:
            expected = header.expected if header.expected is not None else "?"
            raise ScanFormatError(
                master,
                link,
                f"scan incomplete: data file {file.name} is missing "
                f"({total} of {expected} frames present)",
            )
        try:
            n, shape, _ = _probe_data(file, key, link, master)
            if frame_shape is None:
                frame_shape = shape
            elif shape != frame_shape:
                raise ScanFormatError(
                    file,
                    key,
                    f"frame shape {shape} differs from the first data file's {frame_shape}",
                )
        except ScanFormatError:
            if allow_partial:
                break
            raise
        segments.append((file, key, total, n))
        total += n
    if frame_shape is None or total == 0:
        raise ScanFormatError(master, DATA_GROUP, "no complete, readable data file yet")
    return _Frames(master, segments, frame_shape)


def _frames_to_use(
    master: Path, header: _Master, frames: _Frames, max_frames: int | None, allow_partial: bool
) -> int:
    """Step 3: how many frames the scan uses, once the counts of frames found, frames
    promised and positions planned agree (and the frames are square)."""
    total, expected, positions = frames.total, header.expected, header.planned.shape[0]
    if expected is not None and total > expected:
        raise ScanFormatError(
            master,
            DATA_GROUP,
            f"frame count mismatch: data files hold {total} frames "
            f"but the master promises {expected}",
        )
    n_use = total if max_frames is None else min(total, int(max_frames))
    if (
        not allow_partial
        and expected is not None
        and total < expected
        and (max_frames is None or max_frames > total)
    ):
        raise ScanFormatError(
            master, DATA_GROUP, f"scan incomplete: {total} of {expected} frames present"
        )
    if n_use > positions:
        raise ScanFormatError(
            master,
            POSITIONS,
            f"frame/position count mismatch: {n_use} frames but only {positions} positions",
        )
    if expected is None and max_frames is None and positions != total:
        raise ScanFormatError(
            master,
            POSITIONS,
            f"frame/position count mismatch: {total} frames but {positions} positions",
        )
    height, width = frames.shape
    if height != width:
        file, key, _, _ = frames.segments[0]
        raise ScanFormatError(file, key, f"frames must be square, found {height}×{width}")
    return n_use


def _usable_pixels(
    master: Path, mask_raw: np.ndarray | None, frame_shape: tuple[int, int]
) -> np.ndarray:
    """Step 4: the detector mask as usable pixels (True), from the Eiger pixel_mask bits."""
    if mask_raw is None:
        return np.ones(frame_shape, dtype=bool)
    if mask_raw.shape != frame_shape:
        raise ScanFormatError(
            master,
            PIXEL_MASK,
            f"shape {mask_raw.shape} differs from the frame shape {frame_shape}",
        )
    return mask_raw == 0
