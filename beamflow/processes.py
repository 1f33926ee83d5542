"""Processes on this host, as the crash-recovery code and the job's helper processes (the
checkpoint writer, the live previews) see them."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def die_with_parent(parent: int) -> None:
    """Be killed when the parent process (more exactly: the thread that started us) ends."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(0)


def helper_command(module: str, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``module.main(args)`` in a helper process.

    The helper imports the same beamflow as this process, installed or not.
    """
    source = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    code = f"import sys; from {module} import main; main(sys.argv[1:])"
    return [sys.executable, "-c", code, *args], env
