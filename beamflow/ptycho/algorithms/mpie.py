"""mPIE — momentum-accelerated PIE.

A. M. Maiden, D. Johnson & P. Li, "Further improvements to the ptychographical iterative
engine", Optica 4, 736–745 (2017), section 4: rPIE's updates plus a heavy-ball momentum
applied every T positions. With O_ref the object at the last momentum step,

    v_O ← η·v_O + (O − O_ref),     O ← O + η·v_O,     O_ref ← O

and likewise for the probe (its own η). The batched engine applies it every
``momentum_every`` batches of rPIE (T = that many batches' positions). Low spatial
frequencies of a weak phase object, which a hologram encodes weakly and rPIE creeps along
for hundreds of iterations, move consistently from one momentum step to the next: the
velocity builds up along them (up to 1/(1−η) times the plain step) while the oscillating
high-frequency parts of the update average out of it.

The velocities and reference copies are algorithm memory: they are checkpointed
(:meth:`MPIE.device_extras`) so a resumed run continues bit-identically.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import Core
from .base import PartSums, Sweep
from .rpie import RPIE

__all__ = ["MPIE"]


class MPIE(RPIE):
    name = "mpie"
    batch_graphs = False  # the momentum step comes every few batches: host state

    def __init__(self, core: Core, params: Any):
        super().__init__(core, params)
        self._batches = 0
        self._obj_ref: Any = None
        self._obj_vel: Any = None
        self._probe_ref: Any = None
        self._probe_vel: Any = None

    # -- state ------------------------------------------------------------------------------
    _KEYS = ("mpie_object_ref", "mpie_object_velocity", "mpie_probe_ref",
             "mpie_probe_velocity")

    def device_extras(self) -> dict[str, Any]:
        if self._obj_ref is None:
            return {}
        arrays = (self._obj_ref, self._obj_vel, self._probe_ref, self._probe_vel)
        out: dict[str, Any] = dict(zip(self._KEYS, arrays, strict=True))
        out["mpie_batches"] = np.asarray([self._batches], np.int64)
        return out

    def load_extras(self, extras: dict[str, np.ndarray]) -> None:
        core = self.core
        if not all(k in extras for k in self._KEYS):
            return
        shapes = (core.obj.shape, core.obj.shape, core.probe.shape, core.probe.shape)
        arrays = [np.asarray(extras[k], np.complex64) for k in self._KEYS]
        if any(a.size != np.prod(s) for a, s in zip(arrays, shapes, strict=True)) or any(
                a.shape[-2:] != s[-2:] for a, s in zip(arrays, shapes, strict=True)):
            return  # a different object or probe: start the momentum afresh
        # A thin object's memory may be (H, W) (saved before objects had layers).
        dev = core.backend.to_device
        self._obj_ref, self._obj_vel, self._probe_ref, self._probe_vel = (
            dev(a.reshape(s)) for a, s in zip(arrays, shapes, strict=True))
        self._batches = int(np.asarray(extras.get("mpie_batches", [0]))[0])

    def modes_mixed(self, transform: Any) -> None:
        if self._probe_ref is None:
            return
        xp = self.core.xp
        t = xp.asarray(transform, np.complex64)
        self._probe_ref = xp.einsum("kl,lij->kij", t, self._probe_ref).astype(np.complex64)
        self._probe_vel = xp.einsum("kl,lij->kij", t, self._probe_vel).astype(np.complex64)

    def shifted(self, s: tuple[float, float]) -> None:
        # The reference frame moved: the accumulated velocity no longer points anywhere
        # meaningful. Start over from the shifted object and probe.
        self._obj_ref = None

    # -- the momentum step ------------------------------------------------------------------
    def _start(self) -> None:
        core, xp = self.core, self.core.xp
        self._obj_ref = core.obj.copy()
        self._obj_vel = xp.zeros_like(core.obj)
        self._probe_ref = core.probe.copy()
        self._probe_vel = xp.zeros_like(core.probe)

    def update(self, sw: Sweep, sums: list[PartSums]) -> None:
        if self._obj_ref is None:
            self._start()
        super().update(sw, sums)
        self._batches += 1
        if self._batches % self.params.momentum_every == 0:
            self._momentum(sw.update_object, sw.update_probe)

    def _momentum(self, update_object: bool, update_probe: bool) -> None:
        core, p = self.core, self.params
        if update_object:
            core.obj = _heavy_ball(core.obj, self._obj_ref, self._obj_vel, p.momentum_value)
            self._obj_ref = core.obj.copy()
        if update_probe:
            core.probe = _heavy_ball(core.probe, self._probe_ref, self._probe_vel,
                                     p.probe_momentum)
            self._probe_ref = core.probe.copy()
            core.probe_changed()


def _heavy_ball(x: Any, ref: Any, vel: Any, eta: float) -> Any:
    """v ← η·v + (x − ref); x ← x + η·v (``vel`` in place; returns x, updated in place)."""
    e = np.float32(eta)
    vel *= e
    vel += x
    vel -= ref
    x += e * vel
    return x
