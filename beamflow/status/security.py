"""Who may see and do what on the status page, and the headers every response carries.

Rules (see docs and issue 8):
- Bound to loopback (the default), anyone on this machine may view and retry; the Host header
  must name loopback too, so a web page elsewhere cannot reach the server through DNS
  rebinding, and a reverse proxy in front of a loopback-bound server is refused instead of
  silently exposing actions without a token.
- Bound elsewhere, a token is mandatory (the server refuses to start without one), and every
  page, preview, API call and download needs it: unpublished data must not leak to whoever
  is on the network. ``public_viewing`` (``status.public_viewing``) is the explicit opt-in
  to let anyone who reaches the page view; actions need the token regardless. The token
  comes as ``Authorization: Bearer ...`` or as the HttpOnly, SameSite=Strict cookie the
  login form sets: a random session per login, which expires (``status.session_hours``) and
  which logout revokes (:mod:`beamflow.status.sessions`).
- Request bodies are small forms: a body over ``BODY_LIMIT`` is refused by its
  Content-Length before anything reads it or checks who sent it (413), and a body without
  one (chunked) is read only up to the limit (:func:`beamflow.status.forms.read_form`).
- Every state-changing POST is CSRF-safe: a Bearer header cannot be sent by another site, and
  browser posts must carry the page's CSRF token and, where the browser says, come from this
  origin.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request

from beamflow.status.sessions import Sessions

COOKIE = "beamflow_session"
BODY_LIMIT = 8192  # bytes: the largest body the page accepts (a form: token, CSRF, a path)
CSRF_HEADER = "x-csrf-token"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    # Not "no-referrer": with it browsers send "Origin: null" on this page's own form posts
    # (Fetch spec), and the origin check below would refuse the login form itself.
    # "same-origin" still sends nothing to other sites.
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; anything else counts as exposed."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host part of a Host header (``[::1]:8765`` -> ``::1``, ``a:80`` -> ``a``)."""
    header = header.strip()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """The access rules for one server (bind address and token fixed at start)."""

    def __init__(
        self, *, host: str, token: str | None, public_viewing: bool = False,
        sessions: Sessions | None = None,
    ) -> None:
        self.loopback = is_loopback(host)
        self.token = token or None
        if not self.loopback and not self.token:
            raise ValueError(
                f"refusing to serve on {host!r} without a token: set status.token in "
                "beamflow.toml or BEAMFLOW_STATUS__TOKEN (or bind 127.0.0.1)"
            )
        # On loopback only this machine can connect (and could read the store anyway).
        self.view_needs_token = not self.loopback and not public_viewing
        self.sessions = sessions if sessions is not None else Sessions()
        # Per-process secret: CSRF tokens die with the server, which is what we want.
        self._csrf_key = secrets.token_bytes(32)

    # -- identity --------------------------------------------------------------------------
    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def bearer(self, request: Request) -> bool:
        """A valid ``Authorization: Bearer`` header (never sent by browsers on their own)."""
        auth = request.headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(value.strip())

    def authenticated(self, request: Request) -> bool:
        if self.token is None:
            return False
        if self.bearer(request):
            return True
        return self.sessions.valid(request.cookies.get(COOKIE, ""))

    # -- permissions -----------------------------------------------------------------------
    def can_view(self, request: Request) -> bool:
        return not self.view_needs_token or self.authenticated(request)

    def can_act(self, request: Request) -> bool:
        return self.loopback or self.authenticated(request)

    # -- CSRF ------------------------------------------------------------------------------
    def csrf_token(self) -> str:
        return hmac.new(self._csrf_key, b"csrf", "sha256").hexdigest()

    def same_origin(self, request: Request) -> bool:
        """What the browser says about where a POST comes from (absent for non-browsers)."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = request.headers.get("origin")
        if origin is not None:
            own = f"{request.url.scheme}://{request.headers.get('host', '')}"
            if origin.lower() != own.lower():
                return False
        return True

    def csrf_ok(self, request: Request, form_token: str | None = None) -> bool:
        if self.bearer(request):
            return True
        given = request.headers.get(CSRF_HEADER) or form_token or ""
        return self.same_origin(request) and hmac.compare_digest(
            given.encode(), self.csrf_token().encode()
        )


class SecurityMiddleware:
    """Adds the security headers to every response; on loopback, refuses foreign Host names;
    refuses a body larger than ``body_limit`` by its Content-Length, unread."""

    def __init__(self, app: ASGIApp, *, loopback: bool, body_limit: int = BODY_LIMIT) -> None:
        self.app = app
        self.loopback = loopback
        self.body_limit = body_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.loopback:
            host = ""
            for key, value in scope.get("headers", []):
                if key == b"host":
                    host = value.decode("latin-1")
                    break
            if not is_loopback(host_of(host)):
                await _plain(send, 421, (
                    f"Host {host!r} refused: this status page is bound to loopback. To serve "
                    "it to other machines, start it with --host and a token (status.token)."
                ))
                return
        refusal = self._body_refusal(scope)
        if refusal is not None:
            await _plain(send, *refusal)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)

    def _body_refusal(self, scope: Scope) -> tuple[int, str] | None:
        """(status, text) for a body refused by its declared length, before anyone reads it
        (the server answers and closes; the rest of the body is never received)."""
        for key, value in scope.get("headers", []):
            if key != b"content-length":
                continue
            declared = value.decode("latin-1").strip()
            if not declared.isdigit():
                return 400, f"Content-Length {declared!r} is not a number"
            if int(declared) > self.body_limit:
                return 413, (f"request body of {declared} bytes refused: this page accepts "
                             f"at most {self.body_limit}")
        return None


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS],
    })
    await send({"type": "http.response.body", "body": body})
