"""The local backend's compute engine: Globus Compute's own ``GlobusComputeEngine``.

At a facility, beamflow's functions run inside a Globus Compute endpoint: its
``GlobusComputeEngine`` (Parsl's HighThroughputExecutor: an interchange process and a worker
pool, started by a Parsl provider). The local backend runs the same engine on this machine
with a ``LocalProvider``, configured from the same YAML as an endpoint's engine (a rendered
``user_config_template.yaml.j2``) and loaded with the endpoint's own loader
(:func:`load_engine`), and ships each task as the SDK does: the function as its source text
(``PureSourceTextInspect``, as beamflow registers it with the service), the arguments with
the SDK's data serialiser, packed in a messagepack ``Task``. The result comes back as the
endpoint's messagepack ``Result``.

What this module adds around the engine, and why:

- **An owner thread.** The engine is started, and shut down, by one thread that lives as
  long as the engine: the interchange is told to die with that thread (``PR_SET_PDEATHSIG``),
  so it never outlives this process, however it ends.
- **Detached processes, tied to this one.** The interchange runs in a session of its own and
  the worker pool in a process group of its own (Parsl's ``LocalProvider`` does that part), so
  Ctrl-C at the terminal reaches this process only, which then shuts the engine down in order.
  The pool's job script watches this process and kills its process group when it is gone
  (kill -9, out of memory): an orphaned worker would go on computing beside the retry.
- **Cancellation.** HTEX cannot cancel a running task. Every task runs in its own sandbox
  directory (``run_in_sandbox``), so the worker process running it is the one whose working
  directory is that sandbox; :meth:`ComputeEngine.cancel` sends SIGTERM to that process only
  (a reconstruction saves a checkpoint and exits), then SIGKILL after a grace period. The pool
  reports the task lost (``WorkerLost``) and starts a new worker.
- **A restart.** An idle Parsl worker waits for its next task inside
  ``multiprocessing.Queue.get``, holding the pool's task queue's read lock (a semaphore); a
  kill -9 (or an out-of-memory kill) of that worker leaves the lock taken for ever, so the
  worker the pool starts in its place, and every other worker, never receives another task:
  the task sits in the pool with no progress and no error. A killed worker pool (its manager)
  leaves the executor in a failed state instead. Neither heals, so :meth:`ComputeEngine.fault`
  tells when it happened (the pool's log says a worker died while idle; the executor is in a
  bad state) and :meth:`ComputeEngine.restart` starts a fresh engine from the same
  configuration; :mod:`beamflow.local.compute` decides when (and restarts too when a task
  waits for a worker longer than a bound, whatever the cause).
- **A mark.** Every process of the engine carries ``BEAMFLOW_COMPUTE_ENGINE=<run dir>`` in its
  environment (the interchange: the run directory as its working directory);
  :func:`engine_processes` finds them, and :meth:`ComputeEngine.close` makes sure
  none is left.

Parsl and globus-compute-endpoint are imported inside the functions that need them: they take
a second to import, and most beamflow commands never start an engine.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import shlex
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beamflow.config import ConfigError

log = logging.getLogger(__name__)

ENGINE_MARK = "BEAMFLOW_COMPUTE_ENGINE"
INTERCHANGE_MODULE = "parsl.executors.high_throughput.interchange"

# Run by this interpreter in place of the interchange's own command line, then replaced
# (exec) by it: a session of its own (Ctrl-C at the terminal is not for it), death with the
# thread that started it, and the engine's mark in its environment.
_DETACH = """\
import os, sys
os.setsid()
if sys.platform.startswith("linux"):
    import ctypes, signal
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(1)  # the engine's owner is already gone
os.environ[sys.argv[2]] = sys.argv[3]
os.chdir(sys.argv[3])  # its mark too: it rewrites its environment's memory (setproctitle)
os.environ["GLOBUS_COMPUTE_USER_DIR"] = sys.argv[4]
os.execv(sys.argv[5], sys.argv[5:])
"""


class EngineError(RuntimeError):
    """The engine could not start, or is closed."""


# -- configuration ---------------------------------------------------------------------------
def default_engine_yaml(workers: int, gpus: Sequence[str] = ()) -> str:
    """The endpoint config the local backend uses unless ``compute.engine_config`` names one:
    ``workers`` worker processes on this machine, one GPU each when there are several."""
    accelerators = ""
    if len(gpus) > 1:
        # As on a workstation endpoint: one worker per GPU (Parsl starts no more workers than
        # there are accelerators). With one GPU the workers share it.
        accelerators = f"  available_accelerators: [{', '.join(repr(str(g)) for g in gpus)}]\n"
    return f"""\
