"""The checkpoint writer process: HDF5 files built and committed off the caller's GIL.

h5py holds the GIL through every HDF5 call, so a checkpoint file built on a thread of the
reconstruction's process stalls the reconstruction's Python thread for as long as that takes,
however idle the thread's priority. Measured on 400 positions of 64 px (66 ms iterations, 2
cores, a commit every iteration): +11-14 % iteration time from a writer thread, +3-4 % from a
writer process doing the same work. So each `Checkpointer` runs one child process with one
thread per level; the parent's level threads only hand it snapshots and wait (without the GIL).

Snapshots travel as an anonymous shared-memory file (memfd on Linux, an unlinked temporary file
elsewhere) whose descriptor is passed over a Unix socket: ``[8-byte header length][header
JSON][arrays, 64-byte aligned]``. No pickle. One socket pair per level carries
length-prefixed JSON messages, strictly alternating::

    parent -> child   {"op": "write", "dir", "keep", "protect", "hook"} + the snapshot's fd
    child  -> parent  {"op": "step", "step", "path"}          (with "hook": waits for a reply)
    parent -> child   {"op": "go"} | {"op": "raise", "errno", "message", "filename"}
    child  -> parent  {"op": "done", "record", "cpu"} | {"op": "failed", "error", "cpu"}

The child starts with a ``{"op": "hello", "tid"}`` per level (the thread id, so the parent can
lift its scheduling priority), ignores SIGINT/SIGTERM (the parent decides when to flush and
exit; a signal to the process group must not kill the final write), dies with the parent
(PR_SET_PDEATHSIG on Linux, like the threads it replaces: a kill -9 stops a write where it
is), and exits when its sockets close. PR_SET_PDEATHSIG fires when the *thread* that started
the process ends: start it from a thread that lives as long as its sockets (the
`Checkpointer`'s level threads do).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from beamflow.checkpoint.store import FileImages, LatestRecord, commit
from beamflow.processes import die_with_parent, helper_command

_LEN = struct.Struct("<Q")
_ALIGN = 64
_MAX_MESSAGE = 1 << 20
#: hook(step, path) on the parent side; may raise to fail the write at that step
StepHook = Callable[[str, Path], None]


class WriterGone(RuntimeError):
    """The writer process (or its parent) went away mid-conversation."""


# --------------------------------------------------------------------------- messages


def _send(sock: socket.socket, msg: Mapping[str, Any], fd: int | None = None) -> None:
    body = json.dumps(msg).encode()
    frame = _LEN.pack(len(body)) + body
    if fd is None:
        sock.sendall(frame)
    else:  # the descriptor rides on the frame's first bytes
        n = socket.send_fds(sock, [frame], [fd])
        if n < len(frame):
            sock.sendall(frame[n:])


def _recv_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    buf = b""
    while len(buf) < n:
        data, got, _flags, _addr = socket.recv_fds(sock, n - len(buf), 1)
        fds.extend(got)
        if not data:
            raise WriterGone("the other end of the checkpoint writer's socket closed")
        buf += data
    return buf


def _recv(sock: socket.socket) -> tuple[dict[str, Any], int | None]:
    fds: list[int] = []
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size, fds))
    if n > _MAX_MESSAGE:
        raise WriterGone(f"checkpoint writer message of {n} bytes: the protocol is broken")
    msg = json.loads(_recv_exact(sock, n, fds))
    for extra in fds[1:]:
        os.close(extra)
    return msg, (fds[0] if fds else None)


# --------------------------------------------------------------------------- snapshots


class _Buffer:
    """An anonymous shared-memory file and this process's mapping of it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = _anonymous_file()
        try:
            os.ftruncate(self.fd, size)
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


def _anonymous_file() -> int:
    if hasattr(os, "memfd_create"):
        return os.memfd_create("beamflow-checkpoint", os.MFD_CLOEXEC)
    with tempfile.TemporaryFile() as f:  # unlinked at once: nothing to clean up after a crash
        return os.dup(f.fileno())


class SharedSnapshot:
    """One snapshot in a shared-memory buffer, handed to the writer by descriptor.

    The buffer goes back to its pool when the snapshot is closed or no longer referenced
    (once no level holds it, pending or in flight).
    """

    def __init__(self, buffer: _Buffer, snapshot_id: int, iteration: int,
                 release: Callable[[_Buffer], None]) -> None:
        self.fd = buffer.fd
        self.id = snapshot_id
        self.iteration = iteration
        self.close = weakref.finalize(self, release, buffer)


