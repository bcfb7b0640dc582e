"""Starting the process backend's agents from one thread that lives as long as the backend.

bwrap's --die-with-parent (PR_SET_PDEATHSIG) fires when the *thread* that forked it exits, and
the threads calls run on come and go: an agent started from one would die with it."""

from __future__ import annotations

import errno
import queue
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class SpawnThread:
    """The one long-lived thread the agents' processes are started from (see above)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="agent-spawner")
        self._thread.start()

    def run(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        """`start()` on the spawner thread. After `close` an OSError at once: a start asked of
        a closed backend fails clearly instead of waiting for a thread that is gone."""
        done: Future[subprocess.Popen[bytes]] = Future()
        with self._lock:
            if self._closed:
                raise OSError(errno.ESHUTDOWN, "the process backend is closed: no agent starts")
            self._queue.put((start, done))
        return done.result()

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            start, done = job
            try:
                done.set_result(start())
            except BaseException as exc:  # handed to the caller's thread
                done.set_exception(exc)

    def close(self) -> None:
        with self._lock:  # what was queued before runs; nothing is queued after
            if not self._closed:
                self._closed = True
                self._queue.put(None)
