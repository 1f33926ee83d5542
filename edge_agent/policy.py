"""The agent's rules, free of I/O: the key under which each part of a scan gets its one run,
and which failures are worth another attempt and after how long.

Kept apart from the loop that applies them so that they read, and are tested, on their own;
the demo uses the keys too, to find the run the agent made of a scan.
"""

from __future__ import annotations

from pathlib import Path

from beamflow.store import Run

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


# How a failure reads decides whether it is worth another attempt. Bad input is checked
# first: it is never retried, whatever step it surfaced in.
_BAD_INPUT = (
    "scanformaterror",
    "valueerror",
    "validationerror",
    "incompatiblecheckpoint",
    "does not match its schema",
    "invalid",
    "bad input",
    "not a readable",
    "refused",
    "permission_denied",
    "permission denied",
)
_TRANSIENT = (
    "lost",  # RunLost (the process running it ended), WorkerLost (killed, out of memory)
    "timeout",  # ActionTimeout, socket timeouts
    "timed out",
    "connection",
    "unavailable",
    "network",
    "token",  # an expired or revoked token that a refresh fixes
    "temporar",
    "actionunabletorun",  # the provider could not start the action (endpoint offline, ...)
    "endpoint is offline",
    "throttl",
    "too many requests",
    "busy",
    "file_not_found",  # a file renamed by the detector's writer while it was copied
    "vanished",
)


def is_transient(run: Run) -> bool:
    """Faults worth a retry: a lost run or worker, transfer and network faults, timeouts,
    an expired token, an endpoint that could not take the task. Bad input (the reader's or
    the function's validation errors, refused paths) is never retried; a reconstruction
    that failed on good input (it diverged) is not either: the same input fails again."""
    text = f"{run.error_step or ''} {run.error or ''}".lower()
    if any(word in text for word in _BAD_INPUT):
        return False
    if (run.error_step or "").startswith("Transfer"):
        return True  # transfers are retried, as Globus Transfer retries its own faults
    return any(word in text for word in _TRANSIENT)


def retry_delay(backoff_seconds: float, attempt: int) -> float:
    """Back-off before attempt ``attempt + 1``: doubling from ``backoff_seconds``."""
    return backoff_seconds * 2 ** (attempt - 1)
