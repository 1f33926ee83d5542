"""`beamflow register functions|flows`: register what changed with the backend (idempotent)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from beamflow.cli.common import (
    HELP,
    App,
    ConfigOption,
    err_console,
    fail,
    open_run_backend,
    settings_from,
)
from beamflow.runs.backend import RunBackendError

app = App(help="Register compute functions and flows (idempotent).", **HELP)

BackendChoice = Annotated[
    str | None, typer.Option("--backend", help="local or globus (default: the configured one).")
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Say what would change; register nothing.")
]


def _register(
    kind: Literal["functions", "flows"],
    backend_name: str | None,
    dry_run: bool,
    config: Path | None,
) -> None:
    if backend_name not in (None, "local", "globus"):
        fail(f"--backend must be 'local' or 'globus', not {backend_name!r}", code=2)
    settings = settings_from(config, workspace=True)
    backend = open_run_backend(settings, backend_name)
    try:
        register = backend.register_functions if kind == "functions" else backend.register_flows
        results = register(dry_run=dry_run)
    except RunBackendError as exc:
        fail(str(exc))
    finally:
        backend.close()
    if dry_run:
        err_console.print(f"dry run on {backend.name}: nothing registered; each line says what "
                          "registering would do")  # fmt: skip
    for r in results:
        print(f"{r.action} {r.name} {r.id or '-'}")
        if dry_run:  # who may do what with it, as it would be deployed
            for role, principals in r.roles.items():
                print(f"  {role}: {', '.join(principals) or '(owner only)'}")


@app.command("functions")
def register_functions(
    backend: BackendChoice = None, dry_run: DryRunOption = False, config: ConfigOption = None
) -> None:
    """Register the compute functions (functions/*.py) whose content changed."""
    _register("functions", backend, dry_run, config)


@app.command("flows")
def register_flows(
    backend: BackendChoice = None, dry_run: DryRunOption = False, config: ConfigOption = None
) -> None:
    """Register the flows (flows/*.json + schema) whose content or roles changed. On Globus
    each flow gets its roles from [globus] in beamflow.toml: the agent's client and the staff
    group may start it; --dry-run prints them."""
    _register("flows", backend, dry_run, config)
