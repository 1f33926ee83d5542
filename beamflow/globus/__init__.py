"""The Globus backend: Auth, Flows, Transfer and Compute (same rooms as beamflow.local).

``GlobusBackend`` is imported lazily: ``import beamflow.globus`` stays cheap for the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from beamflow.globus.backend import GlobusBackend

__all__ = ["GlobusBackend"]


def __getattr__(name: str) -> Any:
    if name == "GlobusBackend":
        from beamflow.globus.backend import GlobusBackend

        return GlobusBackend
    raise AttributeError(f"module 'beamflow.globus' has no attribute {name!r}")
