"""Deciding what the content-store GC removes (pure).

An entry `.content/{fp}/{name}` goes when no user's view version has its content and it has not
been used (created or linked from) for `max_age_s`; `grace_s` protects fresh entries even
when `max_age_s` is 0, so an entry a materializer just wrote is never taken from under it.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass

# Even `orchestrator gc --days 0` leaves entries used in the last ten minutes alone.
GC_GRACE_S = 600.0


@dataclass(frozen=True, order=True)
class StoreEntry:
    fingerprint: str
    name: str
    last_used: float


@dataclass(frozen=True)
class GcPlan:
    remove: tuple[StoreEntry, ...]
    kept_referenced: int
    kept_recent: int


def plan_gc(
    entries: Iterable[StoreEntry],
    referenced: Set[str],
    *,
    now: float,
    max_age_s: float,
    grace_s: float = GC_GRACE_S,
) -> GcPlan:
    remove, kept_referenced, kept_recent = [], 0, 0
    min_age = max(max_age_s, grace_s)
    for entry in sorted(entries):
        if entry.fingerprint in referenced:
            kept_referenced += 1
        elif now - entry.last_used <= min_age:
            kept_recent += 1
        else:
            remove.append(entry)
    return GcPlan(tuple(remove), kept_referenced, kept_recent)
