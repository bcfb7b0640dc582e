"""Per-user egress caps: connections at once, bytes per connection, bytes per day.

Only the proxy's event loop touches a `UserCaps`, so it needs no lock. A day is the UTC
calendar day; the counters are in memory (a restart starts the day's count afresh, which
errs on the user's side for at most one day's cap).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CapLimits:
    max_connections: int
    bytes_per_connection: int
    bytes_per_day: int


class CapExceeded(Exception):
    """A cap refused or cut a connection; `code` names the cap, the text says what to do."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def utc_day(now: float) -> int:
    return int(now // 86400)


@dataclass
class UserCaps:
    limits: CapLimits
    clock: Callable[[], float] = time.time
    open_connections: int = 0
    day: int = -1
    bytes_today: int = 0

    def _roll(self) -> None:
        today = utc_day(self.clock())
        if today != self.day:
            self.day, self.bytes_today = today, 0

    def admit(self) -> None:
        """Count a new connection in, or raise CapExceeded (nothing counted then)."""
        self._roll()
        if self.open_connections >= self.limits.max_connections:
            raise CapExceeded(
                "too_many_connections",
                f"this sandbox already has {self.open_connections} egress connections open "
                f"(at most {self.limits.max_connections}); wait for some to finish and retry",
            )
        if self.bytes_today >= self.limits.bytes_per_day:
            raise CapExceeded(
                "daily_bytes_exceeded",
                f"this sandbox used its egress allowance of {self.limits.bytes_per_day} bytes for today (UTC); "
                "ask an admin or retry tomorrow",
            )
        self.open_connections += 1

    def release(self) -> None:
        self.open_connections = max(0, self.open_connections - 1)


@dataclass
class ConnectionMeter:
    """Bytes of one connection, charged to its user's day as they pass."""

    caps: UserCaps
    up: int = 0
    down: int = 0
    cut: CapExceeded | None = field(default=None)
    delivered_down: int = 0  # downstream bytes passed on: all charged before the cut's chunk

    def charge(self, n: int, *, upstream: bool) -> None:
        """Count `n` bytes; raises CapExceeded once a cap is passed (the relay then cuts)."""
        if upstream:
            self.up += n
        else:
            self.delivered_down = self.down  # the relay writes a chunk out before it reads the next
            self.down += n
        caps = self.caps
        caps._roll()
        caps.bytes_today += n
        if self.up + self.down > caps.limits.bytes_per_connection:
            self.cut = CapExceeded(
                "connection_bytes_exceeded",
                f"the connection passed {caps.limits.bytes_per_connection} bytes (ORCH_EGRESS_MAX_BYTES_PER_CONNECTION) and was cut",
            )
            raise self.cut
        if caps.bytes_today > caps.limits.bytes_per_day:
            self.cut = CapExceeded(
                "daily_bytes_exceeded",
                f"the sandbox passed its {caps.limits.bytes_per_day} bytes of egress for today (UTC); the connection was cut",
            )
            raise self.cut
