"""The inbox long-poll: claim the next delivery, or wait (bounded) until one may be there."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio.to_thread

from orchestrator.collaboration.coordinator import CollaborationService, InboxItem

# A safety net, not the mechanism: signals wake waiters at once; this bounds what a missed
# signal (a claim expiring, a run ended by another process) can cost.
RECHECK_S = 2.0


async def next_delivery(
    collaboration: CollaborationService,
    session_id: str,
    wait_s: float,
    gone: Callable[[], Awaitable[bool]],
) -> InboxItem | None:
    """Claim the session's next delivery, waiting up to `wait_s` seconds for one. `gone` tells
    whether the caller hung up: then nothing is claimed, since a claimed delivery nobody
    receives would end up in review."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        wake = collaboration.signals.register(session_id)
        try:
            if await gone():
                return None
            item = await anyio.to_thread.run_sync(collaboration.claim_next, session_id)
            remaining = deadline - loop.time()
            if item is not None or remaining <= 0:
                return item
            try:
                await asyncio.wait_for(asyncio.shield(wake), timeout=min(remaining, RECHECK_S))
            except asyncio.TimeoutError:
                pass
        finally:
            collaboration.signals.unregister(session_id, wake)
