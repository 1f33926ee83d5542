"""The run backend: the one interface the agent and the CLI use to register, start, follow
and cancel flow runs (:class:`RunBackend`, its error :class:`RunBackendError`, and what it
reports of a run). Not the engine's array backend (numpy or CuPy, ``ptycho.arrays``).

Two implementations sit behind it: ``beamflow.local`` (embedded, one machine) and
``beamflow.globus`` (Globus Flows, Transfer, Compute); both import this module and nothing
above it. Which one runs is chosen by configuration alone (``backend = "local" | "globus"``)
in :func:`beamflow.run_backends.get_run_backend`, above both, where runs are started;
callers never import either package directly.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field, ValidationError

from beamflow.error_kinds import ErrorKind
from beamflow.registry import RegistrationResult
from beamflow.runs.records import RunStatus


class RunBackendError(Exception):
    """The backend could not do what was asked. ``transient`` faults are worth a retry;
    ``kind`` says what kind of fault it is where the raiser knows better (a refused input)."""

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        step: str | None = None,
        kind: ErrorKind | None = None,
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.step = step
        self.kind = kind or (ErrorKind.TRANSIENT if transient else ErrorKind.FAILED)


class Progress(BaseModel):
    """How far a running step got, as a backend reports it among the step's details (the
    reconstruct function's iterations: ``progress.json`` in its output directory)."""

    iteration: int = Field(ge=0)
    iterations_total: int | None = Field(default=None, ge=1)
    loss: float | None = None


class StepInfo(BaseModel):
    """One step of a flow run, from the backend's run log."""

    name: str
    status: str  # ACTIVE, SUCCEEDED, FAILED, ...
    started_at: float | None = None
    finished_at: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)

    @property
    def progress(self) -> Progress | None:
        """The step's progress, where its details report one."""
        try:
            return Progress.model_validate(self.details)
        except ValidationError:
            return None


class FlowRunInfo(BaseModel):
    """Where a flow run stands, in terms the run store understands."""

    backend_run_id: str
    status: RunStatus
    steps: list[StepInfo] = Field(default_factory=list)
    output: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    error_step: str | None = None
    # What kind of fault ended it, where the backend knows (a lost run); otherwise the run
    # path reads it from the flow's failure record.
    error_kind: ErrorKind | None = None


@runtime_checkable
class RunBackend(Protocol):
    """What every backend offers. Names of flows and functions are the file stems in
    ``flows/`` and ``functions/`` (e.g. ``ptycho_reconstruct``, ``reconstruct``)."""

    name: str

    def register_functions(self, *, dry_run: bool = False) -> list[RegistrationResult]: ...

    def register_flows(self, *, dry_run: bool = False) -> list[RegistrationResult]: ...

    def start_run(
        self, flow: str, body: dict[str, Any], *, label: str, tags: list[str]
    ) -> str:
        """Start a run of a registered flow; returns the backend's run id."""
        ...

    def get_run(self, backend_run_id: str) -> FlowRunInfo: ...

    def cancel_run(self, backend_run_id: str) -> None: ...

    def close(self) -> None: ...