# beamflow's local compute engine: a Globus Compute endpoint's engine config, minus the
# service connection (see deploy/compute-endpoint/workstation/user_config_template.yaml.j2).
engine:
  type: GlobusComputeEngine
  max_workers_per_node: {int(workers)}
{accelerators}\
  address: 127.0.0.1          # the interchange listens on loopback only
  heartbeat_period: 2         # a dead worker is noticed within 2 s
  heartbeat_threshold: 10     # a pool that lost its interchange stops after 10 s
  job_status_kwargs:
    strategy_period: 1        # the worker pool starts within a second, not five
  provider:
    type: LocalProvider
    init_blocks: 1
    min_blocks: 1             # kept warm: never scaled in while beamflow runs
    max_blocks: 1
"""


def load_engine(text: str, source: str) -> Any:
    """A (not yet started) ``GlobusComputeEngine`` from endpoint config YAML, loaded with
    globus-compute-endpoint's own loader; errors name ``source`` and the problem."""
    import click
    from globus_compute_endpoint.endpoint.config.utils import load_config_yaml
    from globus_compute_endpoint.engines import GlobusComputeEngine
    from parsl.providers import LocalProvider

    try:
        config = load_config_yaml(text)
    except click.ClickException as exc:
        raise ConfigError(
            f"{source}: not a Globus Compute endpoint configuration: {exc.message}"
        ) from None
    engine = getattr(config, "engine", None)
    if not isinstance(engine, GlobusComputeEngine):
        got = "no engine section" if engine is None else type(engine).__name__
        raise ConfigError(
            f"{source}: engine.type must be GlobusComputeEngine for the local backend ({got})"
        )
    provider = engine.executor.provider
    if not isinstance(provider, LocalProvider):
        raise ConfigError(
            f"{source}: engine.provider.type must be LocalProvider for the local backend "
            f"(got {type(provider).__name__}); a batch-system config belongs on a Globus "
            "Compute endpoint (deploy/compute-endpoint/)"
        )
    return engine


# -- processes -------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a process, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2])


def _pids() -> list[int]:
    try:
        return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return []


def engine_processes(run_dir: Path | str) -> list[int]:
    """Live (not zombie) processes of the engine run in ``run_dir``: those that carry its
    mark (in their environment; the interchange: as its working directory), and the rest of
    their process groups (the worker pool's job script, which sets the mark for its
    children)."""
    mark = f"{ENGINE_MARK}={Path(run_dir)}".encode()
    stats = {pid: stat for pid in _pids() if (stat := _stat(pid)) is not None and stat[0] != "Z"}
    marked = set()
    for pid in stats:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue  # gone, or not ours
        if mark in environ.split(b"\0") or cwd == str(run_dir):
            marked.add(pid)
    groups = {stats[pid][2] for pid in marked} - {os.getpgrp()}
    return sorted(pid for pid, stat in stats.items() if pid in marked or stat[2] in groups)


def pool_workers(run_dir: Path | str) -> list[int]:
    """The worker processes of the engine run in ``run_dir``'s pools, busy or idle: those
    of its processes that hold a Parsl worker log (``worker_<n>.log``) open."""
    found = []
    for pid in engine_processes(run_dir):
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                name = os.path.basename(os.readlink(fd))
                if name.startswith("worker_") and name.endswith(".log"):
                    found.append(pid)
                    break
    return found


