"""The status page: runs, steps, previews, live updates, and its JSON API.

``create_app(store, StatusOptions(...), retry=...)`` builds the FastAPI app;
``beamflow serve`` runs it under uvicorn (see :mod:`beamflow.status.server`).
"""

from beamflow.status.app import RetryFn, StatusOptions, create_app

__all__ = ["RetryFn", "StatusOptions", "create_app"]
