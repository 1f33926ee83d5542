"""Run the status app under uvicorn: in the foreground (``beamflow serve``) or in a thread
(browser tests, benchmarks) on a free loopback port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from beamflow.agent_state import state_path
from beamflow.config import Settings
from beamflow.runs.store import Store
from beamflow.status.app import RetryFn, StatusOptions, create_app
from beamflow.status.security import is_loopback

MIN_TOKEN_LENGTH = 16


class StatusConfigError(Exception):
    """The status server must not start with this configuration; the message says why."""


def options_for(settings: Settings, host: str | None = None) -> StatusOptions:
    """Server options from the configuration (``host`` from ``--host`` wins), checked for
    safety: exposing the page needs a token worth the name."""
    host = host or settings.status.host
    token = settings.status.token
    value = token.get_secret_value() if token else ""
    if not is_loopback(host):
        if not value:
            raise StatusConfigError(
                f"refusing to serve the status page on {host!r} without a token: anyone on "
                "the network could view runs, previews and products and retry runs. Set "
                "status.token in beamflow.toml "
                "or BEAMFLOW_STATUS__TOKEN (e.g. `python -c 'import secrets; "
                "print(secrets.token_urlsafe(24))'`), or bind 127.0.0.1."
            )
        if len(value) < MIN_TOKEN_LENGTH:
            raise StatusConfigError(
                f"status.token is {len(value)} characters; use at least {MIN_TOKEN_LENGTH} "
                f"random characters before exposing the page on {host!r}"
            )
    return StatusOptions(
        host=host,
        token=token if value else None,
        public_viewing=settings.status.public_viewing,
        session_seconds=settings.status.session_hours * 3600,
        files_root=settings.beamline.preview_dir,
        agent_state=state_path(settings.state_dir),
        local_runs=settings.state_dir / "local_runs",
    )


def build_app(
    settings: Settings, *, host: str | None = None, retry: RetryFn | None = None
) -> FastAPI:
    """The status app for a configuration: its run store, options and the retry path."""
    options = options_for(settings, host)
    return create_app(Store(settings.store_path), options, retry=retry)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _check_free(host: str, port: int) -> None:
    """Say plainly that the port is taken (uvicorn would only log it from its thread)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise RuntimeError(f"cannot serve the status page on {host}:{port}: {exc}") from None


def make_server(app: FastAPI, host: str, port: int, *, log_level: str = "info") -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        # Behind no proxy: never trust X-Forwarded-* to tell us who or where the client is.
        proxy_headers=False,
        server_header=False,
        access_log=log_level == "debug",
    )
    return uvicorn.Server(config)


@contextmanager
def serve_in_thread(
    app: FastAPI, host: str = "127.0.0.1", port: int | None = None, *, timeout: float = 15.0
) -> Iterator[str]:
    """Serve ``app`` in a daemon thread; yields the base URL, stops the server on exit."""
    port = port or free_port(host)
    _check_free(host, port)
    server = make_server(app, host, port, log_level="warning")
    thread = threading.Thread(target=server.run, name="beamflow-status", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"status server on {host}:{port} did not start")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"status server on {host}:{port} not up after {timeout} s")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
