"""SIGTERM handling: flush the checkpoint before a batch system kills the job.

Schedulers (Slurm, PBS) send SIGTERM and follow with SIGKILL after a grace period. Two modes:

* immediate (default): the handler flushes the pending snapshot (already on host memory, so
  consistent) and exits with 128+SIGTERM.
* deferred (``defer=True``): the handler only sets `requested`; the caller checks it at a
  safe point (an iteration boundary), saves the current state and calls `exit()`. A second
  SIGTERM while deferred flushes and exits at once.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

from beamflow.checkpoint.writer import Checkpointer


class TerminationGuard:
    def __init__(self, checkpointer: Checkpointer, *, defer: bool = False,
                 flush_timeout: float | None = 60.0) -> None:
        self.checkpointer = checkpointer
        self.defer = defer
        self.flush_timeout = flush_timeout
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def install(self) -> TerminationGuard:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("SIGTERM handler can only be installed from the main thread")
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        return self

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def exit(self) -> None:
        """Flush and leave with the conventional status of a SIGTERM'd process."""
        self.checkpointer.flush(self.flush_timeout)
        self.uninstall()
        sys.exit(128 + signal.SIGTERM)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.defer and not self.requested:
            self.requested = True
            return
        self.exit()

    def __enter__(self) -> TerminationGuard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def install_sigterm_flush(checkpointer: Checkpointer, *, defer: bool = False) -> TerminationGuard:
    """Install a SIGTERM handler that flushes `checkpointer` and exits (main thread only)."""
    return TerminationGuard(checkpointer, defer=defer).install()
