"""What every command group shares: the consoles, the error exit, the configuration, the
run store, the backend, and the option types that read the same on every command.

Imports: a command module imports at its top only what is cheap (typer, rich, pydantic, the
config and the store). What costs start-up time is imported inside the command that needs
it: the reconstruction engine and everything that pulls it in (numpy, h5py: beamflow.runs,
beamflow.reconstruct, beamflow.simulate), the Globus SDKs, the local flow interpreter
(jsonschema), the web server. `beamflow --help` and `beamflow runs list` stay quick, and the
memory budget of `beamflow reconstruct` is not spent on libraries it never uses. No import
is late to hide a circle (tests/test_architecture.py counts late imports too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from beamflow.backend import Backend, BackendError
from beamflow.config import CONFIG_NAME, ConfigError, Settings, load_config
from beamflow.store import Store

# Plain (click) help, not rich panels: rich cuts option names ("--checkpoint-e…") to fit
# its table at 80 columns; click prints them whole and wraps the descriptions.
HELP = {"no_args_is_help": True, "rich_markup_mode": None}

# Where the output is not a terminal (a pipe, a log file, a CI job) lines are never
# wrapped or cut at 80 columns: names and paths stay whole, one per line, for grep and for
# people reading logs. A terminal wraps what does not fit (tables fold, never "…").
_WIDE = 10_000


def make_console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=_WIDE, soft_wrap=True)


def data_table(title: str | None = None) -> Table:
    """A table whose cells wrap (fold) instead of ending in "…"."""
    return Table(title=title, title_justify="left")


console = make_console()
err_console = make_console(stderr=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help=f"Config file (default ./{CONFIG_NAME}, then ~/.config/beamflow/{CONFIG_NAME}).",
        dir_okay=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print a clear error (no traceback) and leave with ``code``."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


def settings_from(config: Path | None) -> Settings:
    try:
        return load_config(config)
    except ConfigError as exc:
        fail(str(exc))


def open_store(settings: Settings) -> Store:
    return Store(settings.store_path)


def open_backend(settings: Settings, name: str | None = None) -> Backend:
    """The configured backend (or ``name``), through the factory: commands talk to the
    backend interface only. The caller closes it."""
    from beamflow.runs import get_backend

    if name is not None and name != settings.backend:
        settings = settings.model_copy(update={"backend": name})
    try:
        return get_backend(settings)
    except BackendError as exc:
        fail(str(exc))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"
