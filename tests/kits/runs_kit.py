"""A run backend with nothing behind it, for the run path's tests: each test's backend
subclasses it and scripts only the calls it is about (``start_run``, ``get_run``)."""

from __future__ import annotations


class QuietRunBackend:
    """The local run backend's name; cancelling and closing do nothing."""

    name = "local"

    def cancel_run(self, backend_run_id: str) -> None:
        pass

    def close(self) -> None:
        pass
