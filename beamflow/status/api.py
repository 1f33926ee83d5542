"""The JSON API: ``/api/runs``, ``/api/runs/{id}``, ``POST /api/runs/{id}/retry``,
``/api/agent``, ``/api/openapi.json``, ``/healthz``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from beamflow import __version__
from beamflow.runs.store import StoreError
from beamflow.status import views
from beamflow.status.forms import read_form
from beamflow.status.logs import RunLog, run_log
from beamflow.status.runs_query import RunsQuery
from beamflow.status.site import MAX_LIMIT, RETRYABLE, RunDetail, RunsPage, Site

log = logging.getLogger(__name__)

NO_STORE = {"cache-control": "no-store"}


def router(site: Site) -> APIRouter:
    api = APIRouter()
    guard = site.guard

    @api.get("/api/runs", response_model=RunsPage)
    def api_runs(
        request: Request,
        status: list[str] | None = Query(None, description="one or more, comma-separated"),
        scan: str | None = Query(None, description="substring of the scan name or path"),
        since: str | None = Query(
            None, description="runs that ended in this window or have not ended: 30m, 1h, 7d"
        ),
        sort: str | None = Query(None, description="newest, oldest, finished, longest"),
        limit: int = Query(50, ge=1, le=MAX_LIMIT),
        offset: int = Query(0, ge=0),
    ) -> JSONResponse:
        site.require_view(request)
        page = site.runs_page(RunsQuery.parse(status, scan, since, sort, limit, offset))
        return JSONResponse(page.model_dump(mode="json"), headers=NO_STORE)

    @api.get("/api/runs/{run_id}", response_model=RunDetail)
    def api_run(request: Request, run_id: str) -> JSONResponse:
        site.require_view(request)
        info = site.detail(site.get_run(run_id))
        return JSONResponse(info.model_dump(mode="json"), headers=NO_STORE)

    @api.post("/api/runs/{run_id}/retry")
    async def api_retry(request: Request, run_id: str) -> Response:
        if not guard.can_act(request):  # before the body is read
            raise HTTPException(401, "retry needs the status token (Authorization: Bearer)")
        form = await read_form(request)
        if not guard.csrf_ok(request, form.get("csrf")):
            raise HTTPException(403, "retry refused: missing or wrong CSRF token (X-CSRF-Token)")
        run = site.get_run(run_id)
        if run.status not in RETRYABLE:
            raise HTTPException(
                409, f"run {run_id} is {run.status.value}; only failed or cancelled runs retry"
            )
        if site.retry is None:
            raise HTTPException(501, "retry is not available on this server")
        try:
            new = await run_in_threadpool(site.retry, run_id)
        except (ValueError, StoreError) as exc:
            raise HTTPException(409, f"cannot retry run {run_id}: {exc}") from None
        except Exception as exc:  # the backend failed; say so instead of a bare 500
            log.exception("status: retry of %s failed", run_id)
            raise HTTPException(502, f"retry of run {run_id} failed: {exc}") from None
        new_id = new if isinstance(new, str) else new.id
        if form:  # a plain HTML form post (no script): go to the new run
            return RedirectResponse(f"/runs/{new_id}", status_code=303)
        return JSONResponse({"id": new_id, "url": f"/runs/{new_id}", "retried": run_id})

    @api.get("/api/runs/{run_id}/logs", response_model=RunLog)
    def api_logs(request: Request, run_id: str) -> JSONResponse:
        site.require_view(request)
        log_ = run_log(site.store, site.get_run(run_id), site.options.local_runs)
        return JSONResponse(log_.model_dump(mode="json"), headers=NO_STORE)

    @api.get("/api/agent", response_model=views.AgentView)
    def api_agent(request: Request) -> JSONResponse:
        site.require_view(request)
        agent = views.AgentView.of(site.options.agent_state)
        return JSONResponse(agent.model_dump(mode="json"), headers=NO_STORE)

    @api.get("/api/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> JSONResponse:
        site.require_view(request)
        return JSONResponse(request.app.openapi())

    @api.get("/healthz")
    def healthz(request: Request) -> JSONResponse:
        store = site.store
        try:
            counts = store.count_by_status()
        except Exception as exc:  # a broken or locked store is what this endpoint reports
            return JSONResponse({"ok": False, "error": f"store {store.path}: {exc}"}, 503)
        body: dict[str, Any] = {"ok": True, "version": __version__}
        if guard.can_view(request):
            body.update(store=str(store.path), runs=sum(counts.values()), counts=counts)
        return JSONResponse(body, headers=NO_STORE)

    return api
