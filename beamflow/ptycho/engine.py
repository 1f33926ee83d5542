"""The reconstruction engine: initial guesses and the :class:`Reconstructor` loop.

Typical use::

    data = PtychoData(intensities, positions_px, object_shape, mask)
    params = ReconParams(algorithm="rpie", iterations=100)
    state = initial_state(data, params)                 # or ReconState.from_arrays(...)
    with Reconstructor(data, state, array_backend("auto")) as rec:
        state = rec.run(callback=lambda view, info: print(info))

Continuing with more frames of the same scan::

    data2 = data.append(new_frames, new_positions)
    state.extend_positions(new_positions)
    state = Reconstructor(data2, state).run(50)

Randomness (the batch partition of each iteration) comes from a counter-based generator
keyed by ``(rng_seed, rng_counter)`` — Philox seeded from that pair — and the counter is
part of the state, so k iterations, a save/restore through ``to_host_arrays()``/``meta()``,
and N−k more iterations reproduce an uninterrupted N-iteration run bit for bit (numpy
backend, same thread count).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .algorithms.base import Algorithm
from .algorithms.catalog import algorithm_class
from .arrays import ArrayBackend, HostCopy, array_backend
from .core import Core
from .forward.propagation import Propagation
from .modes import make_modes, orthogonalize_modes
from .positions import remove_drift
from .probe import (
    mean_counts_per_frame,
    probe_from_diffraction,
    probe_from_hologram,
    scale_probe,
)
from .state import PtychoData, ReconParams, ReconState

__all__ = ["PendingSnapshot", "Reconstructor", "StateView", "initial_state",
           "mean_pattern", "probe_from_data", "scale_probe", "counter_rng"]


# Stream offset for the RNG used by initial_state (so it never collides with iterations').
_INIT_STREAM = 2**62


def counter_rng(seed: int, counter: int) -> np.random.Generator:
    """The generator for draw number ``counter`` of run ``seed`` (Philox, counter-based)."""
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([int(seed),
                                                                         int(counter)])))


def mean_pattern(data: PtychoData) -> np.ndarray:
    """Mean measured intensity (M, M), detector view, invalid pixels 0."""
    acc = np.zeros(data.intensities.shape[1:], np.float64)
    for s in range(0, data.n_positions, 64):
        blk = data.intensities[s : s + 64].sum(axis=0, dtype=np.float64)
        acc += np.where(data.mask, blk, 0.0)  # invalid pixels may hold NaN
    return acc / data.n_positions


def probe_from_data(data: PtychoData, mean: np.ndarray | None = None,
                    propagation: Propagation | None = None) -> np.ndarray:
    """A probe guess from the mean measured amplitude √⟨I⟩, scaled to the counts. (M, M).

    Far field: √⟨I⟩ as the probe's far field with a flat phase
    (:func:`beamflow.ptycho.probe.probe_from_diffraction`); near field: √⟨I⟩ propagated
    back to the sample (:func:`beamflow.ptycho.probe.probe_from_hologram`).
    ``mean``: the mean pattern, when the caller has it already."""
    mean = mean_pattern(data) if mean is None else mean
    transfer = None if propagation is None else propagation.transfer(data.frame_size)
    if transfer is not None:
        return probe_from_hologram(mean, transfer, mask=data.mask)[0]
    return probe_from_diffraction(mean, mask=data.mask)[0]


def initial_state(data: PtychoData, params: ReconParams, probe: np.ndarray | None = None,
                  obj: np.ndarray | None = None) -> ReconState:
    """A fresh state: probe modes, object, nominal positions, iteration 0.

    probe: None → :func:`probe_from_data`; else an (M, M) or (K0, M, M) complex array (e.g.
    from ``beamflow.ptycho.probe``). With fewer than ``params.probe_modes_value`` modes, extra modes
    are made from the first by a small perturbation; with more, the strongest are kept. The
    modes are orthogonalised, ordered by power, and scaled so Σ|F[P]|² matches the mean
    counts per frame (for an object of unit amplitude).
    obj: None → ones (``params.slices`` layers of them); else an (H, W) complex array of
    ``data.object_shape``, or (S, H, W) with S = ``params.slices``.
    """
    if not isinstance(params, ReconParams):
        raise TypeError(f"params must be a ReconParams, got {type(params).__name__}")
    m, k = data.frame_size, params.probe_modes_value
    mean = mean_pattern(data)  # one pass over the frames serves the guess and the scale
    if probe is None:
        p = probe_from_data(data, mean, params.propagation)[None]
    else:
        p = np.asarray(probe)
        if p.ndim == 2:
            p = p[None]
        if p.ndim != 3 or p.shape[1:] != (m, m):
            raise ValueError(
                f"initial_state: probe has shape {np.shape(probe)}, expected ({m}, {m}) or "
                f"(modes, {m}, {m}) to match the {m}x{m} frames"
            )
        if not np.all(np.isfinite(p)):
            raise ValueError("initial_state: probe contains non-finite values")
        if not np.any(p):
            raise ValueError("initial_state: probe is all zeros")
        p = p.astype(np.complex64)
    rng = counter_rng(params.seed, _INIT_STREAM)
    if p.shape[0] > 1:
        p = orthogonalize_modes(p)
    if p.shape[0] > k:
        p = p[:k]
    elif p.shape[0] < k:
        extra = make_modes(p[0], k - p.shape[0] + 1, rng)[1:]
        p = orthogonalize_modes(np.concatenate([p, extra]).astype(np.complex64))
    p = scale_probe(p, mean_counts_per_frame(mean, data.mask), mask=data.mask,
                    transfer=params.propagation.transfer(m))
    h, w = data.object_shape
    shape = (h, w) if params.slices == 1 else (params.slices, h, w)
    if obj is None:
        o = np.ones(shape, np.complex64)
    else:
        o = np.asarray(obj)
        if o.shape != shape:
            raise ValueError(
                f"initial_state: object has shape {o.shape}, expected {shape} "
                f"(data.object_shape, {params.slices} layer(s))"
            )
        if not np.all(np.isfinite(o)):
            raise ValueError("initial_state: object contains non-finite values")
        o = o.astype(np.complex64)
    return ReconState(object=o, probe=p, positions_px=data.positions_px.copy(), params=params,
                      iteration=0, loss_history=[], rng_seed=params.seed, rng_counter=0)


class StateView:
    """What a callback sees: cheap scalars, and host copies on request."""

    def __init__(self, rec: Reconstructor):
        self._rec = rec

    @property
    def iteration(self) -> int:
        return self._rec.iteration

    @property
    def loss_history(self) -> list[float]:
        return list(self._rec.loss_history)

    @property
    def params(self) -> ReconParams:
        return self._rec.params

    @property
    def device(self) -> str:
        return self._rec.backend.name

    def object(self) -> np.ndarray:
        """Host copy of the current object, (H, W) complex64 or (S, H, W) for S layers."""
        return np.array(self._rec.backend.to_host(self._rec.object_array()), copy=True)

    def probe(self) -> np.ndarray:
        """Host copy of the current probe modes (K, M, M) complex64."""
        return np.array(self._rec.backend.to_host(self._rec.core.probe), copy=True)

    def positions(self) -> np.ndarray:
        return self._rec.core.pos.copy()

    def snapshot(self) -> ReconState:
        """The full state on the host (what a checkpoint stores)."""
        return self._rec.snapshot()

    def snapshot_async(self) -> PendingSnapshot:
        """The full state, copied to the host while the device goes on (``.result()``)."""
        return self._rec.snapshot_async()

    def stop(self) -> None:
        """Ask :meth:`Reconstructor.run` to return after this iteration."""
        self._rec.stop()


Callback = Callable[[StateView, dict[str, Any]], Any]


class Reconstructor:
    """Runs an algorithm on a backend, starting from (and producing) a :class:`ReconState`.

    ``state.params.algorithm`` selects the algorithm. ``state.positions_px`` must have one
    row per frame of ``data`` (after appending frames call ``state.extend_positions``).
    The object/probe live on the backend's device while running; :meth:`snapshot` copies
    them back. Use as a context manager (or call :meth:`close`) to release the thread pool.

    Memory: the measured amplitudes √I (float32, ifftshifted) live on the device; the
    Reconstructor keeps no reference to ``data``, so a caller that drops its PtychoData
    after construction holds about one copy of the frames, not two. With
    ``consume_data=True`` the data is spent: on the CPU the amplitudes are computed in place
    in ``data.intensities`` (the frames are never held twice, even briefly), and on either
    device ``data`` is marked consumed and refuses further use.
    """

    def __init__(self, data: PtychoData, state: ReconState, backend: ArrayBackend | str = "auto",
                 *, consume_data: bool = False):
        if isinstance(backend, str):
            backend = array_backend(backend)
        n = data.n_positions
        if state.positions_px.shape[0] != n:
            raise ValueError(
                f"Reconstructor: the state has {state.positions_px.shape[0]} positions but the "
                f"data has {n} frames; after PtychoData.append(...) call "
                "state.extend_positions(new_positions_px)"
            )
        if tuple(state.object.shape[-2:]) != tuple(data.object_shape):
            raise ValueError(
                f"Reconstructor: state object is {state.object.shape}, data.object_shape is "
                f"{data.object_shape}"
            )
        if state.probe.shape[1:] != (data.frame_size, data.frame_size):
            raise ValueError(
                f"Reconstructor: probe is {state.probe.shape[1:]}, frames are "
                f"{data.frame_size}x{data.frame_size}"
            )
        if state.layers != state.params.slices:
            raise ValueError(
                f"Reconstructor: the state's object has {state.layers} layer(s) but "
                f"params.slices={state.params.slices}"
            )
        if state.probe.shape[0] != state.params.probe_modes_value:
            raise ValueError(
                f"Reconstructor: probe has {state.probe.shape[0]} modes but params.probe_modes="
                f"{state.params.probe_modes_value}"
            )
        self.backend = backend
        # Re-validate: model_copy(update=...) skips pydantic's checks.
        self.params = ReconParams.model_validate(state.params.model_dump())
        algorithm = algorithm_class(self.params.algorithm_name)
        reserved = algorithm.device_bytes(self.params, n, self.params.probe_modes_value,
                                          data.frame_size)
        self.core = Core(data, state, backend, consume=consume_data, reserved_bytes=reserved)
        self.algorithm: Algorithm = algorithm(self.core, self.params)
        self.algorithm.load_memory(state.extras)
        self.iteration = int(state.iteration)
        self.loss_history = list(state.loss_history)
        self.rng_seed = int(state.rng_seed)
        self.rng_counter = int(state.rng_counter)
        self._stop = False
        self.view = StateView(self)

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        self.core.close()
        if self.algorithm.graphs is not None:
            self.algorithm.graphs.close()

    def __enter__(self) -> Reconstructor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stop(self) -> None:
        self._stop = True

    # -- iterations -------------------------------------------------------------------------
    def iterate(self) -> float:
        """Run one iteration; return its normalised amplitude loss."""
        core, p = self.core, self.params
        it = self.iteration
        rng = counter_rng(self.rng_seed, self.rng_counter)
        self.rng_counter += 1
        losses: list[Any] = []
        for batch in self.algorithm.batches(rng):
            losses.extend(self.algorithm.run_batch(batch, it))
        self.algorithm.apply_position_steps()
        self.algorithm.end_iteration(it)
        if p.slices > 1 and p.layer_regularization > 0 and self.algorithm.flags(it)[0]:
            self.algorithm.model.regularize(p.layer_regularization)
        if self.algorithm.opr is not None:
            self.algorithm.opr.end_iteration()
        loss = core.total(losses) / core.norm
        if core.K > 1 and (it + 1) % p.orthogonalize_every == 0:
            # Into the probe's own memory: the batches' CUDA graphs read it there (graphs.py).
            probe, transform = orthogonalize_modes(core.probe, core.xp, True)
            core.probe[...] = probe
            core.probe_changed()
            self.algorithm.modes_mixed(transform)
        if self.algorithm.flags(it)[2]:
            core.set_positions(remove_drift(core.pos, core.nominal))
        if p.centering:
            shift = core.center_probe()
            if shift is not None:
                self.algorithm.shifted(shift)
                if self.algorithm.opr is not None:
                    self.algorithm.opr.shifted(shift)
        if not np.isfinite(loss):
            raise FloatingPointError(
                f"reconstruction diverged at iteration {it + 1} ({p.algorithm_name}): "
                f"loss is {loss}"
            )
        self.iteration += 1
        self.loss_history.append(float(loss))
        return float(loss)

    def run(self, n_iterations: int | None = None, callback: Callback | None = None) -> ReconState:
        """Run ``n_iterations`` (default: up to ``params.iterations`` in total).

        ``callback(view, info)`` is called after every iteration with ``info`` =
        ``{"iteration", "loss", "seconds"}`` (iteration = iterations completed so far);
        ``view.snapshot()`` gives a host state, ``view.stop()`` ends the run early.
        Returns the final state on the host.
        """
        n = max(0, self.params.iterations - self.iteration) if n_iterations is None else int(
            n_iterations)
        if n < 0:
            raise ValueError(f"n_iterations must be >= 0, got {n_iterations}")
        self._stop = False
        for _ in range(n):
            t0 = time.perf_counter()
            loss = self.iterate()
            self.backend.synchronize()
            dt = time.perf_counter() - t0
            if callback is not None:
                callback(self.view, {"iteration": self.iteration, "loss": loss, "seconds": dt})
            if self._stop:
                break
        return self.snapshot()

    def object_array(self) -> Any:
        """The object on the device as a state holds it: (H, W) for one layer, else
        (S, H, W)."""
        return self.core.obj[0] if self.core.S == 1 else self.core.obj

    def snapshot(self) -> ReconState:
        """A host copy of the complete state (object, probe, positions, RNG, extras)."""
        return self.snapshot_async().result()

    def snapshot_async(self) -> PendingSnapshot:
        """Start copying the state to the host; the device goes on with the next iteration
        while the copy runs (GPU: device→page-locked host on a side stream). Call
        ``.result()`` for the :class:`ReconState`. The algorithm's memory (DM's exit waves,
        the variable probe's eigen-probes and weights, mPIE's velocities) travels the same
        way: nothing here reads the device."""
        be = self.backend
        extras = {k: be.host_copy_async(a) for k, a in self.algorithm.device_memory().items()}
        return PendingSnapshot(
            be.host_copy_async(self.object_array()), be.host_copy_async(self.core.probe),
            dict(positions_px=self.core.pos.copy(), params=self.params,
                 iteration=self.iteration, loss_history=list(self.loss_history),
                 rng_seed=self.rng_seed, rng_counter=self.rng_counter), extras)


class PendingSnapshot:
    """A :class:`ReconState` whose object, probe and algorithm memory are still on their
    way to the host."""

    def __init__(self, obj: HostCopy, probe: HostCopy, fields: dict[str, Any],
                 extras: dict[str, HostCopy] | None = None):
        self._obj, self._probe, self._fields = obj, probe, fields
        self._extras = extras or {}

    def result(self) -> ReconState:
        return ReconState(object=self._obj.result(), probe=self._probe.result(),
                          extras={k: c.result() for k, c in self._extras.items()},
                          **self._fields)
