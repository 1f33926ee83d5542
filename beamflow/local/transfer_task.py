"""One transfer request run to the end: plan the files (walk, confine, sync level), copy each
under a hidden temporary name, verify the checksum while the next file copies, rename into
place. The contract users rely on is in :mod:`beamflow.local.transfer`."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import stat
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import xxhash
from pydantic import BaseModel, ConfigDict, Field, field_validator

from beamflow.local.actions import iso_time
from beamflow.local.collection_paths import Collections, TransferRefused, inside

log = logging.getLogger(__name__)

BLOCK_SIZE = 4 << 20
# Copy and hash granularity with verify_checksum: small enough to stay in L2 between the
# read and the hash.
VERIFY_BLOCK = 1 << 20
# Files copied but not yet verified, at most.
VERIFY_DEPTH = 4
PARTIAL_MARK = ".beamflow-partial-"
SYNC_LEVELS = {"exists": 0, "size": 1, "mtime": 2, "checksum": 3}
LABEL_MAX = 128

# An after-write hook sees each block as it lands in the temporary file, before the
# verification re-reads it: (temporary path, offset, length). Tests use it to corrupt data.
WriteHook = Callable[[Path, int, int], None]



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


CHECKSUM_ALGORITHMS = ("xxh3_128", "sha256", "sha1", "sha512", "md5", "crc32", "adler32")
# The default verifies copies at memory speed: XXH3-128 runs at ~7 GB/s per core here, SHA-256
# at ~1 GB/s (with SHA-NI), CRC-32 at ~1.7 GB/s; with two hashes per byte (source and
# destination) only XXH3 keeps a verified copy near cp's speed. It is a 128-bit hash built
# for integrity checks, not for security, the job Globus gives MD5.
DEFAULT_CHECKSUM = "xxh3_128"


class Checksum:
    """A running checksum: XXH3-128, the hashlib algorithms, or zlib's CRC-32 / Adler-32
    (the non-cryptographic ones catch corruption in a copy as well; none is for security)."""

    def __init__(self, algorithm: str) -> None:
        self.name = algorithm.lower()
        if self.name not in CHECKSUM_ALGORITHMS:
            known = ", ".join(CHECKSUM_ALGORITHMS)
            raise ValueError(f"unknown checksum algorithm {algorithm!r} (known: {known})")
        self._zlib = {"crc32": zlib.crc32, "adler32": zlib.adler32}.get(self.name)
        self._value = 1 if self.name == "adler32" else 0
        if self._zlib is not None:
            self._hash = None
        elif self.name == "xxh3_128":
            self._hash = xxhash.xxh3_128()
        else:
            self._hash = hashlib.new(self.name)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._zlib is not None:
            self._value = self._zlib(data, self._value)
        else:
            self._hash.update(data)  # type: ignore[union-attr]

    def hexdigest(self) -> str:
        if self._zlib is not None:
            return f"{self._value:08x}"
        return self._hash.hexdigest()  # type: ignore[union-attr]


# -- the task --------------------------------------------------------------------------------
class TransferFault(Exception):
    """A file could not be transferred; ``code`` is the Transfer fault code."""

    def __init__(self, code: str, description: str, path: Path | None = None) -> None:
        super().__init__(description)
        self.code = code
        self.description = description
        self.path = path


class _Canceled(Exception):
    pass


@dataclass
class _File:
    src: Path
    dst: Path
    size: int
    mtime_ns: int
    atime_ns: int


@dataclass
class TransferStats:
    files: int = 0
    directories: int = 0
    files_skipped: int = 0
    files_transferred: int = 0
    bytes_transferred: int = 0
    bytes_checksummed: int = 0
    faults: int = 0
    fault_details: list[dict[str, Any]] = field(default_factory=list)


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
        self.collections = collections
        self.task_id = task_id or str(uuid.uuid4())
        self.block_size = max(64 << 10, int(block_size))
        self.algorithm = Checksum(checksum_algorithm).name  # fails now on an unknown one
        self.max_checksum_retries = max_checksum_retries
        self.after_write = after_write
        self.sync_level = request.sync_level
        self.verify = request.verify_checksum
        self.stats = TransferStats()
        self.status: Literal["ACTIVE", "SUCCEEDED", "FAILED"] = "ACTIVE"
        self.fatal_error: dict[str, str] | None = None
        self.request_time = time.time()
        self.completion_time: float | None = None
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._verify_pool: ThreadPoolExecutor | None = None
        self._stop_verifying = threading.Event()
        self._verify_buffer = b""  # the verifier thread's read buffer, while verifying
        self._ready_dirs: set[Path] = set()
        self._src_root = collections.root(request.source_endpoint)
        self._dst_root = collections.root(request.destination_endpoint)
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

    # -- public ------------------------------------------------------------------------------
    def cancel(self) -> None:
        self._cancel.set()

    def run(self) -> None:
        """Transfer everything; sets ``status`` SUCCEEDED or FAILED (never raises)."""
        try:
            self._transfer_all(list(self._plan()))
            status: Literal["SUCCEEDED", "FAILED"] = "SUCCEEDED"
        except _Canceled:
            status = "FAILED"
            self.fatal_error = {"code": "CANCELED", "description": "canceled"}
        except TransferFault as fault:
            self._fault(fault)
            status = "FAILED"
            self.fatal_error = {"code": fault.code, "description": fault.description}
        except Exception as exc:  # a bug must still end the task, with the reason
            log.exception("transfer %s failed", self.task_id)
            status = "FAILED"
            self.fatal_error = {"code": "INTERNAL", "description": f"{type(exc).__name__}: {exc}"}
        finally:
            # The verifier thread and its buffer go with the task's end: finished
            # tasks are kept (keep_finished) for their documents.
            if self._verify_pool is not None:
                self._verify_pool.shutdown(wait=True)
                self._verify_pool = None
                self._verify_buffer = b""
        with self._lock:
            self.completion_time = time.time()
            self.status = status

    def document(self) -> dict[str, Any]:
        """The task document (as Globus Transfer's ``get_task``)."""
        with self._lock:
            s = self.stats
            end = self.completion_time or time.time()
            elapsed = max(end - self.request_time, 1e-9)
            nice = {"ACTIVE": "Queued" if s.files == 0 else "OK", "SUCCEEDED": None}.get(
                self.status, (self.fatal_error or {}).get("code")
            )
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
                "checksum_algorithm": self.algorithm.upper() if self._uses_checksums else None,
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

    # -- planning ----------------------------------------------------------------------------
    @property
    def _uses_checksums(self) -> bool:
        return self.verify or self.sync_level == 3

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise _Canceled

    def _fault(self, fault: TransferFault) -> None:
        with self._lock:
            self.stats.faults += 1
            self.stats.fault_details.append(
                {
                    "time": iso_time(time.time()),
                    "code": fault.code,
                    "description": fault.description,
                    "path": str(fault.path) if fault.path else None,
                }
            )

    def _plan(self) -> Iterator[_File]:
        for src, dst, item in self.items:
            try:
                st = src.stat()
            except FileNotFoundError:
                raise TransferFault(
                    "FILE_NOT_FOUND", f"source {item.source_path} does not exist", src
                ) from None
            except PermissionError:
                raise TransferFault(
                    "PERMISSION_DENIED", f"source {item.source_path}: permission denied", src
                ) from None
            if item.recursive:
                if not stat.S_ISDIR(st.st_mode):
                    raise TransferFault(
                        "NOT_A_DIRECTORY",
                        f"source {item.source_path} is not a directory (recursive is set)",
                        src,
                    )
                yield from self._walk(src, dst, item.source_path)
            else:
                if stat.S_ISDIR(st.st_mode):
                    raise TransferFault(
                        "IS_A_DIRECTORY",
                        f"source {item.source_path} is a directory: set recursive to copy it",
                        src,
                    )
                with self._lock:
                    self.stats.files += 1
                yield _File(src, dst, st.st_size, st.st_mtime_ns, st.st_atime_ns)

    def _walk(self, src_dir: Path, dst_dir: Path, shown: str) -> Iterator[_File]:
        seen: set[tuple[int, int]] = set()
        stack = [(src_dir, dst_dir)]
        self._mkdir(dst_dir)
        with self._lock:
            self.stats.directories += 1
        while stack:
            here, there = stack.pop()
            key = (here.stat().st_dev, here.stat().st_ino)
            if key in seen:
                continue  # a symlink loop: each directory once
            seen.add(key)
            try:
                entries = sorted(os.scandir(here), key=lambda e: e.name)
            except PermissionError:
                raise TransferFault(
                    "PERMISSION_DENIED", f"{here}: permission denied", here
                ) from None
            for entry in entries:
                self._check_cancel()
                if PARTIAL_MARK in entry.name:
                    continue  # another transfer's unfinished file
                path = Path(entry.path)
                if entry.is_symlink():
                    real = path.resolve(strict=False)
                    if not inside(real, self._src_root):
                        raise TransferFault(
                            "PERMISSION_DENIED",
                            f"{path} is a symlink to {real}, outside the source collection's "
                            "root; refused",
                            path,
                        )
                try:
                    st = entry.stat()  # follows symlinks (checked above)
                except FileNotFoundError:
                    if entry.is_symlink():
                        continue  # dangling link: nothing to copy
                    raise
                target = there / entry.name
                if stat.S_ISDIR(st.st_mode):
                    self._mkdir(target)
                    with self._lock:
                        self.stats.directories += 1
                    stack.append((path, target))
                elif stat.S_ISREG(st.st_mode):
                    with self._lock:
                        self.stats.files += 1
                    yield _File(path, target, st.st_size, st.st_mtime_ns, st.st_atime_ns)
                # sockets, fifos, devices: not data, not copied (as Globus)

    def _mkdir(self, path: Path) -> None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise TransferFault(
                "NOT_A_DIRECTORY",
                f"destination {path} (or a directory above it) exists and is not a directory",
                path,
            ) from None
        except OSError as exc:
            raise self._os_fault(exc, path) from None
        real = path.resolve()
        if not inside(real, self._dst_root):
            raise TransferFault(
                "PERMISSION_DENIED", f"destination {path} leads outside its root", path
            )

    # -- one file ----------------------------------------------------------------------------
    def _skip(self, f: _File) -> bool:
        """Whether the destination is already in sync with the source at this sync level."""
        if self.sync_level is None:
            return False
        try:
            dst = f.dst.stat()
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(dst.st_mode):
            return False
        if self.sync_level == 0:
            return True
        if dst.st_size != f.size:
            return False
        if self.sync_level == 1:
            return True
        if self.sync_level == 2:
            return dst.st_mtime_ns >= f.mtime_ns
        return self._digest_of(f.src) == self._digest_of(f.dst)

    def _digest_of(self, path: Path) -> str:
        h = Checksum(self.algorithm)
        buf = bytearray(self.block_size)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                self._check_cancel()
                h.update(view[:n])
                with self._lock:
                    self.stats.bytes_checksummed += n
        return h.hexdigest()

    def _transfer_all(self, files: list[_File]) -> None:
        if not self.verify:
            for f in files:
                self._check_cancel()
                self._transfer(f)
            return
        self._verify_pool = ThreadPoolExecutor(1, thread_name_prefix="transfer-verify")
        self._verify_buffer = bytearray(VERIFY_BLOCK)
        attempts = 1 + self.max_checksum_retries
        todo = deque((f, 1) for f in files)
        pending: deque[tuple[_File, int, Future[None]]] = deque()
        try:
            while todo or pending:
                self._check_cancel()
                if todo and len(pending) < VERIFY_DEPTH:
                    f, attempt = todo.popleft()
                    started = self._start_verified(f)
                    if started is not None:
                        pending.append((f, attempt, started))
                    continue
                f, attempt, started = pending.popleft()
                try:
                    started.result()
                except TransferFault as fault:
                    if fault.code != "CHECKSUM_MISMATCH" or attempt >= attempts:
                        raise
                    self._fault(fault)  # retried, as Globus retries checksum faults
                    todo.append((f, attempt + 1))
        finally:
            self._stop_verifying.set()
            for _f, _a, started in pending:
                with contextlib.suppress(BaseException):
                    started.result()

    def _prepare(self, f: _File) -> Path | None:
        """Checks before a file is copied; its temporary path, or None to skip it."""
        parent = f.dst.parent
        # A directory is resolved and made once per task (resolving costs a syscall per
        # path component, per file).
        ready = parent in self._ready_dirs
        if not ready and not inside(parent.resolve(), self._dst_root):
            raise TransferFault("PERMISSION_DENIED", f"destination {f.dst} leads outside", f.dst)
        if self._skip(f):
            with self._lock:
                self.stats.files_skipped += 1
            return None
        if not ready:
            self._mkdir(parent)
            self._ready_dirs.add(parent)
        if f.dst.is_dir():
            raise TransferFault(
                "IS_A_DIRECTORY", f"destination {f.dst} is a directory, source is a file", f.dst
            )
        return f.dst.with_name(f".{f.dst.name}{PARTIAL_MARK}{self.task_id[:8]}")

    def _publish(self, f: _File, tmp: Path) -> None:
        """Rename a complete temporary file into place."""
        try:
            if self.request.preserve_timestamp:
                os.utime(tmp, ns=(f.atime_ns, f.mtime_ns))
            os.replace(tmp, f.dst)
        except OSError as exc:
            raise self._os_fault(exc, f.dst) from None
        with self._lock:
            self.stats.files_transferred += 1

    def _open_pair(self, f: _File, tmp: Path) -> tuple[int, int]:
        try:
            src_fd = os.open(f.src, os.O_RDONLY)
        except FileNotFoundError:
            raise TransferFault("FILE_NOT_FOUND", f"source {f.src} vanished", f.src) from None
        except PermissionError:
            raise TransferFault("PERMISSION_DENIED", f"{f.src}: permission denied", f.src) from None
        try:
            dst_fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        except OSError as exc:
            os.close(src_fd)
            raise self._os_fault(exc, tmp) from None
        return src_fd, dst_fd

    def _transfer(self, f: _File) -> None:
        """Copy one file without checksums."""
        tmp = self._prepare(f)
        if tmp is None:
            return
        try:
            src_fd, dst_fd = self._open_pair(f, tmp)
            try:
                self._copy_fast(src_fd, dst_fd, tmp, f.size)
            except OSError as exc:
                raise self._os_fault(exc, tmp) from None
            finally:
                os.close(src_fd)
                os.close(dst_fd)
            self._publish(f, tmp)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    # With checksums, a pipeline of two threads: this one copies (in the kernel, as without
    # checksums) and the verifier follows it block by block, reading and hashing the source
    # and then the destination, and at the end of a file compares and renames. The copy of
    # the next file starts while the last blocks of this one are verified (up to
    # VERIFY_DEPTH files in flight). The source is hashed from its own reads, not the copy's,
    # so the digests agree only if the bytes that landed are the source's. Two busy threads
    # fit a 2-core node: measured (bench_transfer.py, 512 MiB, warm cache) at ~0.85x cp's
    # throughput, where a copy loop feeding hash threads file by file ran at ~0.6x.
    def _start_verified(self, f: _File) -> Future[None] | None:
        """Copy ``f`` and start its verification; the future raises CHECKSUM_MISMATCH."""
        tmp = self._prepare(f)
        if tmp is None:
            return None
        assert self._verify_pool is not None
        src_fd, dst_fd = self._open_pair(f, tmp)
        written = _Progress()
        finished = self._verify_pool.submit(self._verify, f, tmp, (src_fd, dst_fd), written)
        try:
            self._copy_fast(
                src_fd, dst_fd, tmp, f.size, chunk=VERIFY_BLOCK, progress=written.publish
            )
        except BaseException as exc:
            written.close(failed=True)
            with contextlib.suppress(BaseException):
                finished.result()  # it closes the files and removes the temporary one
            if isinstance(exc, OSError):
                raise self._os_fault(exc, tmp) from None
            raise
        written.close()
        return finished

    def _verify(self, f: _File, tmp: Path, fds: tuple[int, int], written: _Progress) -> None:
        try:
            try:
                src_digest, dst_digest, checked = self._hash_pair(fds, written)
            except OSError as exc:  # a read error of either file
                raise self._os_fault(exc, f.dst) from None
            if written.failed:
                return
            copied = written.value
            with self._lock:
                self.stats.bytes_checksummed += 2 * checked
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
                    f"checksum verification failed for {f.dst}: source {self.algorithm} "
                    f"{src_digest}, destination {dst_digest}",
                    f.dst,
                )
            self._publish(f, tmp)
        finally:
            os.close(fds[0])
            os.close(fds[1])
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _hash_pair(self, fds: tuple[int, int], written: _Progress) -> tuple[str, str, int]:
        """Source and destination digests of what the copy publishes, block by block, and
        how many bytes both held. pread: the copy moves the descriptors' offsets."""
        view = memoryview(self._verify_buffer)
        hashes = (Checksum(self.algorithm), Checksum(self.algorithm))
        done = 0
        while not (self._stop_verifying.is_set() or self._cancel.is_set()):
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

    @staticmethod
    def _os_fault(exc: OSError, path: Path) -> TransferFault:
        code = {
            errno.ENOSPC: "NO_SPACE_LEFT",
            errno.EDQUOT: "QUOTA_EXCEEDED",
            errno.EACCES: "PERMISSION_DENIED",
            errno.EPERM: "PERMISSION_DENIED",
            errno.ENOENT: "FILE_NOT_FOUND",
        }.get(exc.errno or 0, "IO_ERROR")
        return TransferFault(code, f"{path}: {exc.strerror or exc}", path)

    def _published(self, tmp: Path, offset: int, length: int) -> None:
        if self.after_write is not None:
            self.after_write(tmp, offset, length)

    # Files stop where the source stopped (a file growing under us is copied up to the size
    # it had when planned, like cp's snapshot).
    def _copy_fast(
        self,
        src_fd: int,
        dst_fd: int,
        tmp: Path,
        size: int,
        chunk: int = 1 << 30,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Copy up to ``size`` bytes in the kernel (``copy_file_range``, else ``sendfile``,
        else a read/write loop); returns how many were copied. ``progress(offset)`` follows
        each chunk that landed."""
        offset = 0
        if self.after_write is not None:
            chunk = min(chunk, self.block_size)
        use_cfr = hasattr(os, "copy_file_range")
        use_sendfile = True
        while offset < size:
            self._check_cancel()
            want = min(chunk, size - offset)
            n = 0
            if use_cfr:
                try:
                    n = os.copy_file_range(src_fd, dst_fd, want)
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                        raise
                    use_cfr = False
                    continue
            elif use_sendfile:
                try:
                    n = os.sendfile(dst_fd, src_fd, offset, want)
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                        raise
                    use_sendfile = False
                    continue
                os.lseek(src_fd, offset + n, os.SEEK_SET)
            else:
                data = os.read(src_fd, min(want, self.block_size))
                n = len(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(dst_fd, view) :]
            if n == 0:
                break  # the source shrank
            self._published(tmp, offset, n)
            offset += n
            if progress is not None:
                progress(offset)
            with self._lock:
                self.stats.bytes_transferred += n
        return offset


class _Progress:
    """How far the writer got; the verifier waits on it."""

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
