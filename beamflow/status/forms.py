"""The small form bodies the page posts (login, logout, retry), read safely."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import HTTPException, Request

FORM_LIMIT = 8192  # bytes: a token, a CSRF token, a path


async def read_form(request: Request, limit: int = FORM_LIMIT) -> dict[str, str]:
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


def local_target(target: str) -> str:
    """Only same-site paths as redirect targets (no open redirect via ``next``)."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
