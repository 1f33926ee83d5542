"""For the run path's tests: a run backend with nothing behind it (each test's backend
subclasses it and scripts only the calls it is about: ``start_run``, ``get_run``), and
calls made at once from several threads (two retries of a run, from the page and a
terminal), and a wait for the run store to show what a test or a benchmark waits for."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class QuietRunBackend:
    """The local run backend's name; cancelling and closing do nothing."""

    name = "local"

    def cancel_run(self, backend_run_id: str) -> None:
        pass

    def close(self) -> None:
        pass


def at_once(call: Callable[[], Any], threads: int, refused: type[Exception]) -> list[Any]:
    """``call`` made in ``threads`` threads released together: what each returned, or the
    ``refused`` exception it raised (any other fails the test)."""
    barrier, outcomes = threading.Barrier(threads), []

    def one() -> None:
        barrier.wait()
        try:
            outcomes.append(call())
        except refused as exc:
            outcomes.append(exc)

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert len(outcomes) == threads, "a call raised something other than a refusal"
    return outcomes


def runs_when(store: Any, check: Callable[[list], bool], timeout: float, what: str = "",
              log: Path | None = None) -> list:
    """The store's runs, oldest first, once ``check(runs)`` holds; after ``timeout`` seconds
    a TimeoutError naming ``what``, every run's state and the tail of ``log``."""
    deadline = time.monotonic() + timeout
    while True:
        runs = store.list_runs(limit=None, oldest_first=True)
        if check(runs):
            return runs
        if time.monotonic() > deadline:
            table = [(r.scan_name, r.status.value, r.current_step, r.attempt, r.error)
                     for r in runs]
            tail = log.read_text()[-3000:] if log else ""
            raise TimeoutError(f"timed out waiting for {what}; runs: {table}\nlog: {tail}")
        time.sleep(0.05)
