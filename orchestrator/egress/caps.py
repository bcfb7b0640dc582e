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


@dataclass
class LookupGate:
    """Name lookups in flight, per user and in total (the proxy's loop alone touches it). A
    lookup past either cap is refused at once, not queued: a queue would let one user's slow
    names delay the lookups behind them."""

    per_user: int
    total: int
    in_flight: dict[int, int] = field(default_factory=dict)
    in_flight_total: int = 0

    def admit(self, user_id: int) -> None:
        """Count a lookup of `user_id` in, or raise CapExceeded (nothing counted then)."""
        mine = self.in_flight.get(user_id, 0)
        if mine >= self.per_user:
            raise CapExceeded(
                "dns_lookups_per_user",
                f"this sandbox already has {mine} name lookups in flight (at most {self.per_user}, "
                "ORCH_EGRESS_DNS_LOOKUPS_PER_USER); wait for some to finish and retry",
            )
        if self.in_flight_total >= self.total:
            raise CapExceeded(
                "dns_lookups_busy",
                f"the proxy has {self.in_flight_total} name lookups in flight for all sandboxes (at most {self.total}, "
                "ORCH_EGRESS_DNS_LOOKUPS); retry in a moment",
            )
        self.in_flight[user_id] = mine + 1
        self.in_flight_total += 1

    def release(self, user_id: int) -> None:
        left = self.in_flight.get(user_id, 0) - 1
        if left > 0:
            self.in_flight[user_id] = left
        else:
            self.in_flight.pop(user_id, None)
        self.in_flight_total = max(0, self.in_flight_total - 1)
