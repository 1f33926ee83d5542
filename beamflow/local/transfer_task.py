"""One transfer request run to the end, by its jobs: plan the files
(:mod:`~beamflow.local.transfer_plan`), copy each under a hidden temporary name and rename it
into place (:mod:`~beamflow.local.transfer_copy`), with ``verify_checksum`` verify each copy
in a pipeline beside the next (:mod:`~beamflow.local.transfer_verify`). This module holds the
request and the task that runs those jobs and reports on them. The contract users rely on is
in :mod:`beamflow.local.transfer`."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from beamflow.local.actions import iso_time
from beamflow.local.collection_paths import Collections, TransferRefused
from beamflow.local.transfer_copy import (
    BLOCK_SIZE,
    CHECKSUM_ALGORITHMS,
    DEFAULT_CHECKSUM,
    Checksum,
    Copier,
    CopyOptions,
    WriteHook,
)
from beamflow.local.transfer_plan import (
    PARTIAL_MARK,
    Canceled,
    Planner,
    Tally,
    TransferFault,
    TransferStats,
    check_cancel,
)
from beamflow.local.transfer_verify import VerifiedCopies

__all__ = [
    "BLOCK_SIZE", "CHECKSUM_ALGORITHMS", "DEFAULT_CHECKSUM", "LABEL_MAX", "PARTIAL_MARK",
    "SYNC_LEVELS", "TransferFault", "TransferItem", "TransferRequest", "TransferStats",
    "TransferTask", "WriteHook",
]

log = logging.getLogger(__name__)

SYNC_LEVELS = {"exists": 0, "size": 1, "mtime": 2, "checksum": 3}
LABEL_MAX = 128


# -- the request -----------------------------------------------------------------------------
class TransferItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source_path: str = Field(min_length=1)
    destination_path: str = Field(min_length=1)
    recursive: bool = False
    DATA_TYPE: Literal["transfer_item"] | None = None


class TransferRequest(BaseModel):
    """The body the Transfer action provider accepts (the fields that mean something here)."""

    model_config = ConfigDict(extra="forbid")

    source_endpoint: str = Field(min_length=1)
    destination_endpoint: str = Field(min_length=1)
    DATA: list[TransferItem] = Field(min_length=1)
    label: str | None = Field(default=None, max_length=LABEL_MAX)
    sync_level: int | None = Field(default=None, ge=0, le=3)
    verify_checksum: bool = False
    preserve_timestamp: bool = False
    encrypt_data: bool = False  # nothing crosses a network here
    skip_source_errors: bool = False
    fail_on_quota_errors: bool = False
    deadline: str | None = None
    notify_on_succeeded: bool = True
    notify_on_failed: bool = True
    notify_on_inactive: bool = True
    DATA_TYPE: Literal["transfer"] | None = None

    @field_validator("sync_level", mode="before")
    @classmethod
    def _sync_level(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in SYNC_LEVELS:
                raise ValueError(f"must be one of {', '.join(SYNC_LEVELS)} (or 0-3), not {value!r}")
            return SYNC_LEVELS[value]
        return value



class TransferTask:
    """One transfer request, run with :meth:`run` (synchronously) or by the provider."""

    def __init__(
        self,
        request: TransferRequest,
        collections: Collections,
        *,
        task_id: str | None = None,
        block_size: int = BLOCK_SIZE,
        checksum_algorithm: str = DEFAULT_CHECKSUM,
        max_checksum_retries: int = 2,
        after_write: WriteHook | None = None,
    ) -> None:
        self.request = request
        self.task_id = task_id or str(uuid.uuid4())
        self.algorithm = Checksum(checksum_algorithm).name  # fails now on an unknown one
        self.max_checksum_retries = max_checksum_retries
        self.sync_level = request.sync_level
        self.verify = request.verify_checksum
        self.tally = Tally()
        self.status: Literal["ACTIVE", "SUCCEEDED", "FAILED"] = "ACTIVE"
        self.fatal_error: dict[str, str] | None = None
        self.request_time = time.time()
        self.completion_time: float | None = None
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        # Resolve (and confine) every item now, so a bad path refuses the whole request.
        self.items = [
            (
                collections.local_path(request.source_endpoint, item.source_path, "source_path"),
                collections.local_path(
                    request.destination_endpoint, item.destination_path, "destination_path"
                ),
                item,
            )
            for item in request.DATA
        ]
        for _src, _dst, item in self.items:
            if not item.recursive and item.destination_path.endswith("/"):
                raise TransferRefused(
                    f"destination_path {item.destination_path!r} ends with '/': a file item "
                    "needs the destination file's path (or set recursive for a directory)"
                )
        self.planner = Planner(
            collections.root(request.source_endpoint),
            collections.root(request.destination_endpoint),
            self.tally, self._cancel,
        )
        options = CopyOptions(
            task_id=self.task_id, sync_level=self.sync_level,
            preserve_timestamp=request.preserve_timestamp, algorithm=self.algorithm,
            block_size=max(64 << 10, int(block_size)), after_write=after_write,
        )
        self.copier = Copier(options, self.planner, self.tally, self._cancel)

    @property
    def stats(self) -> TransferStats:
        """The counts so far (a copy)."""
        return self.tally.snapshot()

    # -- public ------------------------------------------------------------------------------
    def cancel(self) -> None:
        self._cancel.set()

    def run(self) -> None:
        """Transfer everything; sets ``status`` SUCCEEDED or FAILED (never raises)."""
        try:
            files = list(self.planner.files(self.items))
            if self.verify:
                VerifiedCopies(self.copier, self.max_checksum_retries).run(files)
            else:
                for f in files:
                    check_cancel(self._cancel)
                    self.copier.copy(f)
            status: Literal["SUCCEEDED", "FAILED"] = "SUCCEEDED"
        except Canceled:
            status = "FAILED"
            self.fatal_error = {"code": "CANCELED", "description": "canceled"}
        except TransferFault as fault:
            self.tally.fault(fault)
            status = "FAILED"
            self.fatal_error = {"code": fault.code, "description": fault.description}
        except Exception as exc:  # a bug must still end the task, with the reason
            log.exception("transfer %s failed", self.task_id)
            status = "FAILED"
            self.fatal_error = {"code": "INTERNAL", "description": f"{type(exc).__name__}: {exc}"}
        with self._lock:
            self.completion_time = time.time()
            self.status = status

    def document(self) -> dict[str, Any]:
        """The task document (as Globus Transfer's ``get_task``)."""
        s = self.tally.snapshot()
        with self._lock:
            end = self.completion_time or time.time()
            elapsed = max(end - self.request_time, 1e-9)
            nice = {"ACTIVE": "Queued" if s.files == 0 else "OK", "SUCCEEDED": None}.get(
                self.status, (self.fatal_error or {}).get("code")
            )
            uses_checksums = self.verify or self.sync_level == 3
            return {
                "DATA_TYPE": "task",
                "task_id": self.task_id,
                "type": "TRANSFER",
                "status": self.status,
                "label": self.request.label,
                "source_endpoint_id": self.request.source_endpoint,
                "destination_endpoint_id": self.request.destination_endpoint,
                "sync_level": self.sync_level,
                "verify_checksum": self.verify,
                "preserve_timestamp": self.request.preserve_timestamp,
                "checksum_algorithm": self.algorithm.upper() if uses_checksums else None,
                "request_time": iso_time(self.request_time),
                "completion_time": iso_time(self.completion_time),
                "files": s.files,
                "directories": s.directories,
                "files_skipped": s.files_skipped,
                "files_transferred": s.files_transferred,
                "bytes_transferred": s.bytes_transferred,
                "bytes_checksummed": s.bytes_checksummed,
                "subtasks_total": s.files,
                "subtasks_succeeded": s.files_transferred + s.files_skipped,
                "subtasks_failed": 1 if self.status == "FAILED" and self.fatal_error else 0,
                "faults": s.faults,
                "fault_details": list(s.fault_details[-20:]),
                "effective_bytes_per_second": int(s.bytes_transferred / elapsed),
                "nice_status": nice,
                "nice_status_short_description": (self.fatal_error or {}).get("description"),
                "fatal_error": dict(self.fatal_error) if self.fatal_error else None,
            }
