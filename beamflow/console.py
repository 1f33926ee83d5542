"""Terminal presentation shared by the CLI and the demo (rich markup)."""

from __future__ import annotations

from beamflow.store import RunStatus

STATUS_STYLE = {
    RunStatus.QUEUED: "blue",
    RunStatus.ACTIVE: "yellow",
    RunStatus.INACTIVE: "magenta",
    RunStatus.SUCCEEDED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "dim",
}


def styled_status(status: RunStatus) -> str:
    """A run status in its colour (rich markup)."""
    return f"[{STATUS_STYLE[status]}]{status}[/]"
