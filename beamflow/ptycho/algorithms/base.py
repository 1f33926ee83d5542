"""The algorithm base: batch selection, schedules, and the one sweep every algorithm runs.

A batch is processed in three steps (:meth:`Algorithm.run_batch`):

1. :meth:`~Algorithm.begin_batch` — the schedule's flags, the parts of the batch (one per
   host thread), the object accumulators' box, the object gradient for position steps;
2. the sweep (:meth:`~Algorithm.sweep_part`, the parts in parallel threads): per chunk of
   positions, the shifted probe and the object patches, the wave at the detector, the
   algorithm's exit-wave correction (:meth:`~Algorithm.exit_correction`: the Fourier
   constraint and the way back to the sample), the position steps, and what the algorithm
   takes from the chunk (:meth:`~Algorithm.chunk_update`: by default the object numerator
   into the part's accumulator and the probe terms);
3. :meth:`~Algorithm.update` — the algorithm's own step from the parts' sums; then the
   position steps are kept for :meth:`~Algorithm.apply_position_steps` at the end of the
   iteration.

An algorithm overrides only the hooks where it differs (PIE: the step rule; LSQ-ML: the
Poisson constraint and step lengths; DM: the exit-wave memory and the refits), so a faster
forward model or a new update rule is written once, here or in :mod:`.forward`. Every sum
over an object layer is kept per layer (``Sweep.accs[layer]``, ``PartSums.accs[layer]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..accumulators import ObjectAccumulator, ObjectSteps
from ..core import Chunk, Core
from ..forward import Waves, make_model
from ..gpu.graphs import BatchGraphs
from ..positions import clip_steps
from .batches import compact_batches, overlap_neighbours, random_batches, sparse_batches
from .opr import VariableProbe

__all__ = ["Algorithm", "PartSums", "Sweep"]

# Batch selections whose batches a CUDA graph may replay: random batches span the object
# (the whole object as their box costs nothing more); sparse sets update their windows in
# place and have no box. Compact batches each touch a small box of their own.
GRAPH_SELECTIONS = frozenset({"random", "sparse"})


@dataclass
class Sweep:
    """One batch in flight: what the schedule updates, and the buffers its parts share."""

    idx: np.ndarray
    it: int
    update_object: bool
    update_probe: bool
    correct_positions: bool
    parts: list[np.ndarray]  # one per host thread, deterministic
    bbox: tuple[slice, slice]  # the object region the batch's windows cover
    # per layer, per part: object (numerator, denominator), or None
    accs: list[list[ObjectAccumulator]] | None
    grads: Any  # what the model's position steps need (ThinModel.position_gradients), or None


@dataclass
class PartSums:
    """What one part of a batch (one host thread's positions) sums up during the sweep."""

    accs: list[ObjectAccumulator] | None  # the part's accumulator per layer (zero over the box)
    probe: bool = False  # whether the part sums the probe terms (into the two below)
    probe_num: Any = None  # Σ_j S_j^H[conj(O_j)χ_j] (see ThinModel.probe_terms); None until
    probe_den: Any = None  # Σ_j |O_j|²                  the first chunk's terms
    losses: list[Any] = field(default_factory=list)  # device scalars, one per chunk
    steps: list[Any] = field(default_factory=list)  # device (b, 2) position steps per chunk
    kept: list[Any] = field(default_factory=list)  # per-chunk values an algorithm keeps
    opr_steps: list[Any] = field(default_factory=list)  # variable probe: per-position steps


class Algorithm:
    """Base of the algorithms: batch selection, schedules, the sweep and its hooks.

    ``iterate`` in the engine calls :meth:`batches` then :meth:`run_batch` for each batch
    and sums the returned losses. Subclasses implement :meth:`update` and override the
    sweep's hooks where they differ; they may keep per-position memory in :meth:`device_extras`.
    """

    name = "base"
    # Whether the sweep accumulates the probe terms (DM sums them in a second pass).
    probe_terms_in_sweep = True
    # Whether a batch's work is a fixed sequence of launches on the device, with no state
    # kept on the host between batches, so that a CUDA graph can replay it (:mod:`.graphs`;
    # position steps and the variable probe are checked per batch in run_batch).
    batch_graphs = False

    def __init__(self, core: Core, params: Any):
        self.core = core
        self.params = params
        self.model = make_model(core, params)
        self.objects = ObjectSteps(core)
        self._neighbours: list[np.ndarray] | None = None
        self._neighbours_key: bytes | None = None
        self._pending: list[tuple[np.ndarray, list[Any]]] = []
        self.selection = self._resolve_selection()
        be = core.backend
        self.graphs = (BatchGraphs(be.xp, core.probe_changed)
                       if self.batch_graphs and be.fused and be.graphs else None)
        # The variable probe (orthogonal probe relaxation), when params.opr_modes > 0.
        self.opr: VariableProbe | None = None
        if params.opr_modes:
            self.opr = VariableProbe(core, params.opr_modes, params.opr_weight_smoothing,
                                     params.seed, params.probe_update_start)

    @classmethod
    def device_bytes(cls, params: Any, n: int, k: int, m: int) -> int:
        """Device memory the algorithm holds beyond the sweep's (for the memory plan)."""
        return 0

    # -- state ------------------------------------------------------------------------------
    def device_extras(self) -> dict[str, Any]:
        """Per-algorithm memory to checkpoint: the live arrays, on the device (not copies:
        the caller copies them, see :meth:`ArrayBackend.host_copy_async`, before the next
        batch changes them), or small host arrays."""
        return {}

    def load_extras(self, extras: dict[str, np.ndarray]) -> None:
        """Restore memory from host copies of :meth:`device_extras` (missing rows for new
        positions are rebuilt)."""

    def modes_mixed(self, transform: Any) -> None:
        """The probe modes were re-mixed (new = transform @ old); follow if needed."""

    def end_iteration(self, it: int) -> None:
        """Called after the last batch of iteration ``it``."""

    def shifted(self, s: tuple[float, float]) -> None:
        """Probe and object were moved by ``s`` (see Core.center_probe); follow if needed."""

    def device_memory(self) -> dict[str, Any]:
        """Everything to checkpoint, as :meth:`device_extras` gives it: the algorithm's
        and the variable probe's."""
        out = self.device_extras()
        if self.opr is not None:
            out.update(self.opr.device_extras())
        return out

    def load_memory(self, extras: dict[str, np.ndarray]) -> None:
        self.load_extras(extras)
        if self.opr is not None:
            self.opr.load_extras(extras)

    # -- batches ----------------------------------------------------------------------------
    def _resolve_selection(self) -> str:
        """The batch selection of this run: the parameters', with "auto" resolved. Random
        batches each span the whole object, so every batch pays an update over all of it;
        when that outweighs the batch's own windows, "auto" goes compact."""
        p, core = self.params, self.core
        object_px = core.H * core.W
        windows_px = 2 * p.batch_size_for(core.N) * core.M**2
        if p.selection == "random" and p.batch_selection == "auto" and object_px > windows_px:
            return "compact"
        return p.selection

    def batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        p, core = self.params, self.core
        n = core.N
        sel = self.selection
        if sel == "compact":
            return compact_batches(rng, core.corner, core.M, p.batch_size_for(n))
        if sel == "all":
            return [np.arange(n, dtype=np.int64)]
        if sel == "sparse":
            key = self.core.corner.tobytes()
            if key != self._neighbours_key:
                self._neighbours = overlap_neighbours(self.core.corner, self.core.M)
                self._neighbours_key = key
            return sparse_batches(rng, self._neighbours, p.batch_size)
        return random_batches(rng, n, p.batch_size_for(n))

    # -- schedules --------------------------------------------------------------------------
    def flags(self, it: int) -> tuple[bool, bool, bool]:
        """(update object, update probe, correct positions) at iteration ``it`` (0-based)."""
        p = self.params
        return (
            it >= p.object_update_start,
            it >= p.probe_update_start,
            bool(p.position_correction) and it >= p.position_correction_start,
        )

    # -- the sweep --------------------------------------------------------------------------
    def run_batch(self, idx: np.ndarray, it: int) -> list[Any]:
        """Sweep one batch and apply the algorithm's update; return the chunks' losses
        (device scalars). On a GPU, as a CUDA graph where the batch allows (:mod:`.graphs`):
        random batches (whose box is the whole object anyway) or sparse sets (no object
        box), one chunk, no position steps or variable probe to keep on the host."""
        graphs, core = self.graphs, self.core
        if (graphs is None or not graphs.enabled or self.selection not in GRAPH_SELECTIONS
                or self.opr is not None or self.flags(it)[2] or not core.graphable(len(idx))):
            return self._sweep_batch(idx, it)
        core.bind_batch(idx)
        try:
            key = (len(idx), self.flags(it), core.state_key())
            return graphs.run(key, lambda: self._sweep_batch(idx, it))
        finally:
            core.unbind()

    def _sweep_batch(self, idx: np.ndarray, it: int) -> list[Any]:
        sw = self.begin_batch(idx, it)
        sums = self.core.map_parts(lambda t, part: self.sweep_part(sw, t, part), idx)
        self.update(sw, sums)
        if self.opr is not None:
            self.opr.update([s for p in sums for s in p.opr_steps])
        if sw.correct_positions:
            self._pending.append((np.concatenate(sw.parts), [s for p in sums for s in p.steps]))
        return [v for p in sums for v in p.losses]

    def accumulates_object(self, update_object: bool) -> bool:
        """Whether the sweep sums the object update into per-part accumulators."""
        return update_object

    def begin_batch(self, idx: np.ndarray, it: int) -> Sweep:
        """The batch's flags, parts and shared buffers; the probe caches filled before the
        threads read them."""
        core = self.core
        upd_obj, upd_probe, pos_corr = self.flags(it)
        parts = core.split(idx)
        accs = self.objects.accumulators(len(parts)) if self.accumulates_object(upd_obj) else None
        bb = core.bbox(idx)
        grads = self.model.position_gradients() if pos_corr else None
        core.prepare()
        if self.opr is not None:
            self.opr.prepare()
        return Sweep(idx=idx, it=it, update_object=upd_obj, update_probe=upd_probe,
                     correct_positions=pos_corr, parts=parts, bbox=bb, accs=accs, grads=grads)

    def sweep_part(self, sw: Sweep, t: int, part: np.ndarray) -> PartSums:
        """The forward model, the correction and the update terms for part ``t``, chunk by
        chunk (runs in the part's thread)."""
        core, model = self.core, self.model
        accs = None
        if sw.accs is not None:
            accs = [layer[t] for layer in sw.accs]
            for acc in accs:
                self.objects.start(acc, sw.bbox)
        sums = PartSums(accs)
        if sw.update_probe and self.probe_terms_in_sweep:
            sums.probe = True
        for sub in core.subchunks(part):
            c = core.chunk(sub)
            pd = model.shifted_probe(c) if self.opr is None else self.opr.shifted_probe(c)
            w = model.forward(pd, c)
            loss, chi = self.exit_correction(sw, c, w.detector)
            sums.losses.append(loss)
            chis = model.backward(w, chi, c)
            if sw.grads is not None:
                sums.steps.append(model.position_steps(w, chis, sw.grads, c))
            if self.opr is not None and sw.update_probe and self.opr.learns(sw.it):
                sums.opr_steps.append(self.opr.chunk_steps(c, w.patches[0], chis[0]))
            self.chunk_update(sw, sums, c, w, chis)
        return sums

    # -- hooks ------------------------------------------------------------------------------
    def fourier_constraint(self, big: Any, c: Chunk, scale: Any = None) -> Any:
        """Turn the detector wave Ψ in place into the detector-plane correction (times
        ``scale`` when one is given); return the chunk's loss. Default: the modulus
        projection, χ̂ = Ψ' − Ψ."""
        return self.model.modulus_projection(big, c, scale)

    def exit_correction(self, sw: Sweep, c: Chunk, big: Any) -> tuple[Any, Any]:
        """(loss, χ): the chunk's loss and its exit-wave correction at the last layer's exit
        plane (may reuse ``big``). On a GPU the inverse FFT's 1/M² is made with the
        correction (:attr:`.core.Core.ifft_scale`)."""
        scale = self.core.ifft_scale
        loss = self.fourier_constraint(big, c, scale)
        return loss, self.model.to_sample(big, c, scaled=scale is not None)

    def chunk_update(self, sw: Sweep, sums: PartSums, c: Chunk, w: Waves,
                     chis: list[Any]) -> None:
        """Take what the update needs from a chunk (its waves ``w`` and each layer's
        correction ``chis``). Default: Σ conj(ψ_j)χ_j and the illumination of each layer
        into the part's object accumulators, and the probe terms (this spends the incident
        waves and the corrections)."""
        model = self.model
        if sums.accs is not None:
            for layer, acc in enumerate(sums.accs):
                model.accumulate_object(acc, w, chis, c, layer)
        if sums.probe:
            sums.probe_num, sums.probe_den = model.probe_terms(w, chis, c, sums.probe_num,
                                                               sums.probe_den)

    def update(self, sw: Sweep, sums: list[PartSums]) -> None:  # pragma: no cover
        """Update object and probe from the parts' sums (in part order)."""
        raise NotImplementedError

    # -- shared pieces ----------------------------------------------------------------------
    @staticmethod
    def probe_sums(sums: list[PartSums]) -> tuple[Any, Any]:
        """The parts' probe terms summed into the first part's (in part order)."""
        num, den = sums[0].probe_num, sums[0].probe_den
        for s in sums[1:]:
            num += s.probe_num
            den += s.probe_den
        return num, den

    def apply_position_steps(self) -> None:
        """Add the iteration's clipped position steps to the positions, with one copy from
        the device.

        A batch's steps wait for the end of the iteration: a position belongs to one batch
        of an iteration, so applying them at once moves every position exactly as applying
        them after each batch would, without reading the device once per batch."""
        core, xp = self.core, self.core.xp
        pending, self._pending = self._pending, []
        steps = [s for _, batch in pending for s in batch]
        if not steps:
            return
        st = core.backend.to_host(xp.concatenate(steps)).astype(np.float64)
        idx = np.concatenate([i for i, _ in pending])
        pos = core.pos.copy()
        pos[idx] += clip_steps(st, self.params.position_step_limit_px)
        core.set_positions(pos)
