"""The status page and its JSON API (FastAPI, Jinja2 templates, a small static script).

Pages:  ``/`` runs (filters, pagination) and the edge agent's panel, ``/runs/{id}`` one run,
        ``/login``.
API:    ``/api/runs``, ``/api/runs/{id}``, ``POST /api/runs/{id}/retry``, ``/api/agent``,
        ``/api/openapi.json``, ``/healthz``.
Files:  ``/files/{run_id}/{index|name|product}``: only files a run in the store lists.

Who may see what is :mod:`beamflow.status.security`'s: off loopback everything but
``/healthz``, ``/login`` and the static files needs the token unless ``public_viewing``.

The store is read on every request (the agent writes it from another process); handlers are
plain functions, so FastAPI runs them in its thread pool and each thread has its own SQLite
connection. Nothing here writes the store except a retry, which goes through the shared run
path (``beamflow.runs``) that the CLI uses too.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path, PurePath
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import BaseModel, Field, SecretStr
from starlette.exceptions import HTTPException as StarletteHTTPException

from beamflow import __version__
from beamflow.status import views
from beamflow.status.security import COOKIE, Guard, SecurityMiddleware
from beamflow.store import Run, RunStatus, Store, StoreError

log = logging.getLogger(__name__)

PACKAGE = Path(str(files("beamflow.status")))
TEMPLATES = PACKAGE / "templates"
STATIC = PACKAGE / "static"
MAX_LIMIT = 500
# What `beamflow runs retry` accepts too (beamflow.runs.retry_run): a new attempt of a run
# that ended without a result.
RETRYABLE = (RunStatus.FAILED, RunStatus.CANCELLED)

# Retry a failed run: gets the run id, returns the new run (or its id). Raises ValueError or
# StoreError when the run cannot be retried, any other exception when the backend fails.
RetryFn = Callable[[str], "Run | str"]


class StatusOptions(BaseModel):
    """How one status server behaves (from ``Settings.status`` and the ``serve`` options)."""

    host: str = "127.0.0.1"
    token: SecretStr | None = None
    public_viewing: bool = Field(
        default=False, description="off loopback: viewing without the token (explicit opt-in)"
    )
    poll_seconds: float = Field(default=2.0, gt=0, description="browser refresh interval")
    files_root: Path | None = Field(
        default=None, description="base for relative preview/product paths in the store"
    )
    agent_state: Path | None = Field(
        default=None, description="the edge agent's agent.json (its state directory)"
    )


class RunsPage(BaseModel):
    """``/api/runs``: one page of runs, newest first, with the total for the filters."""

    total: int
    limit: int
    offset: int
    status: list[RunStatus]
    scan: str | None
    counts: dict[str, int]
    runs: list[views.RunView]


class RunDetail(BaseModel):
    """``/api/runs/{id}``: a run with its steps, previews, parameters and recent events."""

    run: views.RunView
    steps: list[views.StepView]
    previews: list[views.PreviewView]
    parameters: dict[str, Any]
    result: dict[str, Any]
    product_url: str | None
    events: list[views.EventView]
    can_retry: bool


def _static_version() -> str:
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(STATIC.iterdir()):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def _parse_status(values: list[str] | None) -> list[RunStatus]:
    out: list[RunStatus] = []
    for value in values or []:
        for part in value.split(","):
            part = part.strip().upper()
            if not part or part == "ALL":
                continue
            if part not in RunStatus.__members__:
                raise HTTPException(
                    400, f"unknown status {part!r}; use one of {', '.join(RunStatus)}"
                )
            if RunStatus(part) not in out:
                out.append(RunStatus(part))
    return out


def create_app(
    store: Store, options: StatusOptions | None = None, *, retry: RetryFn | None = None
) -> FastAPI:
    """The status web app over ``store``; ``retry`` is the shared run path (None: no retries)."""
    options = options or StatusOptions()
    token = options.token.get_secret_value() if options.token else None
    guard = Guard(host=options.host, token=token, public_viewing=options.public_viewing)
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(["html"], default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    static_version = _static_version()
    env.globals.update(
        static=lambda name: f"/static/{name}?v={static_version}",
        version=__version__,
        statuses=list(RunStatus),
        status_label=views.STATUS_LABEL,
        status_icon=views.STATUS_ICON,
    )

    app = FastAPI(
        title="beamflow status",
        version=__version__,
        docs_url=None,  # the Swagger UI loads assets from a CDN; the page must work offline
        redoc_url=None,
        openapi_url=None,  # served below, behind the same gate as the rest of the API
    )
    app.add_middleware(SecurityMiddleware, loopback=guard.loopback)
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    app.state.store = store
    app.state.guard = guard

    # -- helpers ---------------------------------------------------------------------------
    def wants_html(request: Request) -> bool:
        return not request.url.path.startswith(("/api/", "/healthz", "/files/"))

    def render(
        request: Request, name: str, status_code: int = 200,
        headers: dict[str, str] | None = None, **context: Any,
    ) -> HTMLResponse:
        context.update(
            request=request,
            csrf=guard.csrf_token(),
            can_act=guard.can_act(request),
            login_enabled=guard.token is not None,
            logged_in=guard.authenticated(request),
            poll_seconds=options.poll_seconds,
        )
        html = env.get_template(name).render(**context)
        return HTMLResponse(html, status_code=status_code,
                            headers={"cache-control": "no-store", **(headers or {})})

    def require_view(request: Request) -> None:
        if not guard.can_view(request):
            raise HTTPException(401, "log in with the status token to view this page")

    def get_run(run_id: str) -> Run:
        run = store.get_run(run_id)
        if run is None:
            raise HTTPException(404, f"no run {run_id!r}")
        return run

    def runs_page(
        status: list[str] | None, scan: str | None, limit: int, offset: int
    ) -> RunsPage:
        statuses = _parse_status(status)
        scan = (scan or "").strip() or None
        runs = store.list_runs(status=statuses or None, scan=scan, limit=limit, offset=offset)
        names = store.display_names(runs)
        # Counts by status (for the summary chips) honour the scan filter, not the status one.
        counts = store.count_by_status(scan=scan)
        total = (
            sum(counts[s.value] for s in statuses) if statuses else sum(counts.values())
        )
        return RunsPage(
            total=total,
            limit=limit,
            offset=offset,
            status=statuses,
            scan=scan,
            counts=counts,
            runs=[views.RunView.of(r, names[r.id]) for r in runs],
        )

    def detail(run: Run) -> RunDetail:
        view = views.RunView.of(run, store.display_names([run])[run.id])
        return RunDetail(
            run=view,
            steps=views.timeline(store.steps(run.id), view.progress),
            previews=views.previews_of(run, options.files_root),
            parameters=run.parameters,
            result=run.result,
            product_url=f"/files/{run.id}/product" if run.product else None,
            events=[views.EventView.of(e) for e in reversed(store.events(run.id, limit=50))],
            can_retry=run.status in RETRYABLE and retry is not None,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if wants_html(request):
            if exc.status_code == 401:
                # The login form itself, answered 401: a browser shows the form, a script
                # or curl sees the refusal (no redirect that looks like success).
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return render(request, "login.html", status_code=401, next=_local(target),
                              failed=False, headers={"www-authenticate": "Bearer"})
            return render(
                request, "error.html", status_code=exc.status_code,
                code=exc.status_code, message=str(exc.detail),
            )
        headers = {"www-authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    # -- pages -----------------------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse)
    def index(
        request: Request,
        status: list[str] | None = Query(None),
        scan: str | None = None,
        limit: int = Query(50, ge=1, le=MAX_LIMIT),
        offset: int = Query(0, ge=0),
    ) -> HTMLResponse:
        require_view(request)
        page = runs_page(status, scan, limit, offset)

        def link(new_offset: int) -> str:
            query: dict[str, Any] = {}
            if page.status:
                query["status"] = ",".join(page.status)
            if page.scan:
                query["scan"] = page.scan
            if limit != 50:
                query["limit"] = limit
            if new_offset:
                query["offset"] = new_offset
            return "/?" + urlencode(query) if query else "/"

        return render(
            request, "runs.html", page=page, agent=views.AgentView.of(options.agent_state),
            selected=page.status[0].value if len(page.status) == 1 else "",
            newer=link(max(0, offset - limit)) if offset > 0 else None,
            older=link(offset + limit) if offset + limit < page.total else None,
            all_count=sum(page.counts.values()),
        )

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run_page(request: Request, run_id: str) -> HTMLResponse:
        require_view(request)
        run = get_run(run_id)
        info = detail(run)
        return render(
            request, "run.html", d=info, parameters=views.parameters_of(run),
            retry_enabled=retry is not None,
        )

    @app.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, next: str = "/") -> Response:
        if guard.token is None:
            return RedirectResponse("/", status_code=303)
        return render(request, "login.html", next=_local(next), failed=False)

    @app.post("/login")
    async def login(request: Request) -> Response:
        if guard.token is None:
            return RedirectResponse("/", status_code=303)
        form = await _form(request)
        target = _local(form.get("next", "/"))
        if not guard.same_origin(request) or not guard.token_matches(form.get("token", "")):
            client = request.client.host if request.client else "?"
            log.warning("status: failed login from %s", client)
            return render(request, "login.html", status_code=401, next=target, failed=True)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE, guard.session_value(), httponly=True, samesite="strict",
            secure=request.url.scheme == "https", path="/",
        )
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        form = await _form(request)
        if not guard.csrf_ok(request, form.get("csrf")):
            raise HTTPException(403, "logout refused: missing or wrong CSRF token")
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- API -------------------------------------------------------------------------------
    @app.get("/api/runs", response_model=RunsPage)
    def api_runs(
        request: Request,
        status: list[str] | None = Query(None, description="one or more, comma-separated"),
        scan: str | None = Query(None, description="substring of the scan name or path"),
        limit: int = Query(50, ge=1, le=MAX_LIMIT),
        offset: int = Query(0, ge=0),
    ) -> JSONResponse:
        require_view(request)
        page = runs_page(status, scan, limit, offset)
        return JSONResponse(page.model_dump(mode="json"), headers={"cache-control": "no-store"})

    @app.get("/api/runs/{run_id}", response_model=RunDetail)
    def api_run(request: Request, run_id: str) -> JSONResponse:
        require_view(request)
        info = detail(get_run(run_id))
        return JSONResponse(info.model_dump(mode="json"), headers={"cache-control": "no-store"})

    @app.post("/api/runs/{run_id}/retry")
    async def api_retry(request: Request, run_id: str) -> Response:
        form = await _form(request)
        if not guard.can_act(request):
            raise HTTPException(401, "retry needs the status token (Authorization: Bearer)")
        if not guard.csrf_ok(request, form.get("csrf")):
            raise HTTPException(403, "retry refused: missing or wrong CSRF token (X-CSRF-Token)")
        run = get_run(run_id)
        if run.status not in RETRYABLE:
            raise HTTPException(
                409, f"run {run_id} is {run.status.value}; only failed or cancelled runs retry"
            )
        if retry is None:
            raise HTTPException(501, "retry is not available on this server")
        try:
            new = await _in_thread(retry, run_id)
        except (ValueError, StoreError) as exc:
            raise HTTPException(409, f"cannot retry run {run_id}: {exc}") from None
        except Exception as exc:  # the backend failed; say so instead of a bare 500
            log.exception("status: retry of %s failed", run_id)
            raise HTTPException(502, f"retry of run {run_id} failed: {exc}") from None
        new_id = new if isinstance(new, str) else new.id
        if form:  # a plain HTML form post (no script): go to the new run
            return RedirectResponse(f"/runs/{new_id}", status_code=303)
        return JSONResponse({"id": new_id, "url": f"/runs/{new_id}", "retried": run_id})

    @app.get("/api/agent", response_model=views.AgentView)
    def api_agent(request: Request) -> JSONResponse:
        require_view(request)
        agent = views.AgentView.of(options.agent_state)
        return JSONResponse(agent.model_dump(mode="json"), headers={"cache-control": "no-store"})

    @app.get("/api/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> JSONResponse:
        require_view(request)
        return JSONResponse(app.openapi())

    @app.get("/healthz")
    def healthz(request: Request) -> JSONResponse:
        try:
            counts = store.count_by_status()
        except Exception as exc:  # a broken or locked store is what this endpoint reports
            return JSONResponse({"ok": False, "error": f"store {store.path}: {exc}"}, 503)
        body: dict[str, Any] = {"ok": True, "version": __version__}
        if guard.can_view(request):
            body.update(store=str(store.path), runs=sum(counts.values()), counts=counts)
        return JSONResponse(body, headers={"cache-control": "no-store"})

    # -- files -----------------------------------------------------------------------------
    @app.get("/files/{run_id}/{key}")
    def run_file(request: Request, run_id: str, key: str) -> FileResponse:
        require_view(request)
        run = get_run(run_id)
        listed = _listed_file(run, key)
        if listed is None:
            raise HTTPException(404, f"run {run_id} has no file {key!r}")
        path = views.resolve_listed(listed, options.files_root)
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            name = PurePath(listed).name
            raise HTTPException(404, f"file of run {run_id} is missing: {name}") from None
        if not real.is_file():
            raise HTTPException(404, f"not a regular file: {PurePath(listed).name}")
        media = views.IMAGE_TYPES.get(real.suffix.lower())
        headers = {"cache-control": "no-cache"}
        if media is None:  # never let a browser render anything but an image inline
            return FileResponse(
                real, media_type="application/octet-stream", filename=real.name, headers=headers
            )
        return FileResponse(real, media_type=media, headers=headers)

    return app


def _listed_file(run: Run, key: str) -> str | None:
    """The store's entry that ``key`` names: an index into previews, a file name, or product.

    The key only selects among the paths the run lists; it never becomes part of a path.
    """
    if key == "product":
        return run.product
    if key.isdigit():
        index = int(key)
        return run.previews[index] if index < len(run.previews) else None
    for entry in reversed(run.previews):  # the newest file of that name
        if PurePath(entry).name == key:
            return entry
    if run.product and PurePath(run.product).name == key:
        return run.product
    return None


def _local(target: str) -> str:
    """Only same-site paths as redirect targets (no open redirect via ``next``)."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


async def _form(request: Request, limit: int = 8192) -> dict[str, str]:
    """A small urlencoded form body (no multipart; nothing here uploads files)."""
    if not request.headers.get("content-type", "").startswith(
        "application/x-www-form-urlencoded"
    ):
        return {}
    body = await request.body()
    if len(body) > limit:
        raise HTTPException(413, "form too large")
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


async def _in_thread(fn: RetryFn, run_id: str) -> Run | str:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, run_id)