class SnapshotBuffers:
    """Makes shared snapshots in reused buffers, so that a snapshot costs one copy.

    A fresh buffer's pages fault in, zeroed, on first touch: 0.9 ms for a 1 MB state, against
    0.13 ms for the copy itself. Buffers come back when their snapshot is closed; at most
    `keep` wait for reuse (a level has at most one snapshot in flight and one pending, so
    with one level three buffers take turns).
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._free: list[_Buffer] = []
        self._lock = threading.Lock()
        self._closed = False

    def snapshot(self, snapshot_id: int, iteration: int, arrays: Mapping[str, np.ndarray],
                 meta_json: str, fingerprint_json: str, created: float) -> SharedSnapshot:
        layout, offset = [], 0
        for name, a in arrays.items():
            layout.append([name, a.dtype.str, list(a.shape), offset])
            offset += -(-a.nbytes // _ALIGN) * _ALIGN
        header = json.dumps({"id": snapshot_id, "iteration": int(iteration), "arrays": layout,
                             "meta_json": meta_json, "fingerprint_json": fingerprint_json,
                             "created": created}).encode()
        start = -(-(_LEN.size + len(header)) // _ALIGN) * _ALIGN
        buf = self._take(start + offset)
        try:
            mm = buf.mm
            mm[:_LEN.size] = _LEN.pack(len(header))
            mm[_LEN.size:_LEN.size + len(header)] = header
            for (_name, dtype, shape, off), a in zip(layout, arrays.values(), strict=True):
                if a.size:
                    dst = np.frombuffer(mm, dtype, a.size, start + off).reshape(shape)
                    np.copyto(dst, a)
                    del dst  # no view may outlive the mapping
        except BaseException:
            self._give(buf)
            raise
        return SharedSnapshot(buf, snapshot_id, iteration, self._give)

    def _take(self, size: int) -> _Buffer:
        with self._lock:
            for i, buf in enumerate(self._free):
                if size <= buf.size <= 2 * size:
                    return self._free.pop(i)
        # headroom, so that metadata growing by a few bytes still fits next time
        return _Buffer(size + size // 16 + 4096)

    def _give(self, buf: _Buffer) -> None:
        with self._lock:
            if not self._closed and len(self._free) < self.keep:
                self._free.append(buf)
                return
        buf.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for buf in free:
            buf.close()


def _open_snapshot(fd: int) -> tuple[mmap.mmap, dict[str, Any], dict[str, np.ndarray]]:
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    (n,) = _LEN.unpack(mm[:_LEN.size])
    header = json.loads(mm[_LEN.size:_LEN.size + n])
    start = -(-(_LEN.size + n) // _ALIGN) * _ALIGN
    arrays = {}
    for name, dtype, shape, off in header["arrays"]:
        count = int(np.prod(shape, dtype=np.int64))
        arrays[name] = (np.frombuffer(mm, dtype, count, start + off).reshape(shape) if count
                        else np.empty(shape, dtype))
    return mm, header, arrays


# --------------------------------------------------------------------------- parent side


class WriterProcess:
    """The parent's handle on one writer process (one socket per level)."""

    def __init__(self, levels: Sequence[str], *, idle: bool) -> None:
        self._socks: dict[str, socket.socket] = {}
        child_ends: list[socket.socket] = []
        for name in levels:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self._socks[name] = ours
            child_ends.append(theirs)
        args = [f"{name}={s.fileno()}" for name, s in zip(levels, child_ends, strict=True)]
        cmd, env = helper_command(__name__, str(os.getpid()), "idle" if idle else "normal",
                                  *args)
        try:
            self.proc = subprocess.Popen(cmd, pass_fds=[s.fileno() for s in child_ends],
                                         stdin=subprocess.DEVNULL, env=env)
        finally:
            for s in child_ends:
                s.close()
        self.tids: dict[str, int] = {}

    #: how long a writer process may take to start (imports numpy and h5py: ~0.5 s)
    START_TIMEOUT_S = 120.0

    def hello(self, level: str) -> int:
        """The child's thread id for `level` (blocks until the child has started)."""
        sock = self._socks[level]
        sock.settimeout(self.START_TIMEOUT_S)  # a child stuck in its imports must not hang us
        try:
            msg, _ = _recv(sock)
        except TimeoutError as e:
            self.kill()
            raise WriterGone(f"checkpoint writer process did not start in "
                             f"{self.START_TIMEOUT_S} s") from e
        finally:
            sock.settimeout(None)
        if msg.get("op") != "hello":
            raise WriterGone(f"checkpoint writer said {msg.get('op')!r} instead of hello")
        self.tids[level] = int(msg["tid"])
        return self.tids[level]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def write(self, level: str, snap: SharedSnapshot, directory: Path, keep: int,
              protect: Sequence[Path], hook: StepHook | None) -> tuple[LatestRecord, float]:
        """Commit `snap` at `level`; returns the record and the child's CPU seconds.

        Raises WriteFailed (the child's error: a full disk, say) or WriterGone (the process
        died or is out of step).
        """
        sock = self._socks[level]
        try:
            _send(sock, {"op": "write", "dir": str(directory), "keep": keep,
                         "protect": [str(p) for p in protect], "hook": hook is not None},
                  fd=snap.fd)
            while True:
                msg, _ = _recv(sock)
                if msg["op"] == "step":
                    _send(sock, _run_hook(hook, msg["step"], Path(msg["path"])))
                    continue
                break
        except (OSError, WriterGone) as e:
            code = self.proc.poll()
            state = "running" if code is None else f"exited with code {code}"
            raise WriterGone(f"checkpoint writer process ({state}): {e}") from e
        if msg["op"] == "done":
            return LatestRecord(**msg["record"]), float(msg["cpu"])
        raise WriteFailed(msg["error"], float(msg["cpu"]))

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()

    def close(self, timeout: float | None = 10.0) -> None:
        for s in self._socks.values():
            s.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class WriteFailed(RuntimeError):
    """The writer process could not write a checkpoint; the message is its error."""

    def __init__(self, message: str, cpu: float) -> None:
        super().__init__(message)
        self.cpu = cpu


