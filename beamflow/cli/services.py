"""The long-running commands: `beamflow agent` (the edge agent), `beamflow serve` (the
status page) and `beamflow demo` (both, on a simulated beamline)."""

from __future__ import annotations

import signal
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from beamflow.cli.common import ConfigOption, console, fail, settings_from
from beamflow.config import RECONSTRUCTION_DEFAULTS
from beamflow.console import styled


def agent(
    once: Annotated[
        bool,
        typer.Option(
            "--once", help="Process every scan ready now, wait for those runs, then exit."
        ),
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(help="With --once: give up after this many seconds.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    config: ConfigOption = None,
) -> None:
    """The edge agent: watch the detector directory and start a flow run per scan.

    Runs in the foreground (systemd runs it; see deploy/systemd). Logs are JSON lines on
    stderr. SIGTERM stops it cleanly; runs already started are re-attached at the next start.
    """
    from edge_agent.agent import EdgeAgent
    from edge_agent.logs import setup_logging

    settings = settings_from(config, workspace=True)
    setup_logging(log_level.upper())
    edge = EdgeAgent(settings)
    # SIGTERM (systemd) and Ctrl-C both stop it cleanly, between passes.
    signal.signal(signal.SIGTERM, lambda *_: edge.stop())
    signal.signal(signal.SIGINT, lambda *_: edge.stop())
    try:
        if once:
            try:
                ok = edge.run_once(timeout=timeout)
            finally:
                if edge.once_summary is not None:
                    print(edge.once_summary.line(), flush=True)
            raise typer.Exit(0 if ok else 1)
        edge.run_forever()
    except KeyboardInterrupt:
        edge.stop()
    finally:
        edge.backend.close()


def serve(
    host: Annotated[
        str | None,
        typer.Option(help="Address to bind (default status.host: 127.0.0.1). Anything but "
                     "loopback needs status.token (or BEAMFLOW_STATUS__TOKEN), to view too "
                     "unless status.public_viewing."),
    ] = None,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Port (default status.port: 8765).")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Status page and JSON API (/api/runs, /api/runs/{id}, /healthz): live runs, previews."""
    from beamflow.run_backends import retry_and_follow
    from beamflow.status.security import is_loopback
    from beamflow.status.server import StatusConfigError, build_app, make_server

    settings = settings_from(config, workspace=True)
    host = host or settings.status.host
    port = port or settings.status.port
    try:
        status_app = build_app(settings, host=host, retry=partial(retry_and_follow, settings))
    except StatusConfigError as exc:
        fail(str(exc))
    shown = f"[{host}]" if ":" in host else host
    console.print(Text.assemble(styled("status page:", "green"),
                                f" http://{shown}:{port}/  (store {settings.store_path})"))
    if not is_loopback(host):
        console.print(
            "  anyone who reaches it may view runs (status.public_viewing); actions need the "
            "status token" if settings.status.public_viewing else
            "  every page, preview, API call and download needs the status token (log in on "
            "the page)"
        )
    try:
        make_server(status_app, host, port).run()
    except OSError as exc:
        fail(f"cannot serve on {host}:{port}: {exc}")


def demo(
    workspace: Annotated[
        Path, typer.Option(help="Workspace to create or reuse.")
    ] = Path("demo-workspace"),
    scans: Annotated[int, typer.Option(min=1, max=50, help="Scans to simulate.")] = 3,
    positions: Annotated[int, typer.Option(min=10, help="Scan positions per scan.")] = 200,
    probe_size: Annotated[int, typer.Option(min=16, help="Detector frame size (px).")] = 64,
    iterations: Annotated[
        int, typer.Option(min=1, help="Reconstruction iterations.")
    ] = RECONSTRUCTION_DEFAULTS.iterations,
    rate: Annotated[float, typer.Option(min=0.1, help="Simulated frames per second.")] = 60.0,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Status page port (default: free).")
    ] = None,
    exit_when_done: Annotated[
        bool, typer.Option("--exit", help="Return when the runs are done (exit 1 if any failed).")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """The main job on the embedded backend: simulated beamline, agent, flows,
    reconstruction, previews and the status page, live."""
    from beamflow.demo import DemoOptions, run_demo

    # SIGTERM (kill, a CI runner's timeout) stops the demo as Ctrl-C does: through its
    # cleanup, which shuts the compute engine down.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    options = DemoOptions(
        workspace=workspace, scans=scans, positions=positions, probe_size=probe_size,
        iterations=iterations, rate_hz=rate, port=port, exit_when_done=exit_when_done,
    )
    try:
        ok = run_demo(options, console)
    except (ValueError, OSError) as exc:
        fail(str(exc))
    raise typer.Exit(0 if ok else 1)

