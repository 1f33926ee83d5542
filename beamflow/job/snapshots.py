"""The job's snapshot consumer: a thread that waits for a state's copy to the host and hands
the state on (to the checkpointer, to the live previews), so that the iterations never wait
for that copy.

On a GPU, :meth:`beamflow.ptycho.engine.Reconstructor.snapshot_async` starts the copy
device→page-locked host on a side stream and returns at once; its ``.result()`` waits for
that copy. The job's loop starts a snapshot when a checkpoint or a preview is due and
submits it here::

    consumer = SnapshotConsumer()
    if not consumer.in_flight():                 # at most one snapshot in flight
        consumer.submit(rec.snapshot_async(), lambda state: ck.save(...))
    ...
    consumer.close()                             # the snapshot in hand lands and is used

Rules, and why:

* **At most one snapshot in flight.** A caller that finds one still in flight skips (what is
  due stays due and is taken at a later iteration, with a fresher state): waiting would
  stall the loop, which is what this is for; a queue would hold several states' memory and
  write states already stale.
* **In order.** One thread, one snapshot at a time: a state is handed on only after the one
  before it.
* **Abandon** (a requested stop, SIGTERM): the snapshot in hand is never handed on; a hand-over
  already under way is waited for. The caller then saves the newest state itself, which no
  older one can overtake.
* **Failures** on the consumer's thread (a device error in the copy, a checkpoint refused as
  a programming error) are raised on the caller's thread, at its next ``in_flight``,
  ``submit`` or ``close``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["SnapshotConsumer"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Pending(Protocol[T_co]):
    """A value on its way (a :class:`beamflow.ptycho.engine.PendingSnapshot`)."""

    def result(self) -> T_co: ...


class SnapshotConsumer(Generic[T]):
    """One thread that waits for each submitted snapshot and hands it to its user."""

    def __init__(self, name: str = "snapshot-consumer") -> None:
        self.name = name
        self._cv = threading.Condition()
        self._job: tuple[Pending[T], Callable[[T], None]] | None = None
        self._using = False  # the job's state is being handed on
        self._abandoned = False
        self._closed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        #: snapshots handed on, and submitted ones abandoned before that
        self.used = 0
        self.abandoned = 0

    def in_flight(self) -> bool:
        """Whether a submitted snapshot has not been handed on yet (raises what failed)."""
        with self._cv:
            self._raise_error()
            return self._job is not None

    def submit(self, pending: Pending[T], use: Callable[[T], None]) -> None:
        """Wait for ``pending.result()`` on the consumer's thread, then call ``use`` with it.

        Only when nothing is in flight (``in_flight()`` is False)."""
        with self._cv:
            self._raise_error()
            if self._closed:
                raise RuntimeError("SnapshotConsumer is closed")
            if self._job is not None:
                raise RuntimeError("a snapshot is in flight already: check in_flight() first")
            self._job = (pending, use)
            self._cv.notify_all()
        if self._thread is None:  # started on first use: a job without snapshots has none
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def abandon(self) -> None:
        """Never hand on the snapshot in hand, and take no more; return once no hand-over
        is under way. The thread ends when the copy it waits for lands (it is a daemon: a
        copy that never lands does not hold the process)."""
        with self._cv:
            self._abandoned = self._closed = True
            if self._job is not None and not self._using:
                self.abandoned += 1
            while self._using:
                self._cv.wait()
            self._cv.notify_all()

    def close(self) -> None:
        """Let the snapshot in hand land and be handed on (unless abandoned), stop the
        thread, and raise what failed on it. Closing again does nothing."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            wait = self._thread is not None and not self._abandoned
        if wait:
            self._thread.join()
        with self._cv:
            self._raise_error()

    # -- the consumer's thread -------------------------------------------------------------
    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._closed:
                    self._cv.wait()
                if self._job is None or self._abandoned:
                    return
                pending, use = self._job
            try:
                state = pending.result()  # the copy: the only wait, and it is ours
                with self._cv:
                    if self._abandoned:
                        return
                    self._using = True
                use(state)
                self.used += 1
            except BaseException as e:  # raised on the caller's thread, at its next call
                with self._cv:
                    if not self._abandoned:
                        self._error = e
            finally:
                with self._cv:
                    self._job = None
                    self._using = False
                    self._cv.notify_all()
