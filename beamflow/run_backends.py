"""Which run backend the configuration names, opened for those who start runs: the CLI,
the edge agent, the demo and the status page's retry button.

Above both backends and the run path (``beamflow.runs``), so that neither backend imports
what imports it: the run path takes the backend it is handed.
"""

from __future__ import annotations

import threading

from beamflow.config import Settings
from beamflow.runs.backend import RunBackend
from beamflow.runs.lifecycle import RetryRefused, follow_run, retry_run
from beamflow.runs.records import Run
from beamflow.runs.store import Store

__all__ = ["get_run_backend", "retry_and_follow"]


def get_run_backend(settings: Settings) -> RunBackend:
    """The backend the configuration names. The packages are imported here, not at the top,
    so a local run does not pay for importing the Globus SDKs (nor the reverse)."""
    if settings.backend == "local":
        from beamflow.local import LocalRunBackend

        return LocalRunBackend(settings)
    from beamflow.globus import GlobusRunBackend

    return GlobusRunBackend(settings)


def retry_and_follow(settings: Settings, run_id: str, *, store: Store | None = None) -> Run:
    """The status page's retry button: :func:`~beamflow.runs.lifecycle.retry_run` on a
    backend of its own, and a background thread that follows the new run until it ends,
    then closes the backend."""
    store = store or Store(settings.store_path)
    old = store.require_run(run_id)
    if old.retry_refusal:  # refused before a backend is opened for nothing
        raise RetryRefused(old.retry_refusal, old.retried_by)
    backend = get_run_backend(settings)
    try:
        new = retry_run(settings, run_id, store=store, backend=backend)
    except BaseException:
        backend.close()
        raise
    if new.status.finished:
        backend.close()
        return new

    def follow() -> None:
        try:
            follow_run(store, backend, new)  # the store keeps one connection per thread
        except Exception:  # noqa: BLE001 - the run is recorded; following is best effort
            pass
        finally:
            backend.close()

    threading.Thread(target=follow, name=f"follow-{new.id[:8]}", daemon=True).start()
    return new
