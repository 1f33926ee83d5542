"""The agent's rules, free of I/O: the key under which each part of a scan gets its one run,
and which failures are worth another attempt and after how long.

Kept apart from the loop that applies them so that they read, and are tested, on their own;
the demo uses the keys too, to find the run the agent made of a scan.
"""

from __future__ import annotations

from pathlib import Path

from beamflow.runs.records import Run

KEY_PREFIX = "agent:"
FINAL = "final"


def dedupe_key(scan_path: Path, part: str) -> str:
    """The store key of one part of one scan: the real path (symlinks resolved), so the
    same files watched through another path are still the same scan."""
    return f"{KEY_PREFIX}{Path(scan_path).resolve()}#{part}"


def part_of(fraction: float | None) -> str:
    """The dedupe-key part of a run at ``fraction`` of the frames (1.0 or None: final)."""
    if fraction is None or fraction >= 1.0:
        return FINAL
    return f"{fraction:.3f}"


def is_transient(run: Run) -> bool:
    """Faults worth a retry, by the kind stored on the run where the error was understood
    (beamflow.runs.failures): a lost run or worker, a transient transfer, service or network
    fault, a timeout, a full disk (after a longer wait: agent.no_space_backoff_seconds).
    Bad input is never retried; a reconstruction that failed on good input (it diverged) is
    not either: the same input fails again. A failure of no known kind is not retried."""
    return run.error_kind is not None and run.error_kind.worth_retrying


def retry_delay(backoff_seconds: float, attempt: int) -> float:
    """Back-off before attempt ``attempt + 1``: doubling from ``backoff_seconds``."""
    return backoff_seconds * 2 ** (attempt - 1)
