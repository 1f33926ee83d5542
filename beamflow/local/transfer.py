"""The local Transfer action provider (``https://transfer.actions.globus.org/transfer``).

Collections are directories: each collection id maps to a local root (the beamline and HPC
collections of the configuration), and a collection path ``/a/b`` means ``ROOT/a/b``. A
request speaks the Transfer action provider's language: ``source_endpoint``,
``destination_endpoint``, ``DATA: [{source_path, destination_path, recursive}]``, ``label``,
``sync_level`` (exists | size | mtime | checksum, or 0-3), ``verify_checksum``,
``preserve_timestamp``.

What users rely on:

- **Confinement.** Every path, after ``..`` is collapsed and symlinks are followed, must lie
  inside its collection's root; anything else is refused when the action starts
  (``ActionUnableToRun``), and a symlink met during a recursive walk that leads outside
  fails the task. Nothing is read or written outside the roots.
- **No partial files.** A file is written under a hidden temporary name in the destination
  directory (``.NAME.beamflow-partial-<task>``) and renamed into place only when complete
  (and verified): a reader of the destination sees the old file or the whole new one.
- **Integrity.** With ``verify_checksum`` the source is hashed while it is copied, the
  written file is hashed again from the destination, and the two digests (and the planned,
  copied and hashed sizes) must agree before the rename; a mismatch is retried (as Globus
  does) and then fails the task naming the file.
- **Sync levels** as Globus defines them: ``exists`` copies only missing files; ``size``
  also files whose size differs; ``mtime`` also files whose source is newer than the
  destination; ``checksum`` also files whose content differs.

Speed: files are copied in the kernel (``copy_file_range``, falling back to ``sendfile`` and
then to a read/write loop). With checksums (XXH3-128 by default; SHA-256, SHA-1, SHA-512,
MD5, CRC-32, Adler-32 on request) the copy runs in a pipeline: one thread copies while a
verifier follows it block by block, reading and hashing the source and the destination, then
compares and renames, so the next file is copied while the last one is verified.
``benchmarks/bench_transfer.py`` compares it with ``cp``.

Action details follow the Transfer task document: ``task_id``, ``status``, ``label``,
``files``, ``directories``, ``files_transferred``, ``files_skipped``,
``bytes_transferred``, ``bytes_checksummed``, ``faults``, ``fatal_error``, ...
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from beamflow.local.actions import ActionStatus, RunContext, bad_request, parse_request
from beamflow.local.collection_paths import Collections, TransferRefused
from beamflow.local.transfer_task import (
    BLOCK_SIZE,
    DEFAULT_CHECKSUM,
    LABEL_MAX,
    TransferRequest,
    TransferTask,
    WriteHook,
)

log = logging.getLogger(__name__)

TRANSFER_URL = "https://transfer.actions.globus.org/transfer"


# -- the provider ----------------------------------------------------------------------------
class LocalTransferProvider:
    """The Transfer action provider of the local backend: each action is a task in a thread."""

    url = TRANSFER_URL

    def __init__(
        self,
        collections: Collections | Mapping[str, Path | str],
        *,
        block_size: int = BLOCK_SIZE,
        checksum_algorithm: str = DEFAULT_CHECKSUM,
        max_checksum_retries: int = 2,
        after_write: WriteHook | None = None,
        keep_finished: int = 500,
    ) -> None:
        self.collections = (
            collections if isinstance(collections, Collections) else Collections(collections)
        )
        self.block_size = block_size
        self.checksum_algorithm = checksum_algorithm
        self.max_checksum_retries = max_checksum_retries
        self.after_write = after_write
        self.keep_finished = keep_finished
        self._tasks: dict[str, tuple[TransferTask, threading.Thread, float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any, **kwargs: Any) -> LocalTransferProvider:
        return cls(Collections.from_settings(settings), **kwargs)

    def start(self, body: dict[str, Any], context: RunContext | None = None) -> ActionStatus:
        request = parse_request(TransferRequest, body, "transfer")
        try:
            task = TransferTask(
                request,
                self.collections,
                block_size=self.block_size,
                checksum_algorithm=self.checksum_algorithm,
                max_checksum_retries=self.max_checksum_retries,
                after_write=self.after_write,
            )
        except TransferRefused as exc:
            raise bad_request(str(exc)) from None
        if request.label is None and context is not None and context.label:
            request.label = context.label[:LABEL_MAX]
        thread = threading.Thread(target=task.run, name=f"transfer-{task.task_id[:8]}", daemon=True)
        with self._lock:
            self._prune()
            self._tasks[task.task_id] = (task, thread, time.time())
        thread.start()
        return self._status(task)

    def status(self, action_id: str) -> ActionStatus:
        return self._status(self._task(action_id))

    def cancel(self, action_id: str) -> ActionStatus:
        task = self._task(action_id)
        task.cancel()
        with self._lock:
            thread = self._tasks[action_id][1]
        thread.join(timeout=10)
        return self._status(task)

    def wait(self, action_id: str, timeout: float | None = None) -> ActionStatus:
        """Block until the action ends (tests, benchmarks)."""
        with self._lock:
            thread = self._tasks[action_id][1]
        thread.join(timeout)
        return self.status(action_id)

    def close(self) -> None:
        with self._lock:
            tasks = list(self._tasks.values())
        for task, _thread, _ in tasks:
            task.cancel()
        for _task, thread, _ in tasks:
            thread.join(timeout=10)

    # -- helpers -----------------------------------------------------------------------------
    def _task(self, action_id: str) -> TransferTask:
        with self._lock:
            entry = self._tasks.get(action_id)
        if entry is None:
            raise KeyError(f"no transfer action {action_id!r} on this provider")
        return entry[0]

    def _prune(self) -> None:
        done = [
            (started, tid)
            for tid, (task, _t, started) in self._tasks.items()
            if task.status != "ACTIVE"
        ]
        for _, tid in sorted(done)[: max(0, len(done) - self.keep_finished)]:
            del self._tasks[tid]

    @staticmethod
    def _status(task: TransferTask) -> ActionStatus:
        doc = task.document()
        return ActionStatus(
            action_id=task.task_id,
            status=doc["status"],
            start_time=doc["request_time"],
            completion_time=doc["completion_time"],
            details=doc,
            display_status=doc["nice_status"] or doc["status"],
            label=doc["label"],
        )
