"""The bound on concurrent payload transfers (`send_file`, `send_image`, `publish_artifact`,
and `read_bytes` answers of at least 1 MiB through the HTTP route). Sandbox files and own
uploads stream through spool files, but a URL's bytes are held whole (up to
ORCH_READ_BYTES_MAX) while they are read, hashed and written, every transfer holds a few MiB
of buffers, and every transfer makes an agent read its file whole in the sandbox's memory:
without a bound 20 concurrent 20 MB sends took the orchestrator from 110 to 1005 MiB.
At most ORCH_TRANSFERS_MAX run at once, ORCH_USER_TRANSFERS_MAX of one user; a transfer over
either waits for a free slot for at most ORCH_TRANSFER_WAIT_S, then is refused with `busy`
and did nothing (docs/lifecycle.md).

A send counts whatever its size: the size of a sandbox file is only known once it has been
read, which is exactly what the bound must come before. A `read_bytes` takes its slot once
the agent's answer announces a large body (`take_async`), so small reads never queue.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator import metrics
from orchestrator.errors import ToolError

POLL_S = 0.02  # how often an event-loop waiter looks for a free slot


def may_start(*, running: int, running_of_user: int, transfers_max: int, user_transfers_max: int) -> bool:
    """Pure: whether one more transfer of a user fits both bounds."""
    return running < transfers_max and running_of_user < user_transfers_max


class TransferSlots:
    def __init__(self, *, transfers_max: int, user_transfers_max: int, wait_s: float) -> None:
        self.transfers_max = transfers_max
        self.user_transfers_max = user_transfers_max
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._running: Counter[int] = Counter()
        self._total = 0

    @contextmanager
    def held(self, user_id: int, *, tool: str) -> Iterator[None]:
        """A slot for one transfer of `user_id` while the block runs; raises `busy` when none
        came free within `wait_s`."""
        self._take(user_id, tool)
        try:
            yield
        finally:
            self.give_back(user_id)

    async def take_async(self, user_id: int, tool: str) -> None:
        """`held`'s wait on the event loop, for a transfer whose slot outlives one block (a
        streamed read_bytes answer holds it until its HTTP answer is sent): it polls, so it
        holds no thread; give the slot back with `give_back`."""
        deadline = time.monotonic() + self.wait_s
        while not self._try_take(user_id):
            if time.monotonic() >= deadline:
                metrics.TRANSFERS.labels("refused").inc()
                raise self._busy(user_id, tool)
            await asyncio.sleep(POLL_S)
        metrics.TRANSFERS.labels("admitted").inc()

    def give_back(self, user_id: int) -> None:
        with self._cond:
            self._total -= 1
            self._running[user_id] -= 1
            if self._running[user_id] <= 0:
                del self._running[user_id]
            self._cond.notify_all()

    def _try_take(self, user_id: int) -> bool:
        with self._cond:
            if not self._fits(user_id):
                return False
            self._total += 1
            self._running[user_id] += 1
            return True

    def _fits(self, user_id: int) -> bool:
        return may_start(
            running=self._total, running_of_user=self._running[user_id],
            transfers_max=self.transfers_max, user_transfers_max=self.user_transfers_max,
        )  # fmt: skip

    def _take(self, user_id: int, tool: str) -> None:
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            while not self._fits(user_id):
                left = deadline - time.monotonic()
                if left <= 0:
                    metrics.TRANSFERS.labels("refused").inc()
                    raise self._busy(user_id, tool)
                self._cond.wait(left)
            self._total += 1
            self._running[user_id] += 1
        metrics.TRANSFERS.labels("admitted").inc()

    def _busy(self, user_id: int, tool: str) -> ToolError:
        return ToolError(
            "busy",
            f"{tool} did not run: file transfers are at their bound (at most {self.transfers_max} at once, "
            f"{self.user_transfers_max} per user: ORCH_TRANSFERS_MAX / ORCH_USER_TRANSFERS_MAX) and none "
            f"finished within {self.wait_s:g} s. Nothing was sent; try again in a moment.",
            user_id=user_id,
        )
