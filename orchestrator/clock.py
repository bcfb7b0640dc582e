"""Timestamps as stored and returned: UTC ISO 8601 with microseconds."""

from __future__ import annotations

from datetime import datetime, timezone


def now_iso() -> str:
    return iso(datetime.now(timezone.utc))


def iso(moment: datetime) -> str:
    """A moment in the stored form (UTC, so stored timestamps compare as strings)."""
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def seconds_until(stored: str) -> float:
    """Seconds from now to a stored timestamp (negative when it is past)."""
    return (datetime.fromisoformat(stored) - datetime.now(timezone.utc)).total_seconds()
