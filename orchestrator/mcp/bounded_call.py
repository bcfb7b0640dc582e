"""A tool call of the MCP server, with a large read_bytes counted as a transfer.

MCP answers a call as one JSON message, so the bytes of a read_bytes (a tools/call, or a skill
resource read) are held whole whatever happens; several large ones at once, unbounded, are
what the transfer slots exist to prevent (docs/lifecycle.md, "The memory envelope"). So the
MCP server asks the dispatcher for a streamed outcome like the HTTP route does: a large answer
then waits for a transfer slot of its user (or is `busy` and sent nothing), is verified in its
spool, and is read back whole only while that slot is held.
"""

from __future__ import annotations

import sys
from typing import Any

from starlette.concurrency import run_in_threadpool


async def dispatch_whole(dispatcher: Any, run_id: str, name: str, arguments: dict[str, Any], **options: Any) -> Any:
    """`dispatcher.dispatch_async(...)` whose outcome is never streamed: a streamed one is read
    back from its spool and closed here (the slot goes back), inside the caller's task, so a
    client that went away never leaves a spool or a slot behind."""
    outcome = await dispatcher.dispatch_async(run_id, name, arguments, stream=True, **options)
    if outcome.stream is None:
        return outcome
    try:
        body = await run_in_threadpool(outcome.stream.recorded_body, sys.maxsize)
    finally:
        outcome.close()
    return type(outcome).of_body(body)
