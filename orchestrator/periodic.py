"""A background thread that calls a function every so often until stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from orchestrator.log import kv

log = logging.getLogger(__name__)


class PeriodicTask:
    def __init__(
        self, name: str, interval_s: float, function: Callable[[], object], *, first_delay_s: float | None = None
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self._function = function
        self._first_delay_s = interval_s if first_delay_s is None else first_delay_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.runs = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"periodic-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        delay = self._first_delay_s
        while not self._stop.wait(delay):
            try:
                self._function()
            except Exception:  # one failed round must not end the task
                log.exception("periodic task failed %s", kv(task=self.name))
            self.runs += 1
            delay = self.interval_s
