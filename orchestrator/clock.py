"""Timestamps as stored and returned: UTC ISO 8601 with microseconds."""

from __future__ import annotations

from datetime import datetime, timezone


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")
