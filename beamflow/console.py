"""Terminal presentation shared by the CLI and the demo.

Text is printed as it is written: the consoles interpret no rich markup, so a path, a scan
name or an error message keeps its square brackets (``beamflow[gpu]``, a directory called
``[bold]``). Colour is given explicitly, as :class:`rich.text.Text` with a style, never by
markup inside a string that may hold data.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from beamflow.runs.records import RunStatus

STATUS_STYLE = {
    RunStatus.QUEUED: "blue",
    RunStatus.ACTIVE: "yellow",
    RunStatus.INACTIVE: "magenta",
    RunStatus.SUCCEEDED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "dim",
}

# Where the output is not a terminal (a pipe, a log file, a CI job) lines are never
# wrapped or cut at 80 columns: names and paths stay whole, one per line, for grep and for
# people reading logs. A terminal wraps what does not fit (tables fold, never "…").
_WIDE = 10_000


def make_console(stderr: bool = False) -> Console:
    """A console that prints text as written (no markup), whole lines off a terminal."""
    console = Console(stderr=stderr, markup=False)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, markup=False, width=_WIDE, soft_wrap=True)


def styled(text: str, style: str) -> Text:
    """``text`` as written, in ``style``."""
    return Text(text, style=style)


def styled_status(status: RunStatus) -> Text:
    """A run status in its colour."""
    return Text(status.value, style=STATUS_STYLE[status])


def verdict_text(verdict: str | None) -> Text:
    """A run's verdict as the terminal shows it: ``trusted`` in green, ``SUSPECT`` in bold
    red (it must not be missed), ``-`` when there is none (the run did not finish, or
    produced no reconstruction)."""
    if verdict == "trusted":
        return Text("trusted", style="green")
    if verdict == "suspect":
        return Text("SUSPECT", style="bold red")
    return Text("-")
