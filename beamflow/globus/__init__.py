"""The Globus backend: Auth, Flows, Transfer and Compute (same rooms as beamflow.local).

The public API, all that code outside this package uses (tests/test_architecture.py checks
it): ``GlobusRunBackend`` (the run backend: ``beamflow.run_backends.get_run_backend``),
and the account tools of `beamflow login|logout|whoami|doctor`: ``interactive_auth`` (a
:class:`GlobusAuth` for a person at a terminal), ``expiry_warnings`` (of its tokens),
``run_checks`` (the doctor) and ``check_endpoint_workers`` (its worker probe, `doctor
--probe`); and ``validate_with_service``, the Flows service's own check of a definition
(`flows validate --remote`).

Each is imported on first use: the Globus SDKs take about 0.1 s to import, and
``import beamflow.globus`` stays cheap for the CLI and the local backend, which never need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from beamflow.globus.auth import GlobusAuth, expiry_warnings, interactive_auth
    from beamflow.globus.backend import GlobusRunBackend, validate_with_service
    from beamflow.globus.doctor import Check, run_checks
    from beamflow.globus.worker_check import check_endpoint_workers

__all__ = [
    "Check",
    "GlobusAuth",
    "GlobusRunBackend",
    "expiry_warnings",
    "check_endpoint_workers",
    "interactive_auth",
    "run_checks",
    "validate_with_service",
]


def __getattr__(name: str) -> Any:
    if name in ("GlobusRunBackend", "validate_with_service"):
        from beamflow.globus import backend

        return getattr(backend, name)
    if name in ("GlobusAuth", "expiry_warnings", "interactive_auth"):
        from beamflow.globus import auth

        return getattr(auth, name)
    if name == "check_endpoint_workers":
        from beamflow.globus.worker_check import check_endpoint_workers

        return check_endpoint_workers
    if name in ("Check", "run_checks"):
        from beamflow.globus import doctor

        return getattr(doctor, name)
    raise AttributeError(f"module 'beamflow.globus' has no attribute {name!r}")
