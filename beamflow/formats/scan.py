"""The scan model every reader returns: geometry, positions, mask and lazily read frames."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

#: h·c in eV·m: λ[m] = HC_EV_M / E[eV].
HC_EV_M = 1.239841984e-6
#: One electronvolt in joules (CXI stores the source energy in joules).
EV_J = 1.602176634e-19


class Geometry(BaseModel):
    """Far-field geometry of a ptychography scan (SI units)."""

    model_config = ConfigDict(frozen=True)

    energy_eV: float = Field(gt=0, description="photon energy [eV]")
    distance_m: float = Field(gt=0, description="sample-detector distance [m]")
    detector_pixel_size_m: float = Field(gt=0, description="detector pixel pitch [m]")

    @property
    def wavelength_m(self) -> float:
        return HC_EV_M / self.energy_eV

    def object_pixel_size_m(self, frame_size: int) -> float:
        """Far-field object pixel size Δx = λ z / (N p) for N×N frames."""
        return self.wavelength_m * self.distance_m / (frame_size * self.detector_pixel_size_m)


class ZonePlateOptics(BaseModel):
    """The focusing optics a beamline records: a Fresnel zone plate and the sample's defocus.

    Read from ``/entry/instrument/zone_plate`` (NXfresnel_zone_plate) of an Eiger master file
    when present. ``defocus_m`` is the signed distance of the sample from the focus along the
    beam: positive = downstream of the focus (the beam diverges at the sample), negative =
    upstream (still converging). The focal length is ``f = D·d_r/λ``, the numerical aperture
    ``NA = λ/(2 d_r)``.
    """

    model_config = ConfigDict(frozen=True)

    diameter_m: float = Field(gt=0, description="outer diameter D [m]")
    outer_zone_width_m: float = Field(gt=0, description="outermost zone width d_r [m]")
    central_stop_fraction: float = Field(
        default=0.0, ge=0, lt=1, description="central stop diameter / D (0: none)"
    )
    defocus_m: float = Field(default=0.0, description="sample − focus along the beam [m]")

    def focal_length_m(self, energy_eV: float) -> float:
        """``f = D·d_r/λ`` (first diffraction order)."""
        return self.diameter_m * self.outer_zone_width_m * energy_eV / HC_EV_M


FrameReader = Callable[[int, int], np.ndarray]


@dataclass(eq=False, kw_only=True)
class Scan:
    """One ptychography scan, validated, with frames read on demand.

    ``positions_m`` are probe positions relative to the sample, ``(y, x)`` columns in metres,
    one row per frame available now (``n_frames``). ``planned_positions_m`` holds every
    position the scan file lists (a scan still being written promises more frames than it
    has): size the object from it so that a reconstruction can continue as frames arrive.
    ``mask`` is True on valid pixels. ``optics``: the zone plate and defocus the scan file
    records, None when it records none. ``propagation`` / ``focus_distance_m``: the regime
    and cone-beam focus distance the scan file records (None: it records none). Frames are
    in the detector view (as recorded: a far-field pattern has its zero frequency in the
    centre), raw counts as float32; invalid pixels keep whatever the detector wrote.
    """

    name: str
    source: Path
    format: str  # "eiger" | "cxi"
    geometry: Geometry
    positions_m: np.ndarray
    planned_positions_m: np.ndarray
    mask: np.ndarray
    n_frames: int
    expected_frames: int | None
    _read: FrameReader = field(repr=False)
    #: where frame i (0-based, of this scan) is stored: (file, dataset, "frame k of the
    #: file" in the file's own numbering); None: in ``source`` at index i
    _locate: Callable[[int], tuple[Path, str, str]] | None = field(default=None, repr=False)
    #: frames the reader decoded to check the files (the last of each data file), which a
    #: check of the frame values can look at for little more
    checked_frames: tuple[int, ...] = ()
    optics: ZonePlateOptics | None = None
    #: what the scan file says of the propagation regime ("far-field" / "near-field") and
    #: of a cone beam's focus-to-sample distance z1 [m]; None where it says nothing
    propagation: str | None = None
    focus_distance_m: float | None = None

    def __repr__(self) -> str:
        return (
            f"Scan(name={self.name!r}, format={self.format!r}, source={str(self.source)!r}, "
            f"n_frames={self.n_frames}, expected_frames={self.expected_frames}, "
            f"frame_shape={self.frame_shape}, valid_pixels={int(self.mask.sum())}, "
            f"geometry={self.geometry!r})"
        )

    @property
    def frame_shape(self) -> tuple[int, int]:
        return (int(self.mask.shape[0]), int(self.mask.shape[1]))

    @property
    def complete(self) -> bool:
        """All frames the scan file promises are here (always True when it promises none)."""
        return self.expected_frames is None or self.n_frames >= self.expected_frames

    @property
    def partial(self) -> bool:
        return not self.complete

    @property
    def object_pixel_size_m(self) -> float:
        return self.geometry.object_pixel_size_m(self.frame_shape[0])

    def locate(self, index: int) -> tuple[Path, str, str]:
        """(file, dataset, words) saying where frame ``index`` (0-based) of the scan is, in
        the numbering of the file that holds it (an Eiger data file counts from 1)."""
        if self._locate is not None:
            return self._locate(index)
        return self.source, "", f"frame index {index} (counted from 0)"

    def frames(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Frames ``start:stop`` (clipped to ``n_frames``) as float32 ``(n, H, W)``."""
        stop = self.n_frames if stop is None else min(int(stop), self.n_frames)
        start = int(start)
        if start < 0 or start > stop:
            raise IndexError(f"frames({start}, {stop}) outside 0..{self.n_frames}")
        if start == stop:
            return np.zeros((0, *self.frame_shape), dtype=np.float32)
        return self._read(start, stop)


