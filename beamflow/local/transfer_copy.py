"""The second job of a transfer: copy a planned file. Skip it if the destination is in sync at
the request's sync level; else copy it in the kernel under a hidden temporary name beside
the destination and rename it into place when complete (a reader sees the old file or the
whole new one). The checksums the sync level and verification use are here too.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash

from beamflow.local.collection_paths import inside
from beamflow.local.transfer_plan import (
    PARTIAL_MARK,
    PlannedFile,
    Planner,
    Tally,
    TransferFault,
    check_cancel,
    os_fault,
)

BLOCK_SIZE = 4 << 20

# An after-write hook sees each block as it lands in the temporary file, before the
# verification re-reads it: (temporary path, offset, length). Tests use it to corrupt data.
WriteHook = Callable[[Path, int, int], None]

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


@dataclass(frozen=True)
class CopyOptions:
    """What the request and the provider say about copying."""

    task_id: str
    sync_level: int | None
    preserve_timestamp: bool
    algorithm: str
    block_size: int = BLOCK_SIZE
    after_write: WriteHook | None = None


class Copier:
    """Copies planned files of one task into place (without checksums: :meth:`copy`; the
    verified pipeline in :mod:`beamflow.local.transfer_verify` uses the parts)."""

    def __init__(
        self, options: CopyOptions, planner: Planner, tally: Tally, cancel: threading.Event
    ) -> None:
        self.options = options
        self.planner = planner
        self.tally = tally
        self.cancel = cancel
        self._ready_dirs: set[Path] = set()

    # -- before and after ------------------------------------------------------------------
    def prepare(self, f: PlannedFile) -> Path | None:
        """Checks before a file is copied; its temporary path, or None to skip it."""
        parent = f.dst.parent
        # A directory is resolved and made once per task (resolving costs a syscall per
        # path component, per file).
        ready = parent in self._ready_dirs
        if not ready and not inside(parent.resolve(), self.planner.dst_root):
            raise TransferFault("PERMISSION_DENIED", f"destination {f.dst} leads outside", f.dst)
        if self.in_sync(f):
            self.tally.add(files_skipped=1)
            return None
        if not ready:
            self.planner.mkdir(parent)
            self._ready_dirs.add(parent)
        if f.dst.is_dir():
            raise TransferFault(
                "IS_A_DIRECTORY", f"destination {f.dst} is a directory, source is a file", f.dst
            )
        return f.dst.with_name(f".{f.dst.name}{PARTIAL_MARK}{self.options.task_id[:8]}")

    def in_sync(self, f: PlannedFile) -> bool:
        """Whether the destination is already in sync with the source at this sync level."""
        level = self.options.sync_level
        if level is None:
            return False
        try:
            dst = f.dst.stat()
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(dst.st_mode):
            return False
        if level == 0:
            return True
        if dst.st_size != f.size:
            return False
        if level == 1:
            return True
        if level == 2:
            return dst.st_mtime_ns >= f.mtime_ns
        return self.digest_of(f.src) == self.digest_of(f.dst)

    def digest_of(self, path: Path) -> str:
        h = Checksum(self.options.algorithm)
        buf = bytearray(self.options.block_size)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                check_cancel(self.cancel)
                h.update(view[:n])
                self.tally.add(bytes_checksummed=n)
        return h.hexdigest()

    def publish(self, f: PlannedFile, tmp: Path) -> None:
        """Rename a complete temporary file into place."""
        try:
            if self.options.preserve_timestamp:
                os.utime(tmp, ns=(f.atime_ns, f.mtime_ns))
            os.replace(tmp, f.dst)
        except OSError as exc:
            raise os_fault(exc, f.dst) from None
        self.tally.add(files_transferred=1)

    def open_pair(self, f: PlannedFile, tmp: Path) -> tuple[int, int]:
        """The source, and the temporary file (created empty), as descriptors."""
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
            raise os_fault(exc, tmp) from None
        return src_fd, dst_fd

    # -- copying ---------------------------------------------------------------------------
    def copy(self, f: PlannedFile) -> None:
        """Copy one file without checksums."""
        tmp = self.prepare(f)
        if tmp is None:
            return
        try:
            src_fd, dst_fd = self.open_pair(f, tmp)
            try:
                self.copy_fast(src_fd, dst_fd, tmp, f.size)
            except OSError as exc:
                raise os_fault(exc, tmp) from None
            finally:
                os.close(src_fd)
                os.close(dst_fd)
            self.publish(f, tmp)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    # Files stop where the source stopped (a file growing under us is copied up to the size
    # it had when planned, like cp's snapshot).
    def copy_fast(
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
        block_size, after_write = self.options.block_size, self.options.after_write
        offset = 0
        if after_write is not None:
            chunk = min(chunk, block_size)
        use_cfr = hasattr(os, "copy_file_range")
        use_sendfile = True
        while offset < size:
            check_cancel(self.cancel)
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
                data = os.read(src_fd, min(want, block_size))
                n = len(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(dst_fd, view) :]
            if n == 0:
                break  # the source shrank
            if after_write is not None:
                after_write(tmp, offset, n)
            offset += n
            if progress is not None:
                progress(offset)
            self.tally.add(bytes_transferred=n)
        return offset
