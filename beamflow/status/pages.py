"""The HTML pages: ``/`` (runs: filters by status, scan and time, sorting, pagination; the
edge agent's panel), ``/runs/{id}`` (one run) and ``/runs/{id}/logs`` (its logs)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse

from beamflow.status import views
from beamflow.status.logs import run_log
from beamflow.status.runs_query import RunsQuery
from beamflow.status.site import MAX_LIMIT, Site


def router(site: Site) -> APIRouter:
    pages = APIRouter()

    @pages.get("/", response_class=HTMLResponse)
    def index(
        request: Request,
        status: list[str] | None = Query(None),
        scan: str | None = None,
        since: str | None = None,
        sort: str | None = None,
        limit: int = Query(50, ge=1, le=MAX_LIMIT),
        offset: int = Query(0, ge=0),
    ) -> HTMLResponse:
        site.require_view(request)
        query = RunsQuery.parse(status, scan, since, sort, limit, offset)
        page = site.runs_page(query)
        return site.render(
            request, "runs.html", page=page, query=query,
            agent=views.AgentView.of(site.options.agent_state),
            selected=page.status[0].value if len(page.status) == 1 else "",
            newer=query.link(max(0, offset - limit)) if offset > 0 else None,
            older=query.link(offset + limit) if offset + limit < page.total else None,
            all_count=sum(page.counts.values()),
        )

    @pages.get("/runs/{run_id}", response_class=HTMLResponse)
    def run_page(request: Request, run_id: str) -> HTMLResponse:
        site.require_view(request)
        run = site.get_run(run_id)
        return site.render(
            request, "run.html", d=site.detail(run), parameters=views.parameters_of(run),
            retry_enabled=site.retry is not None,
        )

    @pages.get("/runs/{run_id}/logs", response_class=HTMLResponse)
    def logs_page(request: Request, run_id: str) -> HTMLResponse:
        site.require_view(request)
        run = site.get_run(run_id)
        name = site.store.display_names([run])[run.id]
        return site.render(request, "logs.html", run=run, display_name=name,
                           log=run_log(site.store, run, site.options.local_runs))

    @pages.get("/runs/{run_id}/logs.txt", response_class=PlainTextResponse)
    def logs_text(request: Request, run_id: str) -> PlainTextResponse:
        site.require_view(request)
        run = site.get_run(run_id)
        return PlainTextResponse(run_log(site.store, run, site.options.local_runs).text(),
                                 headers={"cache-control": "no-store"})

    return pages
