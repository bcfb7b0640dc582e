"""The HTTP protocol `orchestrator serve` runs (issue 12 item 5): uvicorn's httptools protocol
with a bound on the request head. Uvicorn itself has neither: httptools keeps a header that
never ends in memory (100 MiB sent, 97 MiB held), and a connection that sends its head slowly,
or nothing at all, is kept forever. Both happen before any token is checked.

- A request head (request line and headers) above `ORCH_HTTP_MAX_HEADER_BYTES`: 400, closed.
- A head not complete within `ORCH_HTTP_BODY_STALL_S` of the connection opening or of its
  first byte: 408, closed. The body is bounded by orchestrator/http/request_guard.py.
"""

from __future__ import annotations

import asyncio
import json

from orchestrator.settings import ApiSettings
from sandbox_agent.head_with_body import HeadWithBody

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: uvicorn's h11 protocol, bounded by h11_max_incomplete_event_size
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

_END_OF_HEAD = b"\r\n\r\n"
_TIMEOUT_BODY = json.dumps({"error": {"code": "request_timeout", "message": "the request head did not arrive in time"}}).encode()
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    + f"content-length: {len(_TIMEOUT_BODY)}\r\n\r\n".encode()
    + _TIMEOUT_BODY
)


def bounded_protocol(api: ApiSettings) -> type[asyncio.Protocol] | str:
    """The protocol class for uvicorn's `http=`; "h11" when httptools is missing."""
    if HttpToolsProtocol is None:
        return "h11"
    max_head = api.http_max_header_bytes
    head_timeout = api.http_body_stall_s

    class BoundedHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[misc,valid-type]
        _in_head = True
        _head_bytes = 0
        _tail = b""
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
            # One send per small answer (sandbox_agent/head_with_body.py).
            super().connection_made(HeadWithBody(transport, asyncio.get_running_loop()))
            self._arm()

        def _arm(self) -> None:
            self._head_timer = self.loop.call_later(head_timeout, self._head_timed_out)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self._in_head and not self.transport.is_closing():
                self.transport.write(_TIMEOUT_RESPONSE)
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                if self._head_timer is None:
                    self._arm()
                end = (self._tail + data).find(_END_OF_HEAD)
                counted = len(data) if end < 0 else max(0, end + 4 - len(self._tail))
                self._head_bytes += counted
                self._tail = data[-3:]
                if self._head_bytes > max_head:
                    self._disarm()
                    self.send_400_response(f"the request head is larger than {max_head} bytes")
                    return
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._disarm()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head, self._head_bytes, self._tail = True, 0, b""  # the next request's head

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return BoundedHttpToolsProtocol
