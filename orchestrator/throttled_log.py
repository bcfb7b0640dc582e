"""Log lines with a budget: an error that can repeat thousands of times a second (accept()
out of descriptors, a refused flood) is written once, then once per interval with the count
of occurrences since, never a traceback each.

`IntervalCounter` decides (pure, clock injected); `ThrottledLog` writes.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from orchestrator.log import kv

INTERVAL_S = 10.0


@dataclass
class _Tally:
    reported_at: float
    since: int = 0


class IntervalCounter:
    """`note(key)` counts one occurrence; it answers how many to report now (the first of a
    key at once, then the count since the last report once `interval_s` has passed), or 0 to
    stay quiet. Occurrences after the last report are told with the next one."""

    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._tallies: dict[Hashable, _Tally] = {}

    def note(self, key: Hashable) -> int:
        now = self._clock()
        tally = self._tallies.get(key)
        if tally is None:
            self._tallies[key] = _Tally(now)
            return 1
        tally.since += 1
        if now - tally.reported_at < self.interval_s:
            return 0
        count, tally.since, tally.reported_at = tally.since, 0, now
        return count


class ThrottledLog:
    def __init__(self, logger: logging.Logger, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.counter = IntervalCounter(interval_s, clock)

    def log(self, level: int, key: Hashable, message: str, **fields: Any) -> None:
        """`message` with `fields`, `count=` (occurrences this line stands for) and the interval."""
        count = self.counter.note(key)
        if count:
            self.logger.log(level, "%s %s", message, kv(**fields, count=count, interval_s=self.counter.interval_s))


_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def budget_loop_accept_errors(loop: asyncio.AbstractEventLoop, throttled: ThrottledLog) -> None:
    """asyncio logs `socket.accept() out of system resource` with a full traceback each time a
    listening socket's accept fails on EMFILE (once a second per listener, for as long as it
    lasts): those go through `throttled` instead; anything else to the loop's usual handler."""
    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_DESCRIPTORS:
            throttled.log(logging.ERROR, ("accept", exc.errno), "accept failed: out of descriptors",
                          error=errno.errorcode.get(exc.errno or 0, str(exc.errno)))  # fmt: skip
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
