"""The third job of a transfer, with ``verify_checksum``: verify each copy before it is
renamed into place, in a pipeline beside the copy.

Two threads: the task's thread copies (in the kernel, as without checksums) and the verifier
follows it block by block, reading and hashing the source and then the destination, and at
the end of a file compares and renames. The copy of the next file starts while the last
blocks of this one are verified (up to ``VERIFY_DEPTH`` files in flight). The source is
hashed from its own reads, not the copy's, so the digests agree only if the bytes that
landed are the source's. Two busy threads fit a 2-core node: measured (bench_transfer.py,
512 MiB, warm cache) at ~0.85x cp's throughput, where a copy loop feeding hash threads file
by file ran at ~0.6x. A mismatch is retried (as Globus retries checksum faults), then fails
the task naming the file.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from beamflow.local.transfer_copy import Checksum, Copier
from beamflow.local.transfer_plan import PlannedFile, TransferFault, check_cancel, os_fault

# Copy and hash granularity: small enough to stay in L2 between the read and the hash.
VERIFY_BLOCK = 1 << 20
# Files copied but not yet verified, at most.
VERIFY_DEPTH = 4


class VerifiedCopies:
    """Copies files with ``copier`` and verifies each before it is published."""

    def __init__(self, copier: Copier, max_checksum_retries: int) -> None:
        self.copier = copier
        self.attempts = 1 + max_checksum_retries
        self._stop = threading.Event()

    def run(self, files: list[PlannedFile]) -> None:
        pool = ThreadPoolExecutor(1, thread_name_prefix="transfer-verify")
        # The verifier thread's read buffer lives as long as this pipeline: finished tasks
        # are kept (keep_finished) for their documents, their buffers are not.
        buffer = bytearray(VERIFY_BLOCK)
        todo = deque((f, 1) for f in files)
        pending: deque[tuple[PlannedFile, int, Future[None]]] = deque()
        try:
            while todo or pending:
                check_cancel(self.copier.cancel)
                if todo and len(pending) < VERIFY_DEPTH:
                    f, attempt = todo.popleft()
                    started = self._start(pool, buffer, f)
                    if started is not None:
                        pending.append((f, attempt, started))
                    continue
                f, attempt, started = pending.popleft()
                try:
                    started.result()
                except TransferFault as fault:
                    if fault.code != "CHECKSUM_MISMATCH" or attempt >= self.attempts:
                        raise
                    self.copier.tally.fault(fault)  # retried, as Globus retries them
                    todo.append((f, attempt + 1))
        finally:
            self._stop.set()
            for _f, _a, started in pending:
                with contextlib.suppress(BaseException):
                    started.result()
            pool.shutdown(wait=True)

    def _start(
        self, pool: ThreadPoolExecutor, buffer: bytearray, f: PlannedFile
    ) -> Future[None] | None:
        """Copy ``f`` and start its verification; the future raises CHECKSUM_MISMATCH."""
        copier = self.copier
        tmp = copier.prepare(f)
        if tmp is None:
            return None
        src_fd, dst_fd = copier.open_pair(f, tmp)
        written = _Written()
        finished = pool.submit(self._verify, f, tmp, (src_fd, dst_fd), written, buffer)
        try:
            copier.copy_fast(
                src_fd, dst_fd, tmp, f.size, chunk=VERIFY_BLOCK, progress=written.publish
            )
        except BaseException as exc:
            written.close(failed=True)
            with contextlib.suppress(BaseException):
                finished.result()  # it closes the files and removes the temporary one
            if isinstance(exc, OSError):
                raise os_fault(exc, tmp) from None
            raise
        written.close()
        return finished

    def _verify(
        self, f: PlannedFile, tmp: Path, fds: tuple[int, int], written: _Written,
        buffer: bytearray,
    ) -> None:
        algorithm = self.copier.options.algorithm
        try:
            try:
                src_digest, dst_digest, checked = self._hash_pair(fds, written, buffer)
            except OSError as exc:  # a read error of either file
                raise os_fault(exc, f.dst) from None
            if written.failed:
                return
            copied = written.value
            self.copier.tally.add(bytes_checksummed=2 * checked)
            if not checked == copied == f.size:
                raise TransferFault(
                    "CHECKSUM_MISMATCH",
                    f"checksum verification failed for {f.dst}: the source changed during "
                    f"the copy ({f.size} bytes planned, {copied} copied, {checked} verified)",
                    f.dst,
                )
            if src_digest != dst_digest:
                raise TransferFault(
                    "CHECKSUM_MISMATCH",
                    f"checksum verification failed for {f.dst}: source {algorithm} "
                    f"{src_digest}, destination {dst_digest}",
                    f.dst,
                )
            self.copier.publish(f, tmp)
        finally:
            os.close(fds[0])
            os.close(fds[1])
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _hash_pair(
        self, fds: tuple[int, int], written: _Written, buffer: bytearray
    ) -> tuple[str, str, int]:
        """Source and destination digests of what the copy publishes, block by block, and
        how many bytes both held. pread: the copy moves the descriptors' offsets."""
        view = memoryview(buffer)
        algorithm = self.copier.options.algorithm
        hashes = (Checksum(algorithm), Checksum(algorithm))
        done = 0
        while not (self._stop.is_set() or self.copier.cancel.is_set()):
            limit = written.wait_beyond(done)
            if limit is None:
                break
            while done < limit:
                want = min(VERIFY_BLOCK, limit - done)
                for fd, h in zip(fds, hashes, strict=True):
                    n = os.preadv(fd, [view[:want]], done)
                    h.update(view[:n])
                    if n != want:  # a file shorter than what was copied: changed under us
                        return hashes[0].hexdigest(), hashes[1].hexdigest(), done
                done += want
        return hashes[0].hexdigest(), hashes[1].hexdigest(), done


class _Written:
    """How far the copy got; the verifier waits on it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._value = 0
        self._closed = False
        self.failed = False

    @property
    def value(self) -> int:
        return self._value

    def publish(self, value: int) -> None:
        with self._cond:
            self._value = value
            self._cond.notify_all()

    def close(self, failed: bool = False) -> None:
        with self._cond:
            self._closed = True
            self.failed = failed
            self._cond.notify_all()

    def wait_beyond(self, done: int) -> int | None:
        """The published offset once it passes ``done``; None when closed with no more."""
        with self._cond:
            while self._value <= done and not self._closed:
                self._cond.wait()
            return self._value if self._value > done else None
