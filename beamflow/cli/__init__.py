"""The `beamflow` command line: one module per command group, on :mod:`beamflow.cli.common`.

    workspace     init, simulate, render-endpoint
    reconstruct   reconstruct, previews (this machine, no flow)
    services      agent, serve, demo
    globus        login, logout, whoami, doctor (the Globus account)
    runs          runs list|show|start|retry|cancel
    flows         flows validate|run (offline, on the local interpreter)
    register      register functions|flows
    retention     cleanup

Commands talk to the run backend's interface (``beamflow.runs.backend``, a backend from
``beamflow.run_backends.get_run_backend``), never to one backend's internals; the tools that
belong to one backend (the flow tool, the Globus account) come from that package's public API.

Exit codes: 0 ok, 1 the work failed (bad input, a failed run, bad configuration), 2 usage.
Every command takes ``--config FILE`` (default ./beamflow.toml, then
~/.config/beamflow/beamflow.toml); BEAMFLOW_* environment variables override the file.
"""

from __future__ import annotations

from typing import Annotated

import typer

from beamflow import __version__
from beamflow.cli import (
    flows,
    globus,
    reconstruct,
    register,
    retention,
    runs,
    services,
    workspace,
)
from beamflow.cli.common import HELP, App, console

__all__ = ["app", "main"]

app = App(
    name="beamflow",
    help="Turn a ptychography beamline into a live analysis instrument.",
    add_completion=False,
    pretty_exceptions_enable=False,
    **HELP,
)


def _version(value: bool) -> None:
    if value:
        console.print(f"beamflow {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show version.")
    ] = False,
) -> None:
    """beamflow: edge agent, flows, GPU ptychography and a status page."""


# In this order in `beamflow --help`: the commands, then the groups.
app.command()(workspace.init)
app.command()(workspace.simulate)
app.command("render-endpoint")(workspace.render_endpoint)
app.command()(reconstruct.reconstruct)
app.command()(reconstruct.previews)
app.command()(services.agent)
app.command()(services.serve)
app.command()(globus.login)
app.command()(globus.logout)
app.command()(globus.whoami)
app.command()(globus.doctor)
app.command()(retention.cleanup)
app.command()(services.demo)
app.add_typer(runs.app, name="runs")
app.add_typer(flows.app, name="flows")
app.add_typer(register.app, name="register")


def main() -> None:
    app()
