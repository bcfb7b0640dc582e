"""How many egress audit rows (and log lines) one runtime user's connections may write per
minute. Pure: a clock value in, a decision out.

Every connection of a sandbox is one row, and a sandbox can open thousands a second that are
refused at once (a garbage head): unbounded, that grows the host's state database on a disk no
quota covers and keeps its one writer busy for every other user. Past the budget, connections
are counted by verdict instead; the first row of the user's next window says how many were
left out (`egress_audit_suppressed`).

A connection that used a credential is what a credential's owner must be able to find: past
the budget, the first use of each credential (and grant) in a window is still written, so a
flood of garbage connections cannot hide it; further uses are counted under its name. The
rows this adds are bounded by the credentials a user can use, not by connections.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

ROWS_PER_WINDOW = 600
WINDOW_S = 60.0


@dataclass
class _Window:
    started: float
    rows: int = 0
    suppressed: Counter[str] = field(default_factory=Counter)
    credentials_written: set[str] = field(default_factory=set)  # credential keys with a row in this window


@dataclass(frozen=True)
class Admission:
    write: bool  # write this connection's row and log line
    # verdict -> connections left out in the user's previous window (written once, now)
    suppressed_before: dict[str, int]
    first_suppressed: bool  # the first one left out in this window (worth one warning)


class AuditBudget:
    """Not thread-safe: the proxy's loop alone calls it."""

    def __init__(self, rows_per_window: int = ROWS_PER_WINDOW, window_s: float = WINDOW_S) -> None:
        self.rows_per_window = rows_per_window
        self.window_s = window_s
        self._windows: dict[int, _Window] = {}

    def admit(self, user_id: int, verdict: str, now: float, credential: str | None = None) -> Admission:
        """`credential`: a key naming the credential (and grant) the connection used, if one."""
        window = self._windows.get(user_id)
        before: dict[str, int] = {}
        if window is None or now - window.started >= self.window_s:
            if window is not None:
                before = dict(window.suppressed)
            window = self._windows[user_id] = _Window(now)
        if window.rows < self.rows_per_window:
            window.rows += 1
            if credential is not None:
                window.credentials_written.add(credential)
            return Admission(True, before, False)
        if credential is not None and credential not in window.credentials_written:
            window.credentials_written.add(credential)
            return Admission(True, before, False)
        window.suppressed[verdict if credential is None else f"{verdict} {credential}"] += 1
        return Admission(False, before, sum(window.suppressed.values()) == 1)
