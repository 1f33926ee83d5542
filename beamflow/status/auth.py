"""Logging in and out of an exposed status page: ``/login`` (form and post), ``/logout``."""

from __future__ import annotations

import logging
import math

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from beamflow.status.forms import local_target, read_form
from beamflow.status.security import COOKIE
from beamflow.status.site import Site

log = logging.getLogger(__name__)


def router(site: Site) -> APIRouter:
    auth = APIRouter()
    guard = site.guard

    @auth.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, next: str = "/") -> Response:
        if guard.token is None:
            return RedirectResponse("/", status_code=303)
        return site.render(request, "login.html", next=local_target(next), failed=False)

    @auth.post("/login")
    async def login(request: Request) -> Response:
        if guard.token is None:
            return RedirectResponse("/", status_code=303)
        # Headers first: a post from another site is refused before its body is read.
        form = await read_form(request) if guard.same_origin(request) else {}
        target = local_target(form.get("next", "/"))
        if not guard.token_matches(form.get("token", "")):
            client = request.client.host if request.client else "?"
            log.warning("status: failed login from %s", client)
            return site.render(request, "login.html", status_code=401, next=target, failed=True)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE, guard.sessions.new(), httponly=True, samesite="strict",
            secure=request.url.scheme == "https", path="/",
            max_age=max(1, math.ceil(guard.sessions.lifetime)),
        )
        return response

    @auth.post("/logout")
    async def logout(request: Request) -> Response:
        form = await read_form(request)
        if not guard.csrf_ok(request, form.get("csrf")):
            raise HTTPException(403, "logout refused: missing or wrong CSRF token")
        guard.sessions.revoke(request.cookies.get(COOKIE, ""))  # this login only
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    return auth
