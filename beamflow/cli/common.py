"""What every command group shares: the consoles, the error exit, the configuration, the
run store, the backend, and the option types that read the same on every command.

Imports: a command module imports at its top only what is cheap (typer, rich, pydantic, the
config and the store). What costs start-up time is imported inside the command that needs
it: the reconstruction engine and everything that pulls it in (numpy, h5py: beamflow.runs.lifecycle,
beamflow.job.run, beamflow.simulate), the Globus SDKs, the local flow interpreter
(jsonschema), the web server. `beamflow --help` and `beamflow runs list` stay quick, and the
memory budget of `beamflow reconstruct` is not spent on libraries it never uses. No import
is late to hide a circle (tests/test_architecture.py counts late imports too).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from beamflow.config import CONFIG_NAME, USER_CONFIG, ConfigError, Settings, load_config
from beamflow.console import make_console
from beamflow.runs.backend import RunBackend, RunBackendError
from beamflow.runs.records import Run
from beamflow.runs.store import Store


def summary(command: click.Command) -> str:
    """A command's summary: its short help, else the first sentence of its docstring, whole
    (click cuts it at the width left on the line, ending in "...")."""
    text = command.short_help or (command.help or "").split("\n\n")[0]
    text = " ".join(text.replace("\b", "").split())
    first = re.match(r"(.+?\.)\s+(?=[A-Z])", text)
    return first.group(1) if first else text


class WholeSummaries(TyperGroup):
    """A command group whose command list gives each command's whole summary, wrapped to
    the terminal, never cut."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, summary(command)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def argument_name(param: click.Parameter) -> str:
    """An argument as usage lines name it: in capitals (``SCAN``), ``[SCAN]`` when it may be
    left out, ``CHECKPOINTS...`` when it takes several."""
    name = param.metavar or (param.name or "").upper()
    if param.nargs != 1:
        name += "..."
    return name if param.required else f"[{name}]"


#: The option sections of a command's help, in this order (an option's ``rich_help_panel``
#: names its section; the general options, --config and --help, come last, as "Options").
HELP_PANELS = ("Input and geometry", "Algorithm", "Probe", "Output", "Options")


class Command(TyperCommand):
    """A command whose help names its arguments as users write them (``SCAN``, not
    ``{scan}``) and groups its options in sections (:data:`HELP_PANELS`)."""

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        return pieces + [argument_name(p) for p in self.get_params(ctx)
                         if p.param_type_name == "argument"]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        arguments: list[tuple[str, str]] = []
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append((argument_name(param).strip("[]."), record[1]))
            else:
                panel = getattr(param, "rich_help_panel", None) or "Options"
                sections.setdefault(panel, []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        order = {name: i for i, name in enumerate(HELP_PANELS)}
        for panel in sorted(sections, key=lambda p: order.get(p, len(HELP_PANELS) - 1.5)):
            with formatter.section(panel):
                formatter.write_dl(sections[panel])


class App(typer.Typer):
    """The command groups of the CLI: their commands are :class:`Command`."""

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)


# Plain (click) help, not rich panels: rich cuts option names ("--checkpoint-e…") to fit
# its table at 80 columns; click prints them whole and wraps the descriptions.
HELP: dict[str, Any] = {"no_args_is_help": True, "rich_markup_mode": None, "cls": WholeSummaries}

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
    """Print a clear error (no traceback), as written, and leave with ``code``."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False,
                      soft_wrap=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    err_console.print(Text.assemble(("warning:", "yellow"), " ", message), highlight=False,
                      soft_wrap=True)


def settings_from(config: Path | None, *, workspace: bool = False) -> Settings:
    """The configuration (a bad one: its one-line errors, exit 1). ``workspace``: the
    command keeps state (run store, registered ids, tokens), which belongs in a workspace:
    see :func:`require_workspace`."""
    try:
        settings = load_config(config)
    except ConfigError as exc:
        fail(str(exc))
    if workspace:
        require_workspace(settings)
        here = Path.cwd() / CONFIG_NAME
        if settings.source is not None and settings.source.resolve() != here.resolve():
            # A configuration found elsewhere than here (the user's) is named, once.
            err_console.print(Text(f"config: {settings.source}", style="dim"), highlight=False,
                              soft_wrap=True)
    return settings


def require_workspace(settings: Settings) -> None:
    """Refuse to keep state where no configuration says to: with no beamflow.toml found
    (and no BEAMFLOW_STATE_DIR), a command would silently create ./state wherever it is run."""
    if settings.source is None:
        if "BEAMFLOW_STATE_DIR" in os.environ:
            return
        fail(
            f"no {CONFIG_NAME} here ({Path.cwd()}) nor in {USER_CONFIG}: this command keeps its "
            f"state (runs, registered ids, tokens) in a workspace, and will not create "
            f"{Path.cwd() / 'state'}; create one with `beamflow init DIR` and run it there, "
            "or pass --config FILE"
        )


def open_store(settings: Settings) -> Store:
    require_workspace(settings)
    return Store(settings.store_path)


def open_run_backend(settings: Settings, name: str | None = None) -> RunBackend:
    """The configured backend (or ``name``), through the factory: commands talk to the
    backend interface only. The caller closes it."""
    from beamflow.run_backends import get_run_backend

    require_workspace(settings)
    if name is not None and name != settings.backend:
        settings = settings.model_copy(update={"backend": name})
    try:
        return get_run_backend(settings)
    except RunBackendError as exc:
        fail(str(exc))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


class RunProgress:
    """What a command shows while it waits for a run: a live bar on a terminal; elsewhere (a
    pipe, a log file) a line when the step changes, at each tenth of the iterations, and at
    least every :attr:`heartbeat` seconds, so that waiting is never silent."""

    heartbeat = 30.0

    def __init__(self, run: Run, console: Console | None = None) -> None:
        self.console = console or err_console
        self.started = time.monotonic()
        self._said: tuple[str, int] | None = None
        self._said_at = self.started
        self._bar: Progress | None = None
        if self.console.is_terminal:
            self._bar = Progress(
                SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                TextColumn("iteration {task.completed:.0f}/{task.total:.0f}"),
                TimeElapsedColumn(), console=self.console, transient=True,
            )  # fmt: skip
            self._task = self._bar.add_task(self._where(run), total=run.iterations_total or 1)

    def __enter__(self) -> RunProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()

    @staticmethod
    def _where(run: Run) -> str:
        return f"{run.scan_name}: {run.current_step or run.status.value}"

    def update(self, run: Run) -> None:
        if self._bar is not None:
            total = run.iterations_total or self._bar.tasks[0].total
            self._bar.update(self._task, description=self._where(run),
                             completed=run.iteration or 0, total=total)  # fmt: skip
            return
        now = time.monotonic()
        step, done = run.current_step or run.status.value, run.iteration or 0
        tenth = max(1, (run.iterations_total or 10) // 10)
        said_step, said_done = self._said or ("", -tenth)
        if step == said_step and done - said_done < tenth and now - self._said_at < self.heartbeat:
            return
        self._said, self._said_at = (step, done), now
        iterations = f", iteration {done}/{run.iterations_total}" if run.iterations_total else ""
        self.console.print(f"{self._where(run)}{iterations} ({now - self.started:.0f} s)",
                           highlight=False, soft_wrap=True)  # fmt: skip
