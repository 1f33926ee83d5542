"""Compatibility of a stored checkpoint with the run that wants to resume from it.

A fingerprint is a plain JSON-able dict supplied by the caller::

    {"hard": {...}, "soft": {...}, "data": {"n": n_items, "digest": "..."}}

`hard` keys must match (a different energy or frame shape makes the stored state meaningless),
`soft` keys may differ (step sizes, iteration budget: reported, allowed), and `data` describes
the items the state was computed from. More items of the same kind (the stored items are a
prefix of the current ones) is a continuation; fewer or different items is a mismatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from beamflow.error_kinds import ErrorKind


@dataclass(frozen=True)
class Difference:
    key: str
    stored: Any
    current: Any

    def __str__(self) -> str:
        return f"{self.key}: stored {self.stored!r} vs current {self.current!r}"


class IncompatibleCheckpoint(Exception):
    """The checkpoint cannot be resumed by this run; `mismatches` names each hard difference."""

    kind = ErrorKind.BAD_INPUT  # the run's input does not fit the scan's checkpoint

    def __init__(self, mismatches: list[Difference], source: str | None = None,
                 hint: str | None = None) -> None:
        self.mismatches = mismatches
        self.source = source
        self.hint = hint
        where = f" {source}" if source else ""
        detail = "; ".join(str(m) for m in mismatches)
        tail = f" ({hint})" if hint else ""
        super().__init__(f"checkpoint{where} is incompatible with this run: {detail}{tail}")


@dataclass
class Compatibility:
    """Outcome of a compatible check: soft differences to log, and whether data grew."""

    soft: list[Difference] = field(default_factory=list)
    continuation: bool = False
    stored_n: int | None = None
    current_n: int | None = None

    @property
    def new_items(self) -> int:
        if self.stored_n is None or self.current_n is None:
            return 0
        return self.current_n - self.stored_n


def _equal(a: Any, b: Any, rel_tol: float) -> bool:
    # Floats computed from different files (J -> eV, mm -> m) differ in the last bits;
    # that is not a different experiment.
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=0.0)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_equal(x, y, rel_tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_equal(a[k], b[k], rel_tol) for k in a)
    return bool(a == b)


_MISSING = "<missing>"


def _diff(
    stored: Mapping[str, Any], current: Mapping[str, Any], rel_tol: float
) -> list[Difference]:
    out = []
    for key in sorted(set(stored) | set(current)):
        s = stored.get(key, _MISSING)
        c = current.get(key, _MISSING)
        if s is _MISSING or c is _MISSING or not _equal(s, c, rel_tol):
            out.append(Difference(key, s, c))
    return out


def check_compatible(
    stored: Mapping[str, Any] | None,
    current: Mapping[str, Any],
    prefix_digest: Callable[[int], str] | None = None,
    *,
    rel_tol: float = 1e-9,
    source: str | None = None,
) -> Compatibility:
    """Raise `IncompatibleCheckpoint` naming every hard mismatch; else report soft differences.

    `prefix_digest(n)` returns the current data's digest over its first `n` items; it is
    asked only when the current run has more items than the checkpoint.
    """
    if stored is None:
        raise IncompatibleCheckpoint([Difference("fingerprint", None, "present")], source)
    mismatches = _diff(stored.get("hard", {}) or {}, current.get("hard", {}) or {}, rel_tol)
    result = Compatibility(soft=_diff(stored.get("soft", {}) or {}, current.get("soft", {}) or {},
                                      rel_tol))

    sdata = stored.get("data")
    cdata = current.get("data")
    if sdata is not None or cdata is not None:
        if sdata is None or cdata is None:
            mismatches.append(Difference("data", sdata, cdata))
        else:
            sn, cn = int(sdata["n"]), int(cdata["n"])
            result.stored_n, result.current_n = sn, cn
            if cn < sn:
                mismatches.append(Difference("data.n (fewer items than the checkpoint)", sn, cn))
            elif cn == sn:
                if sdata.get("digest") != cdata.get("digest"):
                    mismatches.append(Difference("data.digest (same count, different data)",
                                                 sdata.get("digest"), cdata.get("digest")))
            else:
                prefix = prefix_digest(sn) if prefix_digest is not None else None
                if prefix is None or prefix != sdata.get("digest"):
                    mismatches.append(Difference(
                        f"data.digest (the first {sn} items differ from the checkpoint's)",
                        sdata.get("digest"), prefix))
                else:
                    result.continuation = True
    if mismatches:
        raise IncompatibleCheckpoint(mismatches, source)
    return result
