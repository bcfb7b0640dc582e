"""Bounds guessing the admin token at the console's login: after FAILURES_PER_WINDOW wrong
tokens from one client address within WINDOW_S, that address's logins are refused (429) until
the window ends, the right token included (or the guessing would go on and learn when it hit).
Bounded memory: at most MAX_ADDRESSES addresses are remembered, the oldest forgotten first.
Kept in memory, like the sessions."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 60.0
FAILURES_PER_WINDOW = 10
MAX_ADDRESSES = 10_000


@dataclass(frozen=True)
class Failures:
    count: int
    since: float  # monotonic: the window's first failure


def wait_s(failures: Failures | None, now: float) -> int:
    """Pure: whole seconds until this address may try again (0: now)."""
    if failures is None or failures.count < FAILURES_PER_WINDOW or now >= failures.since + WINDOW_S:
        return 0
    return max(1, math.ceil(failures.since + WINDOW_S - now))


def after_failure(failures: Failures | None, now: float) -> Failures:
    """Pure: the count once one more wrong token came in (a new window once the last ended)."""
    if failures is None or now >= failures.since + WINDOW_S:
        return Failures(1, now)
    return Failures(failures.count + 1, failures.since)


class LoginAttempts:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._failures: OrderedDict[str, Failures] = OrderedDict()

    def wait_s(self, address: str) -> int:
        with self._lock:
            return wait_s(self._failures.get(address), self.clock())

    def failed(self, address: str) -> None:
        with self._lock:
            self._failures[address] = after_failure(self._failures.pop(address, None), self.clock())
            while len(self._failures) > MAX_ADDRESSES:
                self._failures.popitem(last=False)
