"""The clocks a local flow run reads and sleeps on: :class:`SystemClock` (real time;
``time_scale`` < 1 makes waits and polls shorter while the flow sees full-length time) and
:class:`ManualClock` (sleeps return at once and advance its time; for tests)."""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch, as the flow sees them."""
        ...

    def sleep(self, seconds: float, interrupt: threading.Event) -> bool:
        """Wait ``seconds`` of flow time; return True early if ``interrupt`` is set."""
        ...


class SystemClock:
    """Real time; ``time_scale`` < 1 shortens every wait while flow time runs faster."""

    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.time_scale = time_scale
        self._wall0 = time.time()
        self._mono0 = time.monotonic()

    def time(self) -> float:
        return self._wall0 + (time.monotonic() - self._mono0) / self.time_scale

    def sleep(self, seconds: float, interrupt: threading.Event) -> bool:
        return interrupt.wait(max(0.0, seconds) * self.time_scale)


class ManualClock:
    """Flow time that only moves when the flow sleeps (or :meth:`advance` is called)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self._lock = threading.Lock()
        self.sleeps: list[float] = []

    def time(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds

    def sleep(self, seconds: float, interrupt: threading.Event) -> bool:
        if interrupt.is_set():
            return True
        with self._lock:
            self.sleeps.append(seconds)
            self.now += max(0.0, seconds)
        return interrupt.is_set()
