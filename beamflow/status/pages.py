"""The HTML pages: ``/`` (runs, filters, pagination, the edge agent's panel) and
``/runs/{id}`` (one run)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from beamflow.status import views
from beamflow.status.site import MAX_LIMIT, Site


def router(site: Site) -> APIRouter:
    pages = APIRouter()

    @pages.get("/", response_class=HTMLResponse)
    def index(
        request: Request,
        status: list[str] | None = Query(None),
        scan: str | None = None,
        limit: int = Query(50, ge=1, le=MAX_LIMIT),
        offset: int = Query(0, ge=0),
    ) -> HTMLResponse:
        site.require_view(request)
        page = site.runs_page(status, scan, limit, offset)

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

        return site.render(
            request, "runs.html", page=page, agent=views.AgentView.of(site.options.agent_state),
            selected=page.status[0].value if len(page.status) == 1 else "",
            newer=link(max(0, offset - limit)) if offset > 0 else None,
            older=link(offset + limit) if offset + limit < page.total else None,
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

    return pages
