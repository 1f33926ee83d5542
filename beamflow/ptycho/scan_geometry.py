"""Where the scan lies on the object: metres of the scan file <-> pixels of the object array.

A :class:`ScanFrame` places the object array in the lab: the metres of its pixel (0, 0), the
object pixel size, the array's shape and the probe window's size. The engine works in the
top-left corners of the probe windows in object pixels (``corner = (pos - origin)/dx - M/2``);
the product and the scan file speak metres of the window's centre.
"""

from __future__ import annotations

import logging
import math

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel

from .state import ReconState

__all__ = ["ScanFrame", "grow_to_fit", "scan_extent"]

log = logging.getLogger(__name__)


class ScanFrame(BaseModel):
    """Metres <-> object pixels: corner_px = (pos_m - origin_m) / dx - M/2."""

    origin_m: tuple[float, float]  # metres of object pixel (0, 0), (y, x)
    pixel_size_m: float
    object_shape: tuple[int, int]
    frame_size: int

    def corners(self, positions_m: ArrayLike) -> np.ndarray:
        o = np.asarray(self.origin_m)
        return (np.asarray(positions_m, np.float64) - o) / self.pixel_size_m - self.frame_size / 2

    def to_metres(self, corners_px: ArrayLike) -> np.ndarray:
        o = np.asarray(self.origin_m)
        return (np.asarray(corners_px, np.float64) + self.frame_size / 2) * self.pixel_size_m + o

    def centre_m(self) -> tuple[float, float]:
        """(y, x) metres of the object array's centre (the product's ``center_*_m``)."""
        h, w = self.object_shape
        return (self.origin_m[0] + (h / 2) * self.pixel_size_m,
                self.origin_m[1] + (w / 2) * self.pixel_size_m)

    @classmethod
    def for_positions(cls, positions_m: ArrayLike, planned_m: ArrayLike, frame_size: int,
                      margin: int, pixel_size_m: float) -> ScanFrame:
        """An object big enough for every measured and PLANNED position (so that the later
        frames of a scan still being acquired fit too), with ``margin`` pixels around."""
        m = frame_size
        dx = pixel_size_m
        measured = np.asarray(positions_m, np.float64).reshape(-1, 2)
        planned = np.asarray(planned_m, np.float64).reshape(-1, 2)
        allpos = np.concatenate([planned, measured])
        lo = allpos.min(axis=0)
        origin = lo - (margin + m / 2) * dx
        span = (allpos.max(axis=0) - lo) / dx
        shape = tuple(int(math.ceil(s)) + m + 2 * margin + 1 for s in span)
        return cls(origin_m=(float(origin[0]), float(origin[1])), pixel_size_m=dx,
                   object_shape=(shape[0], shape[1]), frame_size=m)


def grow_to_fit(state: ReconState, frame: ScanFrame, corners: ArrayLike) -> ScanFrame:
    """Grow the object (new area = 1) when appended positions fall outside it; the state's
    positions move with the padding. Returns the frame of the (possibly) grown object."""
    m = frame.frame_size
    h, w = frame.object_shape
    c = np.rint(np.asarray(corners, np.float64))
    lo = np.floor(c.min(axis=0)).astype(int)
    hi = c.max(axis=0).astype(int) + m
    pad_top, pad_left = max(0, -int(lo[0])), max(0, -int(lo[1]))
    pad_bottom, pad_right = max(0, int(hi[0]) - h), max(0, int(hi[1]) - w)
    if not (pad_top or pad_left or pad_bottom or pad_right):
        return frame
    log.info("new positions leave the object: growing it by (%d, %d, %d, %d) px",
             pad_top, pad_bottom, pad_left, pad_right)
    layers = ((0, 0),) * (state.object.ndim - 2)  # a thick sample's layers grow alike
    state.object = np.pad(state.object, (*layers, (pad_top, pad_bottom), (pad_left, pad_right)),
                          constant_values=1).astype(np.complex64)
    state.positions_px = state.positions_px + np.array([pad_top, pad_left], np.float64)
    dx = frame.pixel_size_m
    origin = (frame.origin_m[0] - pad_top * dx, frame.origin_m[1] - pad_left * dx)
    return ScanFrame(origin_m=origin, pixel_size_m=dx, frame_size=m,
                     object_shape=state.object.shape[-2:])


def scan_extent(corners: ArrayLike, frame_size: int) -> tuple[int, int, int, int]:
    """``(row0, row1, col0, col1)`` object pixels covered by the probe windows."""
    c = np.rint(np.asarray(corners, np.float64)).astype(int)
    m = frame_size
    return (int(c[:, 0].min()), int(c[:, 0].max()) + m, int(c[:, 1].min()),
            int(c[:, 1].max()) + m)