def worker_pids(sandbox: Path) -> list[int]:
    """The process running the task whose sandbox this is: the one working in it whose parent
    is not (the task's own helper processes inherit the directory)."""
    target = str(sandbox)
    inside = {}
    for pid in _pids():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd == target and (stat := _stat(pid)) is not None and stat[0] != "Z":
            inside[pid] = stat[1]
    return [pid for pid, parent in inside.items() if parent not in inside]


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """CPU time (user + system, all threads) the processes have used so far; None when
    none of them is there."""
    total, found = 0.0, False
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        found = True
    return total / os.sysconf("SC_CLK_TCK") if found else None


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _tool(name: str) -> str:
    """An executable of this interpreter's environment (the venv's bin), else from PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise EngineError(
            f"{name} not found next to {sys.executable} nor on PATH: install "
            "globus-compute-endpoint in beamflow's environment"
        )
    return found


def new_run_dir(base: Path, keep: int = 3) -> Path:
    """A fresh run directory for an engine of this process under ``base``
    (``<time>-<pid>``); those of processes that have ended are removed, but for the ``keep``
    newest (their logs tell what happened to a process that died)."""
    base.mkdir(parents=True, exist_ok=True)
    ended = []
    for entry in sorted(base.iterdir(), reverse=True):
        pid = entry.name.rsplit("-", 1)[-1]
        if entry.is_dir() and pid.isdigit() and _stat(int(pid)) is None:
            ended.append(entry)
    for entry in ended[keep:]:
        shutil.rmtree(entry, ignore_errors=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1000):
        run_dir = base / f"{stamp}{'.' + str(n) if n else ''}-{os.getpid()}"
        with contextlib.suppress(FileExistsError):
            run_dir.mkdir()
            return run_dir
    raise EngineError(f"{base}: cannot create a run directory")


# -- a task ----------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a task gave: its value, or an error as ``{type, message, traceback}``."""

    ok: bool
    value: Any = None
    error: dict[str, Any] | None = None


@dataclass
class EngineTask:
    task_id: uuid.UUID
    future: Future  # resolves to the packed messagepack Result
    sandbox: Path


def parse_error(text: str, code: str | None = None) -> dict[str, Any]:
    """``{type, message, traceback}`` from the exception text of an endpoint ``Result``.

    The text is a formatted traceback, framed by lines of ``+`` and ``-`` when the engine
    itself failed the task (a lost worker), or ``repr`` of an endpoint error."""
    lines = [ln for ln in text.strip().splitlines() if not ln or ln.strip("+-")]
    frames = [i for i, ln in enumerate(lines) if ln.startswith(" ")]
    start = frames[-1] + 1 if frames else 0
    while start < len(lines) and not lines[start].strip():
        start += 1
    tail = lines[start:] if start < len(lines) else [text.strip()]
    head, _, rest = tail[0].partition(": ")
    if " " in head or not head or (not frames and "(" in head):  # no "Type: message" line
        kind, message = (code or "Error"), "\n".join(tail)
    else:
        kind, message = head.rsplit(".", 1)[-1], "\n".join([rest, *tail[1:]]).strip()
    return {"type": kind, "message": message, "traceback": "\n".join(lines)}


