"""The embedded local backend: beamflow's Globus Flows interpreter with local Transfer and
Compute action providers (one machine, no network). See :mod:`beamflow.local.backend`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from beamflow.local.backend import LocalBackend

__all__ = ["LocalBackend", "providers_for"]


def providers_for(settings: Any) -> Mapping[str, Any]:
    """The local action providers by ActionUrl, configured from ``settings`` (collections
    mapped to their roots, the compute endpoint to a GlobusComputeEngine): what ``beamflow flows
    run`` gives a definition to run against. Close them (``.close()``) when done."""
    from beamflow.local.compute import LocalComputeProvider
    from beamflow.local.transfer import LocalTransferProvider

    transfer = LocalTransferProvider.from_settings(settings)
    compute = LocalComputeProvider.from_settings(settings)
    return {transfer.url: transfer, compute.url: compute}