def _run_hook(hook: StepHook | None, step: str, path: Path) -> dict[str, Any]:
    if hook is None:
        return {"op": "go"}
    try:
        hook(step, path)
    except OSError as e:
        return {"op": "raise", "errno": e.errno, "message": e.strerror or str(e),
                "filename": e.filename}
    except Exception as e:
        return {"op": "raise", "errno": None, "message": f"{type(e).__name__}: {e}",
                "filename": None}
    return {"op": "go"}


# --------------------------------------------------------------------------- child side


class _Images:
    """One image per snapshot: a snapshot sent to both levels is built once."""

    def __init__(self) -> None:
        self.files = FileImages()
        self._lock = threading.Lock()
        self._last: tuple[int, bytes, str] | None = None

    def get(self, fd: int) -> tuple[dict[str, Any], bytes, str]:
        """The snapshot's header, and its file image and sha256."""
        mm, header, arrays = _open_snapshot(fd)
        try:
            with self._lock:
                if self._last is None or self._last[0] != header["id"]:
                    image = self.files.build(header["iteration"], arrays, header["meta_json"],
                                             header["fingerprint_json"], header["created"])
                    self._last = (header["id"], image, hashlib.sha256(image).hexdigest())
                _, image, sha = self._last
        finally:
            del arrays
            with contextlib.suppress(BufferError):  # a traceback may still hold a view
                mm.close()
        return header, image, sha


def _ask(sock: socket.socket, step: str, path: Path) -> None:
    _send(sock, {"op": "step", "step": step, "path": str(path)})
    msg, _ = _recv(sock)
    if msg["op"] == "raise":
        if msg["errno"] is not None:
            raise OSError(msg["errno"], msg["message"], msg["filename"])
        raise RuntimeError(msg["message"])


def _serve(level: str, sock: socket.socket, images: _Images, parent: int) -> None:
    _send(sock, {"op": "hello", "tid": threading.get_native_id()})
    while True:
        try:
            msg, fd = _recv(sock)
        except (OSError, WriterGone):
            return  # the parent closed (or died): nothing more to write
        c0 = time.thread_time()
        try:
            if fd is None:
                raise RuntimeError("a write request came without its snapshot")
            try:
                header, image, sha = images.get(fd)
            finally:
                os.close(fd)
            hook = ((lambda step, path: _ask(sock, step, path)) if msg["hook"] else None)
            rec = commit(Path(msg["dir"]), header["iteration"], image,
                         fingerprint=json.loads(header["fingerprint_json"]), keep=msg["keep"],
                         protect=[Path(p) for p in msg["protect"]], hook=hook, sha256=sha,
                         owner=parent)
            reply = {"op": "done", "record": rec.__dict__}
        except WriterGone:
            os._exit(0)  # the parent went away in the middle of a step: stop right here
        except Exception as e:
            reply = {"op": "failed", "error": f"{type(e).__name__}: {e}"[:4000]}
        reply["cpu"] = time.thread_time() - c0
        try:
            _send(sock, reply)
        except OSError:
            return


def main(argv: Sequence[str]) -> None:
    parent, priority, *levels = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent(int(parent))
    if priority == "idle" and hasattr(os, "SCHED_IDLE"):
        # level threads inherit it; the parent lifts them when it must
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    images = _Images()
    threads = []
    for spec in levels:
        name, fd = spec.split("=")
        sock = socket.socket(fileno=int(fd))
        threads.append(threading.Thread(target=_serve, args=(name, sock, images, int(parent)),
                                        name=f"checkpoint-{name}"))
    for t in threads:
        t.start()
    for t in threads:
        t.join()

