"""Logins to an exposed status page: one random session per login, with an expiry, revoked at
logout.

Kept in this process's memory (the status server is one process): a restart logs everybody
out, which is the safe direction. Only a hash of each cookie value is held, so a memory dump
does not hand out live cookies.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable

DEFAULT_SESSION_SECONDS = 12 * 3600.0
# Logins need the token, so this bounds only what an operator's scripts could pile up; the
# oldest sessions go first.
MAX_SESSIONS = 1000


def _key(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class Sessions:
    """The live sessions of one server: cookie value (hashed) -> the time it expires."""

    def __init__(
        self, lifetime: float = DEFAULT_SESSION_SECONDS, *, clock: Callable[[], float] = time.time
    ) -> None:
        if lifetime <= 0:
            raise ValueError(f"a session must last some time, not {lifetime} s")
        self.lifetime = lifetime
        self._clock = clock
        self._expiry: dict[str, float] = {}
        self._lock = threading.Lock()

    def new(self) -> str:
        """A fresh session; its value goes into the login cookie."""
        value = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            self._prune(now)
            while len(self._expiry) >= MAX_SESSIONS:
                del self._expiry[min(self._expiry, key=self._expiry.__getitem__)]
            self._expiry[_key(value)] = now + self.lifetime
        return value

    def valid(self, value: str) -> bool:
        """Whether ``value`` is a session this server gave out, not expired nor revoked."""
        if not value:
            return False
        key = _key(value)
        with self._lock:
            expiry = self._expiry.get(key)
            if expiry is None:
                return False
            if self._clock() >= expiry:
                del self._expiry[key]
                return False
            return True

    def revoke(self, value: str) -> None:
        """End this session (logout); others stay."""
        with self._lock:
            self._expiry.pop(_key(value), None)

    def __len__(self) -> int:
        with self._lock:
            self._prune(self._clock())
            return len(self._expiry)

    def _prune(self, now: float) -> None:
        for key in [k for k, t in self._expiry.items() if t <= now]:
            del self._expiry[key]
