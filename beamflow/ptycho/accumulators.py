"""Object accumulators and the object steps made from them.

Every algorithm sums, over a batch's positions, the object terms of each layer into
object-sized accumulators — the numerator Σ_j conj(ψ_j)·χ_j and the denominator Σ_j |ψ_j|²
(ψ_j the wave incident on the layer: the shifted probe for the first) — one pair per host
thread's part of the batch and per layer, kept from batch to batch. The step is then made
over the batch's box of the object: preconditioned (rPIE, LSQ-ML's direction), a plain
fraction (ePIE) or a refit (DM).

On a GPU a pair is two views of one buffer (one scatter adds both), its scatter takes the
largest denominator on the way, and a preconditioned step is one pass over the box that adds
the step to the object and clears the pair where the batch reached (the next batch then
needs no zeroing): :meth:`ObjectSteps.update` and :class:`ObjectDirection` hide which.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ObjectAccumulator", "ObjectDirection", "ObjectSteps"]

# Object updates smaller than this run in the calling thread (a handoff costs ~50 µs).
PARALLEL_UPDATE_PX = 2**16

Box = tuple[slice, slice]


@dataclass
class ObjectAccumulator:
    """An object accumulator pair of one layer and one part of a batch."""

    num: Any  # (H, W) complex64: Σ_j conj(ψ_j)·χ_j
    den: Any  # (H, W) float32: Σ_j |ψ_j|²
    # GPU: the one float32 buffer of 3·H·W values that num and den are views of; else None.
    buffer: Any = None
    # GPU: the batch's chunks' largest denominators per block of threads, which the fused
    # scatter takes on the way (ArrayOps.object_terms; ObjectSteps.accumulated_max); else
    # None.
    maxima: list[Any] | None = None
    # Zero everywhere: the last batch's step cleared what the batch had added
    # (ObjectSteps.apply_step), so the next needs no zeroing pass.
    clean: bool = True


@dataclass
class ObjectDirection:
    """A layer's preconditioned direction ΔO = num / (den + α·max) over a batch's box.

    CPU: made in place in the first part's numerator (``array``, read over ``box`` only).
    GPU: never written over the object: ``acc`` and ``dmax`` stay, and the step systems and
    the step make ΔO where they read it."""

    layer: int
    box: Box
    shape: tuple[int, int]
    alpha: float
    array: Any = None
    acc: ObjectAccumulator | None = None
    dmax: Any = None


class ObjectSteps:
    """The object accumulators of the parts and layers, and the steps made from them."""

    def __init__(self, core: Any):
        self.core = core
        self._acc: list[list[ObjectAccumulator]] = []  # per layer, per part

    def accumulators(self, parts: int) -> list[list[ObjectAccumulator]]:
        """Per layer, ``parts`` persistent object-sized (numerator complex64, denominator
        float32) pairs.

        On a GPU each pair is two views of one buffer (:meth:`ArrayBackend.stacked_pair`), so
        a chunk's numerators and illumination go in with one scatter; on the CPU two arrays
        (its scatter is a loop of row-bound slice adds: one per array is the fastest)."""
        core = self.core
        be, h, w = core.backend, core.H, core.W
        while len(self._acc) < core.S:
            self._acc.append([])
        for layer in self._acc:
            while len(layer) < parts:
                if be.is_gpu:
                    buf, num, den = be.stacked_pair((h, w), zeroed=True)
                    layer.append(ObjectAccumulator(num, den, buf, []))
                else:
                    layer.append(ObjectAccumulator(be.xp.zeros((h, w), np.complex64),
                                                   be.xp.zeros((h, w), np.float32)))
        return [layer[:parts] for layer in self._acc[: core.S]]

    @staticmethod
    def start(acc: ObjectAccumulator, bb: Box) -> None:
        """Ready ``acc`` for a batch whose windows lie in the box ``bb``: zeroed there, unless
        the last batch's step left it clean.

        A GPU's accumulator that is not clean is zeroed whole: a step that clears only its
        own box must find zeros everywhere else."""
        if acc.maxima is not None:
            acc.maxima.clear()
        if acc.clean:
            return
        if acc.maxima is not None:
            acc.buffer.fill(0)
        else:
            acc.num[bb] = 0
            acc.den[bb] = 0

    @staticmethod
    def combine(accs: Sequence[ObjectAccumulator], bb: Box) -> tuple[Any, Any]:
        """Sum the parts' accumulators over the box ``bb`` into the first (in part order) and
        return its views: no object-sized temporaries at the memory peak."""
        num, den = accs[0].num[bb], accs[0].den[bb]
        for a in accs[1:]:
            num += a.num[bb]
            den += a.den[bb]
        return num, den

    @staticmethod
    def fused(accs: Sequence[ObjectAccumulator]) -> bool:
        """Whether the object step from ``accs`` is one kernel over the box that also clears
        the accumulator (:meth:`apply_step`): a GPU's, one part."""
        return len(accs) == 1 and accs[0].maxima is not None

    def apply_step(self, acc: ObjectAccumulator, layer: int, bb: Box, dmax: Any, c_den: float,
                   c_max: float, step: Any = None) -> None:
        """GPU: ``obj[layer][bb] += step · num / (c_den·den + c_max·dmax)`` from ``acc``,
        which then holds zeros again (clean) (:meth:`.kernels.GpuKernels.apply_step`;
        ``dmax`` from :meth:`accumulated_max`, ``step`` a 0-d device array or None)."""
        core = self.core
        core.backend.kernels.apply_step(core.obj[layer], acc.buffer, dmax, bb, c_den, c_max,
                                        step)
        acc.clean = True

    def accumulated_max(self, acc: ObjectAccumulator) -> Any:
        """GPU: the largest denominator of ``acc`` this batch, from the maxima the scatter
        took (a 0-d float32 device array; one reduction of a few thousand values instead of a
        pass over the box)."""
        most = acc.maxima
        return (most[0] if len(most) == 1 else self.core.xp.concatenate(most)).max()

    def update(self, accs: Sequence[ObjectAccumulator], layer: int, bb: Box,
               step: Callable[[Any, Any, Any, Box], Any], replace: bool = False,
               write: bool = True, preconditioner: tuple[float, float] | None = None) -> None:
        """Apply an accumulated step to object layer ``layer`` over the box ``bb``, in row
        slabs in parallel.

        ``step(num, den, den_max, region)`` gets the summed numerator/denominator of a slab
        (it may overwrite them) and the maximum of the whole denominator, and returns the
        increment (or, with ``replace``, the new values) for the object's ``region``.
        ``write=False``: nothing is written; a step that works in place leaves its results
        in the first accumulator's numerator over ``bb`` (where the parts' sums are
        combined) — no copy of the box. ``preconditioner`` (c_den, c_max): the step is
        num / (c_den·den + c_max·den_max), which a GPU adds to the object in one kernel that
        also clears the accumulator (:meth:`apply_step`).
        """
        core = self.core
        if preconditioner is not None and write and not replace and self.fused(accs):
            self.apply_step(accs[0], layer, bb, self.accumulated_max(accs[0]), *preconditioner)
            return
        area = (bb[0].stop - bb[0].start) * (bb[1].stop - bb[1].start)
        n = core.backend.threads if area >= PARALLEL_UPDATE_PX else 1
        rows = np.array_split(np.arange(bb[0].start, bb[0].stop), n)
        slabs = [(slice(int(r[0]), int(r[-1]) + 1), bb[1]) for r in rows if len(r)]
        combined = core.map_list(lambda _t, sl: self.combine(accs, sl), slabs)
        xp = core.xp
        if self.fused(accs):  # a GPU: the scatter took the maximum
            dmax = self.accumulated_max(accs[0])
        else:
            top = (_box_max(combined[0][1]) if len(combined) == 1
                   else xp.stack([_box_max(d) for _, d in combined]).max())
            dmax = core.backend.scalar(top)
        obj = core.obj[layer]

        def apply(t: int, sl: Box) -> None:
            num, den = combined[t]
            upd = step(num, den, dmax, sl)
            if not write:
                return
            if replace:
                obj[sl] = upd
            else:  # out= on the view: no copy of the view onto itself after
                region = obj[sl]
                xp.add(region, upd, out=region)

        core.map_list(apply, slabs)

    def direction(self, accs: Sequence[ObjectAccumulator], layer: int, bb: Box,
                  alpha: float) -> ObjectDirection:
        """The layer's preconditioned direction num / (den + α·max) (see
        :class:`ObjectDirection`)."""
        core = self.core
        d = ObjectDirection(layer, bb, (core.H, core.W), alpha)
        if self.fused(accs):
            d.acc, d.dmax = accs[0], self.accumulated_max(accs[0])
            return d
        be = core.backend

        def make(num: Any, den: Any, dmax: Any, _sl: Any) -> Any:
            return be.preconditioned_step(num, den, dmax, 1.0, alpha)

        self.update(accs, layer, bb, make, write=False)
        d.array = accs[0].num
        return d

    def add_direction(self, d: ObjectDirection, step: Any) -> None:
        """obj[layer] += step·ΔO over the direction's box (GPU: one pass that also clears
        the accumulator)."""
        core = self.core
        if d.acc is not None:
            self.apply_step(d.acc, d.layer, d.box, d.dmax, 1.0, d.alpha, step=step)
            return
        region = core.obj[d.layer][d.box]
        core.xp.add(region, step * d.array[d.box], out=region)


def _box_max(d: Any) -> Any:
    """The maximum of a 2-D box cut from a larger array, row by row first: CuPy reduces a
    strided view to one value on a single block (CUB takes contiguous input only), which
    took 1 ms for a 1100² box on an H100 — three quarters of an rPIE iteration's kernel
    time at 4000 × 128²; a row maximum is a kernel as wide as the box."""
    return d.max(axis=-1).max()
