"""One send per small HTTP answer: uvicorn writes a response's head and its body separately, so
every tool call cost two sends and two wake-ups of the reader, both from the agent to the
orchestrator and from the orchestrator to the bot.

`HeadWithBody` wraps a connection's transport: a whole response head is held until the next
write (the body, which a plain response sends in the same step) and both go out as one (a body
above 64 KiB goes in a send of its own rather than being copied behind the head); a head
nothing follows at once (a HEAD answer, a stream whose first piece comes later) goes out on the
loop's next turn. Every other write passes through, after what is held.
"""

from __future__ import annotations

import asyncio
from typing import Any

_STATUS_LINE = b"HTTP/1.1 "
JOIN_MAX_BYTES = 64 * 1024  # a body up to this size is joined to its head
_END_OF_HEAD = b"\r\n\r\n"


class HeadWithBody:
    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held = b""

    def write(self, data: bytes) -> None:
        if self._held:
            if len(data) > JOIN_MAX_BYTES:  # a large body: two sends cost less than copying it
                self.flush()
            else:
                data, self._held = self._held + data, b""
        elif data.startswith(_STATUS_LINE) and data.endswith(_END_OF_HEAD):
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        if self._held:
            held, self._held = self._held, b""
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)  # is_closing, get_extra_info, pause_reading, ...
