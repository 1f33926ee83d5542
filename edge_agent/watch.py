"""Filesystem events from the detector directory, reduced to "this scan may have changed".

Events only say *when to look*; whether a scan is ready is decided from the files
(:mod:`edge_agent.scans`). So a missed event costs at most one rescan period, never a scan.
inotify (close-write and moves) is used where the OS has it; network filesystems, whose
changes inotify does not see, need the polling observer (``agent.observer = "polling"``).
"""

from __future__ import annotations

import threading
from pathlib import Path

from watchdog.events import (
    EVENT_TYPE_CLOSED_NO_WRITE,
    EVENT_TYPE_OPENED,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from .scans import CXI_SUFFIX, MASTER_SUFFIX

# inotify reports opens and read-only closes too; the agent opening a scan to count its
# frames must not wake the agent to look at it again.
_IGNORED = frozenset({EVENT_TYPE_OPENED, EVENT_TYPE_CLOSED_NO_WRITE})


class ChangedScans(FileSystemEventHandler):
    """Collects the directories in which something happened, for the agent to re-assess."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirs: set[Path] = set()
        self.wakeup = threading.Event()

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in _IGNORED:
            return  # reads (the agent's own among them) say nothing new about a scan
        if event.is_directory and event.event_type not in ("created", "moved"):
            return
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            if raw:
                path = Path(str(raw))
                with self._lock:
                    self._dirs.add(path if event.is_directory else path.parent)
                    self.wakeup.set()

    def take(self) -> set[Path]:
        """The directories changed since the last call."""
        with self._lock:
            # Cleared before the swap: an event after it sets the flag again, never lost.
            self.wakeup.clear()
            dirs, self._dirs = self._dirs, set()
        return dirs


def scans_in(directory: Path) -> list[Path]:
    """Master/CXI files directly in ``directory``."""
    try:
        return sorted(
            p
            for p in directory.iterdir()
            if not p.name.startswith(".")
            and (p.name.endswith(MASTER_SUFFIX) or p.name.endswith(CXI_SUFFIX))
        )
    except OSError:
        return []


def start_observer(
    root: Path, handler: ChangedScans, kind: str = "auto", poll_seconds: float = 1.0
) -> BaseObserver:
    """Watch ``root`` recursively; ``kind`` is auto (inotify where available, else the
    platform's best), inotify (required: fails where the OS has none) or polling (network
    file systems, whose remote writes inotify never sees)."""
    if kind == "polling":
        observer: BaseObserver = PollingObserver(timeout=poll_seconds)
    elif kind == "inotify":
        try:
            from watchdog.observers.inotify import InotifyObserver
        except ImportError as exc:  # not Linux
            raise RuntimeError(
                f"agent.observer = 'inotify' but this system has no inotify ({exc}); "
                "use 'auto' or 'polling'"
            ) from None
        observer = InotifyObserver()
    else:
        observer = Observer()
    observer.schedule(handler, str(root), recursive=True)
    observer.daemon = True
    observer.start()
    return observer
