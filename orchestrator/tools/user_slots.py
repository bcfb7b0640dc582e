"""The per-user cap on tool calls running at once (`ORCH_USER_MAX_CONCURRENT_CALLS`).

One user's sandbox can be made slow (a shell that sleeps, a stopped agent): their calls then
wait, and without a cap they would pile up without bound. A call over the cap is refused at
once with `busy` instead of waiting. Thread-safe: taken in a worker thread, given back on the
event loop.
"""

from __future__ import annotations

import threading
from collections import Counter

from orchestrator.errors import ToolError


class UserCallSlots:
    def __init__(self, per_user: int) -> None:
        self.per_user = per_user
        self._lock = threading.Lock()
        self._running: Counter[int] = Counter()

    def try_take(self, user_id: int) -> bool:
        with self._lock:
            if self._running[user_id] >= self.per_user:
                return False
            self._running[user_id] += 1
            return True

    def give_back(self, user_id: int) -> None:
        with self._lock:
            self._running[user_id] -= 1
            if self._running[user_id] <= 0:
                del self._running[user_id]

    def snapshot(self) -> list[tuple[int, int]]:
        """(user, calls running) of every user with one: what /metrics shows (top N)."""
        with self._lock:
            return list(self._running.items())

    def running(self, user_id: int) -> int:
        with self._lock:
            return self._running[user_id]

    def busy_error(self, user_id: int) -> ToolError:
        return ToolError(
            "busy",
            f"User {user_id} already has {self.per_user} tool calls running, the most one user may have at once "
            f"(ORCH_USER_MAX_CONCURRENT_CALLS={self.per_user}); other calls of this user are still running. This "
            "call did not run: wait for one of them to finish, then try again.",
        )
