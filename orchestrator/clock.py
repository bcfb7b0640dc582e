"""Timestamps as stored and returned: UTC ISO 8601 with microseconds."""

from __future__ import annotations

from datetime import datetime, timezone


def now_iso() -> str:
    return iso(datetime.now(timezone.utc))


def iso(moment: datetime) -> str:
    """A moment in the stored form (UTC, so stored timestamps compare as strings)."""
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")
