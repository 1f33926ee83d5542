"""The measured frames as the engine reads them, on the device or streamed from the host.

The engine fits amplitudes √I. They are stored either as float32 amplitudes or — when the
frames are photon counts below 2¹⁶ and the backend asks for it (``compact_frames``, on by
default on a GPU) — as uint16 counts, half the memory, with the square root taken per chunk
(exactly: a float32 square root of an exactly represented integer, as at load).

When the frames do not fit in the device memory the engine plans for, they stay in host
memory (page-locked on a GPU) and each chunk's rows are copied in when it is processed: a
scan larger than the device still runs, at the host link's pace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .arrays import ArrayBackend

__all__ = ["Frames", "frames_are_counts", "load_frames"]

# Frames per block when preparing the data (bounds the temporaries).
DATA_BLOCK = 64
COUNTS_MAX = 2**16 - 1


def frames_are_counts(intensities: np.ndarray, mask: np.ndarray) -> bool:
    """Whether every valid pixel holds an integer in [0, 2¹⁶) (one pass over the frames)."""
    for s in range(0, intensities.shape[0], DATA_BLOCK):
        v = intensities[s : s + DATA_BLOCK][:, mask]
        if v.size and not (v.min() >= 0 and v.max() <= COUNTS_MAX
                           and np.array_equal(v, np.rint(v))):
            return False
    return True


class Frames:
    """√I per position: ``amplitudes(idx, didx)`` gives a chunk's rows on the device."""

    def __init__(self, backend: ArrayBackend, values: np.ndarray, counts: bool,
                 resident: bool):
        self.backend = backend
        self.counts = counts
        self.resident = resident
        self.data = backend.to_device(values) if resident else values

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def raw(self, idx: np.ndarray, didx: Any) -> Any:
        """The stored rows (float32 amplitudes or uint16 counts) on the device, a new array."""
        if self.resident:
            return self.data[didx]
        return self.backend.rows_to_device(self.data, idx)

    def rows(self, idx: np.ndarray, didx: Any) -> tuple[Any, Any]:
        """(stack, rows): the frames of ``idx`` as a fused kernel reads them where they lie —
        the resident stack and the device indices of its rows, or the rows streamed to the
        device and None (row j is position j's)."""
        if self.resident:
            return self.data, didx
        return self.backend.rows_to_device(self.data, idx), None

    def amplitudes(self, idx: np.ndarray, didx: Any) -> Any:
        """√I of the rows, float32 on the device, a new array."""
        rows = self.raw(idx, didx)
        if not self.counts:
            return rows
        xp = self.backend.xp
        return xp.sqrt(rows.astype(np.float32))


def load_frames(intensities: np.ndarray, mask: np.ndarray, backend: ArrayBackend,
                to_engine: Callable[[np.ndarray], np.ndarray], counts: bool,
                resident: bool, in_place: bool) -> tuple[Frames, float, float]:
    """Prepare the frames: engine order (``to_engine``), invalid pixels zeroed (they may
    hold NaN), √I or counts. Returns (frames, Σ valid I, max √I).

    ``mask`` is in engine order. ``in_place`` (CPU, float32 amplitudes): written over
    ``intensities``, block by block, so the frames are never held twice."""
    n = intensities.shape[0]
    dtype = np.uint16 if counts else np.float32
    if in_place and not counts:
        out = intensities
    elif resident:
        out = np.empty(intensities.shape, dtype)
    else:
        out = backend.host_buffer(intensities.shape, dtype)
    norm, top = 0.0, 0.0
    for s in range(0, n, DATA_BLOCK):
        blk = to_engine(intensities[s : s + DATA_BLOCK])
        blk[:, ~mask] = 0.0
        norm += float(blk.sum(dtype=np.float64))
        dst = out[s : s + DATA_BLOCK]
        if counts:
            np.rint(blk, out=blk)
            dst[...] = blk
        else:
            np.sqrt(blk, out=dst)
        if len(dst):
            top = max(top, float(dst.max()))
    max_amp = float(np.sqrt(np.float32(top))) if counts else top
    return Frames(backend, out, counts, resident), norm, max_amp
