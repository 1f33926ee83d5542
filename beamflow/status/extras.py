"""What the operator sees beside a run's view (:class:`~beamflow.status.views.RunView`): the
step in the words of the Steps card, how fast a running reconstruction iterates and when it
will be done, and where its logs are.

Speed comes from the progress the run already records: the store's iteration count and the
time it was written (``Run.updated_at``). The server keeps the last two minutes of those
samples per running run, in memory; the first view of a run has one sample, so its speed
shows from the next refresh on (the page refreshes every ``poll_seconds``).
"""

from __future__ import annotations

import threading
from collections import deque

from pydantic import BaseModel

from beamflow.runs.records import Run, RunStatus
from beamflow.status.views import format_duration, step_label

RATE_WINDOW = 120.0  # seconds of samples behind a speed
MAX_TRACKED = 1000  # runs followed at once; the least recently seen is dropped first


class RunExtras(BaseModel):
    """Beside ``RunView`` in ``/api/runs`` (``extras``, by run id) and ``/api/runs/{id}``."""

    step_text: str | None = None  # the current step, as the Steps card words it
    error_step_text: str | None = None
    iterations_per_second: float | None = None
    eta_seconds: float | None = None
    rate_text: str = ""  # "12.5 it/s · about 1 min 20 s left"
    logs_url: str


class RateTracker:
    """Samples (time written, iteration) of running runs, as successive reads see them."""

    def __init__(self, window: float = RATE_WINDOW) -> None:
        self.window = window
        self._samples: dict[str, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()

    def observe(self, run: Run) -> tuple[float | None, float | None]:
        """(iterations per second, seconds left) of a running run, None where unknown."""
        if run.status != RunStatus.ACTIVE or run.iteration is None:
            with self._lock:
                self._samples.pop(run.id, None)
            return None, None
        sample = (run.updated_at, run.iteration)
        with self._lock:
            samples = self._samples.pop(run.id, None) or deque()
            self._samples[run.id] = samples  # now the most recently seen
            if samples and (sample[0] < samples[-1][0] or sample[1] < samples[-1][1]):
                samples.clear()  # the count went back: a new attempt at the same id
            if not samples or samples[-1] != sample:
                samples.append(sample)
            while len(samples) > 2 and samples[-1][0] - samples[1][0] >= self.window:
                samples.popleft()
            while len(self._samples) > MAX_TRACKED:
                del self._samples[next(iter(self._samples))]
            (t0, i0), (t1, i1) = samples[0], samples[-1]
        if t1 <= t0 or i1 <= i0:
            return None, None
        rate = (i1 - i0) / (t1 - t0)
        left = None
        if run.iterations_total is not None and run.iterations_total >= run.iteration:
            left = (run.iterations_total - run.iteration) / rate
        return rate, left


def extras_of(run: Run, tracker: RateTracker) -> RunExtras:
    rate, left = tracker.observe(run)
    text = ""
    if rate is not None:
        text = f"{rate:.3g} it/s" if rate >= 0.1 else f"{60 * rate:.3g} it/min"
        if left is not None:
            text += f" · about {format_duration(left)} left"
    return RunExtras(
        step_text=step_label(run.current_step) if run.current_step else None,
        error_step_text=step_label(run.error_step) if run.error_step else None,
        iterations_per_second=rate,
        eta_seconds=left,
        rate_text=text,
        logs_url=f"/runs/{run.id}/logs",
    )
