"""Waking long-polling inbox requests (deliveries reach the chat bot through an inbox
it polls).

A signal only says "look again": the mailbox is the truth, so a lost or extra wake-up costs a
query, never a message. `notify` is called from worker threads (tool calls, run ends), while
waiters live on the server's event loop; futures are completed with `call_soon_threadsafe`,
never touched from the wrong thread.
"""

from __future__ import annotations

import asyncio
import threading


class InboxSignals:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}

    def register(self, session_id: str) -> asyncio.Future[None]:
        """A future completed by the next `notify(session_id)`. Register before checking the
        mailbox, so a notification between the check and the wait is not lost."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiters.setdefault(session_id, set()).add((loop, future))
        return future

    def unregister(self, session_id: str, future: asyncio.Future[None]) -> None:
        with self._lock:
            waiters = self._waiters.get(session_id)
            if waiters is None:
                return
            waiters.difference_update({w for w in waiters if w[1] is future})
            if not waiters:
                del self._waiters[session_id]

    def notify(self, session_id: str) -> None:
        with self._lock:
            waiters = list(self._waiters.get(session_id, ()))
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # the loop is closed: nobody waits there any more
                pass

    def waiting(self, session_id: str) -> int:
        with self._lock:
            return len(self._waiters.get(session_id, ()))


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
