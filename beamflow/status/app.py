"""The status page and its JSON API (FastAPI, Jinja2 templates, a small static script).

One router per area, all over one :class:`~beamflow.status.site.Site`:

Pages:  ``/`` runs (filters, pagination) and the edge agent's panel, ``/runs/{id}`` one run
        (:mod:`~beamflow.status.pages`).
API:    ``/api/runs``, ``/api/runs/{id}``, ``POST /api/runs/{id}/retry``, ``/api/agent``,
        ``/api/openapi.json``, ``/healthz`` (:mod:`~beamflow.status.api`).
Files:  ``/files/{run_id}/{index|name|product}``: only files a run in the store lists
        (:mod:`~beamflow.status.files`).
Auth:   ``/login``, ``/logout`` (:mod:`~beamflow.status.auth`).

Who may see what is :mod:`beamflow.status.security`'s: off loopback everything but
``/healthz``, ``/login`` and the static files needs the token unless ``public_viewing``.

The store is read on every request (the agent writes it from another process); handlers are
plain functions, so FastAPI runs them in its thread pool and each thread has its own SQLite
connection. Nothing here writes the store except a retry, which goes through the shared run
path (``beamflow.runs.lifecycle``) that the CLI uses too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from beamflow import __version__
from beamflow.runs.store import Store
from beamflow.status import api, auth, files, pages
from beamflow.status.forms import local_target
from beamflow.status.security import SecurityMiddleware
from beamflow.status.site import STATIC, RetryFn, Site, StatusOptions

__all__ = ["RetryFn", "StatusOptions", "create_app"]


def create_app(
    store: Store, options: StatusOptions | None = None, *, retry: RetryFn | None = None
) -> FastAPI:
    """The status web app over ``store``; ``retry`` is the shared run path (None: no retries)."""
    site = Site(store, options or StatusOptions(), retry)
    app = FastAPI(
        title="beamflow status",
        version=__version__,
        docs_url=None,  # the Swagger UI loads assets from a CDN; the page must work offline
        redoc_url=None,
        openapi_url=None,  # served by the API router, behind the same gate as the rest
    )
    app.add_middleware(SecurityMiddleware, loopback=site.guard.loopback)
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    app.state.store = store
    app.state.guard = site.guard
    app.add_exception_handler(StarletteHTTPException, _error_handler(site))
    for area in (pages, api, files, auth):
        app.include_router(area.router(site))
    return app


def _error_handler(site: Site) -> Callable[[Request, Exception], Awaitable[Response]]:
    """HTML pages answer errors with a page (a 401 with the login form), the rest in JSON."""

    def wants_html(request: Request) -> bool:
        return not request.url.path.startswith(("/api/", "/healthz", "/files/"))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if wants_html(request):
            if exc.status_code == 401:
                # The login form itself, answered 401: a browser shows the form, a script
                # or curl sees the refusal (no redirect that looks like success).
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return site.render(
                    request, "login.html", status_code=401, next=local_target(target),
                    failed=False, headers={"www-authenticate": "Bearer"},
                )
            return site.render(
                request, "error.html", status_code=exc.status_code,
                code=exc.status_code, message=str(exc.detail),
            )
        headers = {"www-authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    return http_error
