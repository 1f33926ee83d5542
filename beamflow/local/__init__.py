"""The embedded local backend: beamflow's Globus Flows interpreter with local Transfer and
Compute action providers (one machine, no network). See :mod:`beamflow.local.backend`."""

from beamflow.local.backend import LocalBackend

__all__ = ["LocalBackend"]