# -- the engine ------------------------------------------------------------------------------
class ComputeEngine:
    """One ``GlobusComputeEngine`` on this machine: started once, shared by every task."""

    # How long the processes of an engine being shut down get to exit before SIGKILL.
    SHUTDOWN_GRACE_S = 10.0

    def __init__(
        self,
        engine: Any,
        run_dir: Path,
        *,
        endpoint_id: str | None = None,
        warm_up: Callable[[], Any] | None = None,
        source_dirs: Sequence[Path] = (),
        factory: Callable[[], Any] | None = None,
    ) -> None:
        from globus_compute_sdk.serialize import ComputeSerializer, PureSourceTextInspect

        self.engine = engine
        self.run_dir = Path(run_dir).resolve()
        try:
            self.endpoint_id = uuid.UUID(str(endpoint_id))
        except ValueError:
            self.endpoint_id = uuid.uuid4()
        self.warm_up = warm_up
        # Directories the workers import from (beamflow itself, installed or not).
        self.source_dirs = [Path(__file__).resolve().parents[2], *source_dirs]
        self.serde = ComputeSerializer(strategy_code=PureSourceTextInspect())
        self._lock = threading.Lock()  # HTEX's task socket is not thread-safe
        # A fresh engine for :meth:`restart` (``from_yaml``: the same configuration).
        self._factory = factory
        # Held while tasks are handed over and while the engine is swapped for a fresh one.
        self._generation_lock = threading.RLock()
        self.restarts = 0
        self._log_offsets: dict[Path, int] = {}
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._closed = False

    @classmethod
    def from_yaml(cls, text: str, source: str, run_dir: Path, **kwargs: Any) -> ComputeEngine:
        return cls(
            load_engine(text, source), run_dir, factory=lambda: load_engine(text, source), **kwargs
        )

    # -- sizes and places --------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Tasks the engine runs at once: workers per node x nodes per block x blocks."""
        executor = self.engine.executor
        per_node = executor.workers_per_node
        if not math.isfinite(per_node):  # no max_workers_per_node: the pool uses every core
            per_node = os.cpu_count() or 1
        provider = executor.provider
        return max(1, int(per_node) * int(provider.nodes_per_block) * int(provider.max_blocks))

    @property
    def working_dir(self) -> Path:
        return Path(self.engine.working_dir) if os.path.isabs(self.engine.working_dir) else (
            self.run_dir / self.engine.working_dir
        )

    def sandbox(self, task_id: uuid.UUID) -> Path:
        return (self.working_dir / str(task_id)).resolve()

    def processes(self) -> list[int]:
        return engine_processes(self.run_dir)

    def workers(self) -> list[int]:
        return pool_workers(self.run_dir)

    # -- start -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine in the background (idempotent); :meth:`wait_ready` waits for it."""
        with self._lock:
            if self._closed:
                raise EngineError("the compute engine is closed")
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._own, args=(self.engine, self._ready, self._stop),
                name="compute-engine", daemon=True,
            )  # fmt: skip
            self._thread.start()
        # A process that ends without closing the engine still shuts it down in order (a
        # running reconstruction saves its checkpoint); the kill -9 case is the job script's.
        atexit.register(self.close)

    def wait_ready(self, timeout: float | None = 180.0) -> None:
        self.start()
        if not self._ready.wait(timeout):
            raise EngineError(f"the compute engine did not start within {timeout} s")
        if self._error is not None:
            raise EngineError(f"the compute engine failed to start: {self._error}")
        if self._closed:
            raise EngineError("the compute engine is closed")

    def _prepare(self, engine: Any) -> None:
        """Point the engine's processes at this interpreter and this beamflow, and tie them to
        this process (see the module docstring)."""
        executor = engine.executor
        self.run_dir.mkdir(parents=True, exist_ok=True)
        gc_dir = self.run_dir / "globus_compute"  # the endpoint CLI's home, not ~/.globus_compute
        gc_dir.mkdir(exist_ok=True)
        # Cancellation finds a task's worker by its sandbox; a retry after a lost worker is
        # the flow's decision (and a cancelled task must not run again).
        engine.run_in_sandbox = True
        engine.max_retries_on_system_failure = 0
        command = list(executor.interchange_launch_cmd)
        command[0] = _tool(command[0])
        executor.interchange_launch_cmd = [
            sys.executable, "-c", _DETACH, str(os.getpid()), ENGINE_MARK, str(self.run_dir),
            str(gc_dir), *command,
        ]  # fmt: skip
        python_path = os.pathsep.join(shlex.quote(str(p)) for p in self.source_dirs)
        prelude = "\n".join([
            "# beamflow: this interpreter and this beamflow; the engine's mark; and the pool",
            "# dies with the process that owns the engine",
            f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:\"$PATH\"",
            f"export PYTHONPATH={python_path}${{PYTHONPATH:+:$PYTHONPATH}}",
            f"export GLOBUS_COMPUTE_USER_DIR={shlex.quote(str(gc_dir))}",
            f"export {ENGINE_MARK}={shlex.quote(str(self.run_dir))}",
            f"( while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; kill -KILL 0 ) "
            ">/dev/null 2>&1 &",
        ])  # fmt: skip
        provider = executor.provider
        provider.worker_init = prelude + "\n" + (provider.worker_init or "")
        # Parsl logs every task at INFO; the engine's own logs are in its run directory.
        for name in ("parsl", "globus_compute_endpoint"):
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)

    def _own(self, engine: Any, ready: threading.Event, stop: threading.Event) -> None:
        """The owner thread of one engine: start, serve until :meth:`close` (or
        :meth:`restart`), shut down."""
        began = time.monotonic()
        try:
            self._prepare(engine)
            engine.start(endpoint_id=self.endpoint_id, run_dir=str(self.run_dir))
        except BaseException as exc:  # noqa: BLE001 - reported by wait_ready and submit
            log.error("compute engine failed to start: %s", exc)
            self._error = exc
            ready.set()
            with contextlib.suppress(Exception):
                engine.shutdown()
            return
        log.info(
            "compute engine started",
            extra={"fields": {"run_dir": str(self.run_dir), "workers": self.capacity,
                              "seconds": round(time.monotonic() - began, 2)}},
        )  # fmt: skip
        ready.set()
        if self.warm_up is not None:
            self._warm(engine)
        stop.wait()
        try:
            engine.shutdown()
        except Exception:  # noqa: BLE001 - close() sweeps what is left
            log.exception("compute engine shutdown failed")

    def _warm(self, engine: Any) -> None:
        """One warm-up task per worker, so the first real task finds its imports done."""
        try:
            function = self.pack_function(self.warm_up)  # type: ignore[arg-type]
            for _ in range(self.capacity):
                self._hand(engine, function, (), {}, None, uuid.uuid4())
        except Exception as exc:  # noqa: BLE001 - only a warm-up: the real task will tell
            if self._closed:  # closed while warming up (nothing to do): nothing failed
                return
            log.warning("compute engine warm-up failed: %s", exc)

    # -- tasks -------------------------------------------------------------------------------
    def pack_function(self, function: Callable[..., Any]) -> str:
        """The function as the SDK registers it (its source text); errors say why not."""
        from globus_compute_sdk.errors import SerializationError

        try:
            return self.serde.pack_buffers([self.serde.serialize(function)])
        except SerializationError as exc:
            cause = exc.__cause__ or exc
            name = getattr(function, "__name__", repr(function))
            raise EngineError(
                f"cannot ship function {name} as Globus Compute does (its source text): {cause}"
            ) from None

    def submit(
        self,
        function: str,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        resource_specification: dict[str, Any] | None = None,
        *,
        task_id: uuid.UUID | None = None,
    ) -> EngineTask:
        """Submit a packed function (:meth:`pack_function`) with its arguments."""
        with self._generation_lock:
            self.wait_ready()
            return self._hand(
                self.engine, function, args, kwargs, resource_specification, task_id or uuid.uuid4()
            )

    def _hand(
        self,
        engine: Any,
        function: str,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        resource_specification: dict[str, Any] | None,
        task_id: uuid.UUID,
    ) -> EngineTask:
        """Pack the task as the service does and give it to ``engine``."""
        from globus_compute_common import messagepack
        from globus_compute_common.messagepack.message_types import Task
        from globus_compute_endpoint.engines.base import GCFuture

        payload = self.serde.pack_buffers(
            [self.serde.serialize(tuple(args)), self.serde.serialize(dict(kwargs))]
        )
        # What the service hands an endpoint: the registered function's buffer, then the
        # batch's arguments buffer.
        packed = messagepack.pack(Task(task_id=task_id, task_buffer=function + payload))
        future = GCFuture(task_id)
        with self._lock:
            if self._closed:
                raise EngineError("the compute engine is closed")
            engine.submit(future, packed, resource_specification or {})
        return EngineTask(task_id=task_id, future=future, sandbox=self.sandbox(task_id))

    def picked_up(self, task: EngineTask) -> bool:
        """Whether a worker has taken the task (the worker makes its sandbox first)."""
        return task.sandbox.exists()

    def cpu_seconds(self, task: EngineTask) -> float | None:
        """CPU time the worker running the task has used; None if no worker runs it."""
        return cpu_seconds(worker_pids(task.sandbox))

    def outcome(self, task: EngineTask) -> Outcome:
        """The finished task's value or error."""
        from globus_compute_common import messagepack

        try:
            result = messagepack.unpack(task.future.result())
            if result.is_error:
                code = result.error_details.code if result.error_details else None
                return Outcome(False, error=parse_error(result.data, code))
            return Outcome(True, value=self.serde.deserialize(result.data))
        except Exception as exc:  # noqa: BLE001 - an unreadable result is the task's failure
            return Outcome(
                False, error={"type": type(exc).__name__, "message": str(exc), "traceback": None}
            )

    def cancel(self, task: EngineTask, *, grace: float = 30.0, timeout: float = 120.0) -> None:
        """Stop the task's worker process (SIGTERM, then SIGKILL after ``grace`` seconds) as
        soon as it runs the task; returns when the task has ended or after ``timeout``.

        Only the process working in the task's sandbox is signalled: not the pool, not the
        other workers. A task still waiting for a worker is stopped when it gets one."""
        deadline = time.monotonic() + timeout
        termed: dict[int, float] = {}
        while not task.future.done() and time.monotonic() < deadline and not self._stop.is_set():
            for pid in worker_pids(task.sandbox):
                if pid not in termed:
                    log.debug("cancel: SIGTERM to worker %d (task %s)", pid, task.task_id)
                    _signal(pid, signal.SIGTERM)
                    termed[pid] = time.monotonic()
                elif time.monotonic() - termed[pid] > grace:
                    log.warning("cancel: worker %d ignored SIGTERM for %.0f s; SIGKILL", pid, grace)
                    _signal(pid, signal.SIGKILL)
            wait([task.future], timeout=0.05)

    def forget(self, task: EngineTask) -> None:
        """Remove the task's sandbox (the function runs in it; what it writes belongs in its
        output directory)."""
        shutil.rmtree(task.sandbox, ignore_errors=True)

    # -- health and restart ------------------------------------------------------------------
    def fault(self) -> str | None:
        """Why the running engine can no longer be trusted to hand tasks to workers, or None.

        Each idle worker's death is reported once (see the module docstring: the pool's task
        queue is then locked for ever); a failed executor, as long as it lasts."""
        if self.failed:
            exc = self.engine.executor.executor_exception
            cause = " ".join(str(exc).split())[:200]
            return f"the worker pool failed ({type(exc).__name__}: {cause})"
        if not self._ready.is_set() or self._error is not None or self._closed:
            return None
        deaths = self._idle_worker_deaths()
        if deaths:
            return (
                f"{deaths} idle worker{'s' if deaths > 1 else ''} died (killed, or out of "
                "memory), which leaves the pool's task queue locked"
            )
        return None

    @property
    def failed(self) -> bool:
        """Whether the running engine's executor gave up (its worker pool died): it fails
        every task handed to it until restarted."""
        started = self._ready.is_set() and self._error is None and not self._closed
        return started and bool(self.engine.executor.bad_state_is_set)

    def _idle_worker_deaths(self) -> int:
        """Lines the pools' managers logged, since the last look, about a worker that died
        while not busy (Parsl's own words in ``manager.log``)."""
        deaths = 0
        for path in self.run_dir.glob("*/block-*/*/manager.log"):
            start = self._log_offsets.get(path, 0)
            try:
                with path.open("rb") as fh:
                    fh.seek(start)
                    text = fh.read()
            except OSError:
                continue
            complete = text.rfind(b"\n") + 1  # a line still being written waits
            self._log_offsets[path] = start + complete
            deaths += text[:complete].count(b"was not busy when it died")
        return deaths

    def restart(self, reason: str, timeout: float = 60.0) -> None:
        """Shut the engine down (tasks it holds are lost) and start a fresh one from the same
        configuration. Tasks submitted meanwhile wait for the new engine."""
        if self._factory is None:
            raise EngineError(f"cannot restart the compute engine ({reason}): it was not "
                              "built from a configuration")  # fmt: skip
        with self._generation_lock:
            log.warning("compute engine: restarting: %s", reason)
            self._stop_owner(timeout, expected=True)
            # What the old pool logged while it was shut down (its workers dying) is not a
            # fault of the new one.
            self._idle_worker_deaths()
            with self._lock:
                if self._closed:
                    raise EngineError("the compute engine is closed")
                self.engine = self._factory()
                self._thread, self._error = None, None
                self._ready, self._stop = threading.Event(), threading.Event()
                self.restarts += 1
            self.start()

    def _stop_owner(self, timeout: float, expected: bool = False) -> None:
        """Stop the owner thread (it shuts the engine down) and sweep what is left (after a
        fault, ``expected``: the processes of a broken pool do not all stop when asked)."""
        with self._lock:
            thread = self._thread
        self._stop.set()
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            log.warning("compute engine: shutdown still running after %.0f s", timeout)
        left = self.processes()
        deadline = time.monotonic() + self.SHUTDOWN_GRACE_S
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.processes()
        for pid in left:
            log.log(logging.INFO if expected else logging.WARNING,
                    "compute engine: process %d outlived the shutdown; SIGKILL", pid)
            _signal(pid, signal.SIGKILL)

    # -- close -------------------------------------------------------------------------------
    def close(self, timeout: float = 60.0) -> None:
        """Shut the engine down: interchange, worker pool and running tasks; then make sure
        no process of it is left."""
        with self._lock:
            if self._closed and self._stop.is_set():
                return
            self._closed = True
        atexit.unregister(self.close)
        self._stop_owner(timeout)
        shutil.rmtree(self.working_dir, ignore_errors=True)
