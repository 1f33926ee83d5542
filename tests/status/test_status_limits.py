"""An exposed status page under hostile posts and logins: bodies are refused before they are
read, logins are per-session, expire, and logout revokes only its own session."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from page_kit import TOKEN

from beamflow.config import Settings
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store
from beamflow.status import StatusOptions, create_app
from beamflow.status.security import BODY_LIMIT, COOKIE
from beamflow.status.server import options_for, serve_in_thread
from beamflow.status.sessions import Sessions

EXPOSED = "http://10.0.0.5:8765"
HUNDRED_MB = 100 << 20


def failed_run(store: Store) -> Run:
    run = store.create_run(scan_name="scan_bad", scan_path="/data/scan_bad", flow="f",
                           backend="local", status=RunStatus.FAILED)
    return store.update_run(run.id, error="boom")


def exposed(store: Store, **options: object) -> TestClient:
    app = create_app(store, StatusOptions(host="0.0.0.0", token=TOKEN, **options))
    return TestClient(app, base_url=EXPOSED)


def login(client: TestClient) -> str:
    r = client.post("/login", data={"token": TOKEN, "next": "/"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return r.cookies[COOKIE]


# -- bodies --------------------------------------------------------------------------------
def raw_post(base: str, path: str, head: list[str], body_parts: list[bytes]) -> bytes:
    """Send a request's headers and the given parts of its body, then read what comes back.

    The server must answer from what it has: a server waiting for the rest of a declared
    100 MB (or for a chunked body's end) never answers, and ``recv`` times out.
    """
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}",
                 "Content-Type: application/x-www-form-urlencoded", *head, "", ""]
        sock.sendall("\r\n".join(lines).encode())
        for part in body_parts:
            sock.sendall(part)
        reply = b""
        while not _complete(reply):
            data = sock.recv(65536)
            if not data:
                break
            reply += data
    return reply


def _complete(reply: bytes) -> bool:
    head, sep, body = reply.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: (\d+)", head)
    return bool(sep) and (length is None or len(body) >= int(length.group(1)))


def status_of(reply: bytes) -> int:
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", reply)
    assert match, reply[:200]
    return int(match.group(1))


@pytest.mark.parametrize("path", ["/login", "/api/runs/RUN/retry"])
def test_a_declared_big_body_is_refused_unread(store: Store, path: str) -> None:
    run = failed_run(store)
    app = create_app(store, StatusOptions(token=TOKEN), retry=lambda run_id: run_id)
    with serve_in_thread(app) as base:
        # 100 MB declared, 1 KiB sent: the answer comes without the other 99.99 MB.
        reply = raw_post(base, path.replace("RUN", run.id), [f"Content-Length: {HUNDRED_MB}"],
                         [b"token=" + b"x" * 1024])
    assert status_of(reply) == 413, reply[:300]
    assert f"at most {BODY_LIMIT}".encode() in reply
    assert store.get_run(run.id).status == RunStatus.FAILED  # nothing was retried


@pytest.mark.parametrize("path", ["/login", "/api/runs/RUN/retry"])
def test_a_chunked_body_over_the_limit_is_refused_at_the_limit(store: Store, path: str) -> None:
    run = failed_run(store)
    app = create_app(store, StatusOptions(token=TOKEN), retry=lambda run_id: run_id)
    chunk = b"x" * 4096
    # Three 4 KiB chunks and no last chunk: only a server that stops at the limit answers.
    parts = [b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(3)]
    with serve_in_thread(app) as base:
        reply = raw_post(base, path.replace("RUN", run.id), ["Transfer-Encoding: chunked"],
                         parts)
    assert status_of(reply) == 413, reply[:300]


def test_a_small_chunked_form_still_logs_in(store: Store) -> None:
    app = create_app(store, StatusOptions(token=TOKEN))
    form = f"token={TOKEN}&next=/".encode()
    with serve_in_thread(app) as base:
        reply = raw_post(base, "/login", ["Transfer-Encoding: chunked"],
                         [b"%x\r\n" % len(form) + form + b"\r\n0\r\n\r\n"])
    assert status_of(reply) == 303 and f"{COOKIE}=".encode() in reply


def test_body_limit_refusals_in_the_app(store: Store) -> None:
    client = exposed(store)
    big = client.post("/login", data={"token": "x" * (BODY_LIMIT + 1)})
    assert big.status_code == 413 and COOKIE not in big.cookies
    bad = client.post("/login", content=b"token=x",
                      headers={"Content-Length": "lots",
                               "Content-Type": "application/x-www-form-urlencoded"})
    assert bad.status_code == 400


# -- sessions ------------------------------------------------------------------------------
def test_each_login_gets_its_own_session_and_logout_revokes_only_it(store: Store) -> None:
    first, second = exposed(store), exposed(store)
    app = first.app  # one server, two browsers
    second = TestClient(app, base_url=EXPOSED)
    a, b = login(first), login(second)
    assert a != b and TOKEN not in a and TOKEN not in b
    assert first.get("/api/runs").status_code == 200
    assert second.get("/api/runs").status_code == 200

    csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"', first.get("/").text).group(1)
    out = first.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303
    # The old cookie, replayed after logout (a copied cookie, a browser that kept it): refused.
    replay = TestClient(app, base_url=EXPOSED, cookies={COOKIE: a})
    assert replay.get("/api/runs").status_code == 401
    assert second.get("/api/runs").status_code == 200  # the other login lives on


def test_a_session_expires(store: Store) -> None:
    client = exposed(store, session_seconds=0.5)
    r = client.post("/login", data={"token": TOKEN, "next": "/"}, follow_redirects=False)
    assert "Max-Age=0" not in r.headers["set-cookie"] and "Max-Age=" in r.headers["set-cookie"]
    assert client.get("/api/runs").status_code == 200
    time.sleep(0.6)
    assert client.get("/api/runs").status_code == 401
    assert client.get("/").status_code == 401  # the page asks to log in again


def test_a_forged_or_old_style_cookie_is_refused(store: Store) -> None:
    import hashlib
    import hmac

    old = hmac.new(TOKEN.encode(), b"beamflow-status-session", hashlib.sha256).hexdigest()
    for value in (old, "x" * 43, ""):
        client = TestClient(exposed(store).app, base_url=EXPOSED, cookies={COOKIE: value})
        assert client.get("/api/runs").status_code == 401, value


def test_sessions_expire_and_revoke_by_the_clock() -> None:
    now = [1000.0]
    sessions = Sessions(60, clock=lambda: now[0])
    a, b = sessions.new(), sessions.new()
    assert sessions.valid(a) and sessions.valid(b) and len(sessions) == 2
    sessions.revoke(a)
    assert not sessions.valid(a) and sessions.valid(b)
    now[0] += 60
    assert not sessions.valid(b) and len(sessions) == 0
    with pytest.raises(ValueError, match="some time"):
        Sessions(0)


def test_session_lifetime_comes_from_the_configuration(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", status={"session_hours": 2})
    assert options_for(settings).session_seconds == 7200
    assert options_for(Settings(state_dir=tmp_path / "s")).session_seconds == 12 * 3600
