"""The embedded local backend: beamflow's Globus Flows interpreter with local Transfer and
Compute action providers (one machine, no network). See :mod:`beamflow.local.backend`.

The public API, all that code outside this package uses (tests/test_architecture.py checks
it): ``LocalRunBackend`` (the run backend: ``beamflow.run_backends.get_run_backend``), and
the offline flow tool of `beamflow flows validate|run` (:mod:`beamflow.local.flowtool`):
``check_flow``, ``run_flow``, ``providers_for``, ``load_flow`` and ``FlowToolError``;
``check_local``, `beamflow doctor` of a local workspace (:mod:`beamflow.local.doctor`), and
``check_local_workers``, the worker probe of `beamflow doctor --probe`
(:mod:`beamflow.local.worker_check`).
"""

from __future__ import annotations

from beamflow.local.backend import LocalRunBackend
from beamflow.local.doctor import check_local
from beamflow.local.flowtool import (
    FlowCheck,
    FlowToolError,
    check_flow,
    load_flow,
    providers_for,
    run_flow,
)
from beamflow.local.worker_check import check_local_workers

__all__ = [
    "FlowCheck",
    "FlowToolError",
    "LocalRunBackend",
    "check_flow",
    "check_local",
    "check_local_workers",
    "load_flow",
    "providers_for",
    "run_flow",
]
