"""The HTTP answer of a large `read_bytes`: the same JSON as `JSONResponse` renders, with its
base64 field encoded from the spool file piece by piece (orchestrator/tools/read_bytes_stream.py).
Its Content-Length is exact, so a client sees an answer cut short as an error, never as a
shorter file."""

from __future__ import annotations

from anyio import to_thread
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from orchestrator.tools.read_bytes_stream import StreamedReadBytes


class StreamedReadBytesResponse(Response):
    media_type = "application/json"

    def __init__(self, stream: StreamedReadBytes) -> None:
        self._stream = stream
        super().__init__(content=None, status_code=200, media_type=self.media_type)
        self.headers["content-length"] = str(stream.content_length())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = self._stream
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": stream.head(), "more_body": True})
            for offset in stream.pieces():
                # Reading and encoding 768 KiB costs about a millisecond: off the event loop.
                piece = await to_thread.run_sync(stream.encoded_piece, offset)
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": stream.tail(), "more_body": False})
        finally:  # sent, or the client went away: the spool file and the transfer slot go back
            stream.close()
