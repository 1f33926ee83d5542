"""What every area of the status app shares: its options, the store, the access rules, the
templates, and the two views built from the store (a page of runs, one run in detail).

The routers (:mod:`~beamflow.status.pages`, :mod:`~beamflow.status.api`,
:mod:`~beamflow.status.files`, :mod:`~beamflow.status.auth`) each get one :class:`Site`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import BaseModel, Field, SecretStr

from beamflow import __version__
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store
from beamflow.status import views
from beamflow.status.extras import RateTracker, RunExtras, extras_of
from beamflow.status.runs_query import SINCE_LABELS, SORT_LABELS, RunsQuery
from beamflow.status.security import Guard
from beamflow.status.sessions import DEFAULT_SESSION_SECONDS, Sessions

PACKAGE = Path(str(files("beamflow.status")))
TEMPLATES = PACKAGE / "templates"
STATIC = PACKAGE / "static"
# What `beamflow runs retry` accepts too (beamflow.runs.lifecycle.retry_run; the page's
# button: beamflow.run_backends.retry_and_follow): a new attempt of a run that ended without
# a result.
RETRYABLE = (RunStatus.FAILED, RunStatus.CANCELLED)
MAX_LIMIT = 500  # runs on one page of the list or the API

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
    session_seconds: float = Field(
        default=DEFAULT_SESSION_SECONDS, gt=0,
        description="how long a login lasts (its cookie's lifetime); logout ends it sooner",
    )
    poll_seconds: float = Field(default=2.0, gt=0, description="browser refresh interval")
    files_root: Path | None = Field(
        default=None, description="base for relative preview/product paths in the store"
    )
    agent_state: Path | None = Field(
        default=None, description="the edge agent's agent.json (its state directory)"
    )
    local_runs: Path | None = Field(
        default=None, description="the local backend's flow run records (state_dir/local_runs)"
    )


class RunsPage(BaseModel):
    """``/api/runs``: one page of runs in the query's order, with the total for the filters."""

    total: int
    limit: int
    offset: int
    status: list[RunStatus]
    scan: str | None
    since: str | None
    sort: str
    counts: dict[str, int]
    runs: list[views.RunView]
    extras: dict[str, RunExtras]  # by run id: step words, speed and ETA, logs link


class RunDetail(BaseModel):
    """``/api/runs/{id}``: a run with its steps, previews, parameters, recent events and
    attempts."""

    run: views.RunView
    extras: RunExtras
    steps: list[views.StepView]
    previews: list[views.PreviewView]
    parameters: dict[str, Any]
    result: dict[str, Any]
    product_url: str | None
    events: list[views.EventView]
    attempts: list[views.AttemptView]  # oldest first; more than one: retried in this record
    can_retry: bool


def _static_version() -> str:
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(STATIC.iterdir()):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


class Site:
    """The store, options, rules and templates of one status app."""

    def __init__(self, store: Store, options: StatusOptions, retry: RetryFn | None) -> None:
        self.store = store
        self.options = options
        self.retry = retry
        token = options.token.get_secret_value() if options.token else None
        self.guard = Guard(
            host=options.host, token=token, public_viewing=options.public_viewing,
            sessions=Sessions(options.session_seconds),
        )
        self.env = Environment(
            loader=FileSystemLoader(str(TEMPLATES)),
            autoescape=select_autoescape(["html"], default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["clock"] = views.format_time  # Unix seconds -> local wall clock
        static_version = _static_version()
        self.env.globals.update(
            static=lambda name: f"/static/{name}?v={static_version}",
            version=__version__,
            statuses=list(RunStatus),
            status_label=views.STATUS_LABEL,
            status_icon=views.STATUS_ICON,
            since_labels=SINCE_LABELS,
            sort_labels=SORT_LABELS,
        )
        self.rates = RateTracker()

    # -- answers ---------------------------------------------------------------------------
    def render(
        self, request: Request, name: str, status_code: int = 200,
        headers: dict[str, str] | None = None, **context: Any,
    ) -> HTMLResponse:
        guard = self.guard
        context.update(
            request=request,
            csrf=guard.csrf_token(),
            can_act=guard.can_act(request),
            login_enabled=guard.token is not None,
            logged_in=guard.authenticated(request),
            poll_seconds=self.options.poll_seconds,
        )
        html = self.env.get_template(name).render(**context)
        return HTMLResponse(html, status_code=status_code,
                            headers={"cache-control": "no-store", **(headers or {})})

    def require_view(self, request: Request) -> None:
        if not self.guard.can_view(request):
            raise HTTPException(401, "log in with the status token to view this page")

    def get_run(self, run_id: str) -> Run:
        run = self.store.get_run(run_id)
        if run is None:
            raise HTTPException(404, f"no run {run_id!r}")
        return run

    # -- views -----------------------------------------------------------------------------
    def runs_page(self, query: RunsQuery) -> RunsPage:
        store = self.store
        since = query.since_time()
        sort, oldest_first = query.store_sort()
        runs = store.list_runs(
            status=query.status or None, scan=query.scan, since=since, sort=sort,
            oldest_first=oldest_first, limit=query.limit, offset=query.offset,
        )
        names = store.display_names(runs)
        # Counts by status (for the summary chips) honour the scan and time filters, not the
        # status one.
        counts = store.count_by_status(scan=query.scan, since=since)
        statuses = query.status
        total = sum(counts[s.value] for s in statuses) if statuses else sum(counts.values())
        return RunsPage(
            total=total, limit=query.limit, offset=query.offset, status=statuses,
            scan=query.scan, since=query.since, sort=query.sort, counts=counts,
            runs=[views.RunView.of(r, names[r.id]) for r in runs],
            extras={r.id: extras_of(r, self.rates) for r in runs},
        )

    def detail(self, run: Run) -> RunDetail:
        store = self.store
        view = views.RunView.of(run, store.display_names([run])[run.id])
        return RunDetail(
            run=view,
            extras=extras_of(run, self.rates),
            steps=views.timeline(store.steps(run.id), view.progress),
            previews=views.previews_of(run, self.options.files_root),
            parameters=run.parameters,
            result=run.result,
            product_url=f"/files/{run.id}/product" if run.product else None,
            events=[views.EventView.of(e) for e in reversed(store.events(run.id, limit=50))],
            attempts=[views.AttemptView.of(a) for a in store.attempts(run)],
            can_retry=run.status in RETRYABLE and self.retry is not None,
        )
