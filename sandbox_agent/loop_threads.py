"""Worker threads for blocking work an event loop awaits: every tool call goes through them
twice in the orchestrator (its admission and completion, SQLite writes) and once in the agent
(the tool itself).

`loop.run_in_executor` makes each hop build a `concurrent.futures.Future` (a lock and a
condition), a work item, an asyncio future and two chained callbacks. Here a hop is an asyncio
future and a queue entry; the worker hands the outcome back with `call_soon_threadsafe`. Threads
start as work arrives, up to `max_threads`, and wait for the next item when idle, as the
standard executor's do.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Item = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]


class LoopThreads:
    def __init__(self, max_threads: int, name: str) -> None:
        self._max = max_threads
        self._name = name
        self._work: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one count per worker waiting for work
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def run(self, work: Callable[[], T]) -> asyncio.Future[T]:
        """`work()` in a worker thread; awaited on the running loop. A hop cancelled before its
        worker takes it never runs."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._closed:
            raise RuntimeError(f"{self._name}: closed")
        self._work.put((loop, future, work))
        if not self._idle.acquire(blocking=False):
            self._add_thread()
        return future

    def close(self) -> None:
        """Idle workers end; the ones busy end after their item (they are daemons)."""
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._work.put(None)

    def _add_thread(self) -> None:
        with self._lock:
            if len(self._threads) >= self._max or self._closed:
                return  # a busy worker takes the item when it is done
            thread = threading.Thread(target=self._serve, name=f"{self._name}_{len(self._threads)}", daemon=True)
            self._threads.append(thread)
        thread.start()

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            loop, future, work = item
            if future.cancelled():  # read without the loop's lock: at worst the work runs, as before
                self._idle.release()
                continue
            try:
                outcome: Any = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                outcome, failure = None, exc
            else:
                failure = None
            # Idle before the outcome is handed back: the task's next hop finds this worker.
            self._idle.release()
            _deliver(loop, future, outcome, failure)


def _deliver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], outcome: Any, exc: BaseException | None) -> None:
    try:
        loop.call_soon_threadsafe(_settle, future, outcome, exc)
    except RuntimeError:  # the loop is closed: nobody awaits it any more
        pass


def _settle(future: asyncio.Future[Any], outcome: Any, exc: BaseException | None) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(outcome)
