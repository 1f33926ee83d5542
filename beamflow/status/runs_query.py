"""The runs list's query: which runs (status, scan, time) in which order, one page of them.

The same parameters on the page (``/?...``) and in the API (``/api/runs?...``):
``status`` (one or more, comma-separated), ``scan`` (a substring of the name or path),
``since`` (``30m``, ``1h``, ``24h``, ``7d``: runs that ended in that window or have not
ended; "failed in the last hour" is ``status=FAILED&since=1h``), ``sort`` (``newest``,
``oldest``, ``finished``: most recently ended first, ``longest``: longest running first),
``limit``, ``offset``.
"""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import urlencode

from fastapi import HTTPException
from pydantic import BaseModel

from beamflow.runs.records import RunStatus

DEFAULT_LIMIT = 50
# sort -> (store sort, oldest first)
SORTS: dict[str, tuple[str, bool]] = {
    "newest": ("created", False),
    "oldest": ("created", True),
    "finished": ("finished", False),
    "longest": ("duration", False),
}
SORT_LABELS = {
    "newest": "Newest first",
    "oldest": "Oldest first",
    "finished": "Recently ended",
    "longest": "Longest running",
}
SINCE_LABELS = {
    "": "Any time",
    "1h": "Last hour",
    "6h": "Last 6 hours",
    "24h": "Last 24 hours",
    "7d": "Last 7 days",
}
_UNITS = {"m": 60, "h": 3600, "d": 86400}
_SINCE = re.compile(r"^(\d{1,6})([mhd])$")


def parse_status(values: list[str] | None) -> list[RunStatus]:
    """``?status=FAILED,CANCELLED&status=ACTIVE`` as statuses (``ALL`` or empty: none)."""
    out: list[RunStatus] = []
    for value in values or []:
        for part in value.split(","):
            part = part.strip().upper()
            if not part or part == "ALL":
                continue
            if part not in RunStatus.__members__:
                raise HTTPException(
                    400, f"unknown status {part!r}; use one of {', '.join(RunStatus)}"
                )
            if RunStatus(part) not in out:
                out.append(RunStatus(part))
    return out


def parse_since(value: str | None) -> str | None:
    """A time window (``90m``, ``1h``, ``7d``), checked; None for any time."""
    value = (value or "").strip().lower()
    if not value or value == "any":
        return None
    if not _SINCE.match(value):
        raise HTTPException(
            400, f"since {value!r}: use a number and a unit, m, h or d (e.g. 1h, 30m, 7d)"
        )
    return value


class RunsQuery(BaseModel):
    status: list[RunStatus] = []
    scan: str | None = None
    since: str | None = None
    sort: str = "newest"
    limit: int = DEFAULT_LIMIT
    offset: int = 0

    @classmethod
    def parse(
        cls, status: list[str] | None, scan: str | None, since: str | None, sort: str | None,
        limit: int, offset: int,
    ) -> RunsQuery:
        sort = (sort or "newest").strip().lower()
        if sort not in SORTS:
            raise HTTPException(400, f"unknown sort {sort!r}; use one of {', '.join(SORTS)}")
        return cls(status=parse_status(status), scan=(scan or "").strip() or None,
                   since=parse_since(since), sort=sort, limit=limit, offset=offset)

    def since_time(self, now: float | None = None) -> float | None:
        """The start of the time window as a Unix time (None: any time)."""
        if self.since is None:
            return None
        match = _SINCE.match(self.since)
        assert match is not None  # checked by parse_since
        seconds = int(match.group(1)) * _UNITS[match.group(2)]
        return (time.time() if now is None else now) - seconds

    def store_sort(self) -> tuple[str, bool]:
        return SORTS[self.sort]

    def link(self, offset: int | None = None, **changes: Any) -> str:
        """This query as a page URL, with ``changes`` (e.g. another status) and ``offset``."""
        fields = {**self.model_dump(), **changes}
        query: dict[str, Any] = {}
        if fields["status"]:
            query["status"] = ",".join(RunStatus(s).value for s in fields["status"])
        for key in ("scan", "since"):
            if fields[key]:
                query[key] = fields[key]
        if fields["sort"] != "newest":
            query["sort"] = fields["sort"]
        if fields["limit"] != DEFAULT_LIMIT:
            query["limit"] = fields["limit"]
        if offset:
            query["offset"] = offset
        return "/?" + urlencode(query) if query else "/"
