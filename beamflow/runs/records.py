"""The run record and what is kept of it: a run (:class:`Run`, its :class:`RunStatus`), its
steps, its earlier attempts and its events, as the run store gives them back.

Times are Unix seconds, shown as ISO 8601 UTC in the models' JSON.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field, field_serializer

from beamflow.error_kinds import ErrorKind


class RunStatus(StrEnum):
    QUEUED = "QUEUED"
    ACTIVE = "ACTIVE"
    INACTIVE = "INACTIVE"  # Globus: waiting on something a person must do (e.g. consent)
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _elapsed(started_at: float | None, finished_at: float | None) -> float | None:
    """Seconds from start to end, or to now while it runs; None before it starts."""
    if started_at is None:
        return None
    return (finished_at or time.time()) - started_at


class _Timed(BaseModel):
    @field_serializer("*", when_used="json")
    def _times(self, value: Any, info: Any) -> Any:
        if info.field_name.endswith("_at") or info.field_name == "time":
            return _iso(value)
        return value


class Run(_Timed):
    id: str
    scan_name: str  # the scan's short name (its directory, or file without _master.h5)
    scan_path: str  # the scan's one path: absolute, as the user's files are on the beamline
    flow: str
    backend: str
    status: RunStatus
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    updated_at: float
    error: str | None = None
    error_step: str | None = None
    error_kind: ErrorKind | None = None  # what kind of fault ended it: decides retries
    parameters: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any] = Field(default_factory=dict)
    product: str | None = None
    previews: list[str] = Field(default_factory=list)
    current_step: str | None = None
    iteration: int | None = None
    iterations_total: int | None = None
    backend_run_id: str | None = None
    label: str | None = None
    attempt: int = 1
    parent_run_id: str | None = None
    fraction: float | None = None
    dedupe_key: str | None = None
    retried_by: str | None = None  # the one run that retries this one (see Store.add_retry)
    # Trust in the reconstruction, from its summary when it arrived (None: none finished).
    verdict: Literal["trusted", "suspect"] | None = None
    verdict_reasons: list[str] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def duration(self) -> float | None:
        return _elapsed(self.started_at, self.finished_at)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def retry_refusal(self) -> str | None:
        """Why a new attempt of this run is refused, in a sentence (None: it may be retried).
        One failed run has at most one retry; one that failed on bad input would only fail
        again."""
        if not self.status.finished:
            return f"run {self.id} is {self.status.value}: cancel it before retrying"
        if self.status == RunStatus.SUCCEEDED:
            return (f"run {self.id} succeeded; start a new run of the scan with "
                    "`beamflow runs start`")
        if self.retried_by:
            return f"run {self.id} was retried already, as run {self.retried_by}"
        if self.error_kind == ErrorKind.BAD_INPUT:
            return (f"run {self.id} failed on bad input: a retry would not help; fix the scan "
                    "or the parameters and start a new run")
        return None

    def new_attempt(self, backend: str) -> Run:
        """A QUEUED copy of this run (same scan, flow, parameters and fraction) on
        ``backend``, linked to it: nothing of this attempt's outcome is carried over."""
        now = time.time()
        return Run(
            **self.model_dump(include=_REQUEST_FIELDS),
            id=str(uuid.uuid4()),
            backend=backend,
            status=RunStatus.QUEUED,
            created_at=now,
            updated_at=now,
            parent_run_id=self.id,
            attempt=self.attempt + 1,
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def truth_nrmse(self) -> float | None:
        """The demo's score against the simulator's ground truth (``result.truth``)."""
        truth = self.result.get("truth")
        nrmse = truth.get("nrmse") if isinstance(truth, dict) else None
        return float(nrmse) if isinstance(nrmse, int | float) else None


# What a run was asked to do; everything else of a run is its identity or its outcome.
_REQUEST_FIELDS = {"scan_name", "scan_path", "flow", "parameters", "fraction", "iterations_total"}


class Step(_Timed):
    run_id: str
    name: str
    status: str
    started_at: float | None = None
    finished_at: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


class Attempt(_Timed):
    """One attempt of a run: the agent retries a run in its own record (``attempt`` goes
    up), so the run keeps each earlier attempt here, as it ended."""

    run_id: str
    attempt: int
    backend_run_id: str | None = None
    status: RunStatus  # how it ended (FAILED, or CANCELLED when the agent stopped), or stands
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    error_step: str | None = None
    error_kind: ErrorKind | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def duration(self) -> float | None:
        return _elapsed(self.started_at, self.finished_at)


class Event(_Timed):
    id: int
    run_id: str | None
    time: float
    level: str
    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)
