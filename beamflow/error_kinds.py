"""What kind of fault ended a run: the one word that decides whether another attempt helps.

Set where the error is raised or first understood (the job's errors, the backends' action
status documents, the run path), stored on the run (``Run.error_kind``) and read where a retry
is decided (the edge agent's policy, ``beamflow runs retry``, the status page's button), so
that no decision reads the wording of an error.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    BAD_INPUT = "bad_input"  # the scan, its parameters or a path: the same input fails again
    FAILED = "failed"  # the job itself failed on good input (e.g. diverged): so would a retry
    TRANSIENT = "transient"  # a network, service or transfer fault, a timeout: worth a retry
    LOST = "lost"  # the process or worker running it ended (killed, out of memory): retry
    NO_SPACE = "no_space"  # a disk (or quota) filled up: retry once space may have been freed
    CANCELLED = "cancelled"  # someone stopped it

    @property
    def worth_retrying(self) -> bool:
        return self in (ErrorKind.TRANSIENT, ErrorKind.LOST, ErrorKind.NO_SPACE)
