"""What the edge agent is watching and waiting for, as a small JSON file in the state dir.

The agent writes ``<state_dir>/agent.json`` (atomically: a temporary file renamed over it)
whenever what it sees changes, and at least every ``heartbeat_seconds``; the status page
reads it for its "Edge agent" panel (``/api/agent``). The file is only a report: the run
store stays the source of truth, and a missing or stale file only means the panel says so.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from beamflow.atomic import atomic_write_json

FILE_NAME = "agent.json"
FORMAT = "beamflow.agent-state/1"
HEARTBEAT_SECONDS = 10.0
MAX_LISTED = 100  # entries per list in the file; the totals say how many there are
ONCE_PREFIX = "agent --once: "  # how the closing line of `beamflow agent --once` starts


class WatchedScan(BaseModel):
    """A scan the agent sees but does not read yet, and why."""

    path: str
    name: str
    wait: str = Field(description="not quiet | frames | unreadable")
    reason: str
    frames: int
    expected: int | None
    since: float = Field(description="when the scan came into this state (Unix seconds)")


class SkippedFile(BaseModel):
    """An HDF5-looking file in the detector directory that the agent does not read."""

    path: str
    reason: str
    since: float


class AgentState(BaseModel):
    format: Literal["beamflow.agent-state/1"] = FORMAT
    pid: int
    mode: Literal["watch", "once"]
    running: bool
    watching: str
    backend: str
    started_at: float
    updated_at: float
    heartbeat_seconds: float = HEARTBEAT_SECONDS
    waiting: list[WatchedScan] = Field(default_factory=list)
    waiting_total: int = 0
    skipped: list[SkippedFile] = Field(default_factory=list)
    skipped_total: int = 0
    stats: dict[str, int] = Field(default_factory=dict)
    summary: str | None = Field(default=None, description="--once: the closing line")

    def stale(self, now: float | None = None) -> bool:
        """A running agent that has not written for three heartbeats: hung or killed."""
        now = time.time() if now is None else now
        return self.running and now - self.updated_at > 3 * self.heartbeat_seconds


class AgentStateError(Exception):
    """The state file is there but cannot be read; the message names it."""


def state_path(state_dir: Path) -> Path:
    return Path(state_dir) / FILE_NAME


def write_state(path: Path, state: AgentState) -> None:
    """Replace ``path`` atomically: a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, state.model_dump(mode="json"), durable=False)


def read_state(path: Path) -> AgentState | None:
    """The agent's last report, or None when no agent has written one here."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AgentStateError(f"{path}: cannot be read: {exc}") from None
    try:
        return AgentState.model_validate_json(text)
    except ValidationError as exc:
        raise AgentStateError(f"{path}: not an agent state file of this beamflow "
                              f"({exc.error_count()} problem(s))") from None
