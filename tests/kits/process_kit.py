"""Processes as the fault tests see them: whether a pid they killed or left behind is gone."""

from __future__ import annotations

from pathlib import Path


def pid_running(pid: int) -> bool:
    """Whether ``pid`` is a live process: one that exited but was not reaped yet (a zombie,
    e.g. an orphan under a PID 1 that does not reap) counts as ended. Linux only."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
