"""The small form bodies the page posts (login, logout, retry), read safely."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import HTTPException, Request

from beamflow.status.security import BODY_LIMIT


async def read_form(request: Request, limit: int = BODY_LIMIT) -> dict[str, str]:
    """A small urlencoded form body (no multipart; nothing here uploads files).

    Read as it streams in and refused (413) as soon as it passes ``limit``: a body without a
    Content-Length (chunked) cannot grow the server's memory beyond the limit. A declared
    length over the limit never gets here (:class:`~beamflow.status.security.SecurityMiddleware`).
    Other content types are not read at all.
    """
    if not request.headers.get("content-type", "").startswith(
        "application/x-www-form-urlencoded"
    ):
        return {}
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"form too large: this page accepts at most {limit} bytes")
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


def local_target(target: str) -> str:
    """Only same-site paths as redirect targets (no open redirect via ``next``)."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