#: Largest scan extent accepted, in object pixels. Positions are metres; a file that stores
#: them in µm or nm (or absolute stage counts) yields absurd extents, which would make the
#: engine allocate a gigantic object. 2**16 object pixels is several millimetres at typical
#: tens-of-nanometre pixels — far beyond any ptychography field of view.
MAX_SPAN_OBJECT_PIXELS = 2**16


def invalid_counts(block: np.ndarray) -> tuple[str, int] | None:
    """What is wrong with the first bad frame of ``block`` (frames × valid pixels) — a NaN or
    infinite value, or a negative count — and its row; None when every frame is clean.
    The one test of frame values, at readiness (a sample) and at reconstruction (all)."""
    finite = np.isfinite(block)
    if not finite.all():
        return "a NaN or infinite value", int(np.flatnonzero(~finite.all(axis=1))[0])
    if block.size and float(block.min()) < 0:
        return "a negative count", int(np.flatnonzero((block < 0).any(axis=1))[0])
    return None


def check_positions(
    file: str | Path, key: str, positions_m: np.ndarray, geometry: Geometry, frame_size: int
) -> np.ndarray:
    """Validate (N, 2) probe positions in metres; return them as float64.

    Negative values are legal (positions are relative to an arbitrary origin, usually the
    scan centre). Rejected: non-finite values, and extents that cannot be metres.
    """
    from .errors import ScanFormatError  # local: keep module import order trivial

    pos = np.asarray(positions_m, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[1] != 2:
        raise ScanFormatError(file, key, f"positions must be (N, 2), found shape {pos.shape}")
    if pos.shape[0] == 0:
        raise ScanFormatError(file, key, "no positions")
    bad = ~np.isfinite(pos).all(axis=1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ScanFormatError(
            file, key, f"{int(bad.sum())} non-finite (NaN/inf) positions, first at index {first}"
        )
    span_px = float(np.ptp(pos, axis=0).max()) / geometry.object_pixel_size_m(frame_size)
    if span_px > MAX_SPAN_OBJECT_PIXELS:
        raise ScanFormatError(
            file,
            key,
            f"positions span {span_px:.3g} object pixels (> {MAX_SPAN_OBJECT_PIXELS}); "
            "they must be in metres",
        )
    return pos
