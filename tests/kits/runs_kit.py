"""For the run path's tests: a run backend with nothing behind it (each test's backend
subclasses it and scripts only the calls it is about: ``start_run``, ``get_run``), and
calls made at once from several threads (two retries of a run, from the page and a
terminal)."""

from __future__ import annotations

import threading
from collections.abc import Callable
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
