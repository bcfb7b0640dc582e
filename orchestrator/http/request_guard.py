"""The first thing a request meets (issue 12 item 5): the bearer token is checked from the
headers before any body byte is read, and a body is read only up to its route's cap and
within a time bound. A plain ASGI middleware, so nothing of the app runs before it decides.

- `/v1/...` without a valid token (bot or admin): 401 at once; the route dependencies stay
  the authority for roles (bot or admin) and `X-Acting-User`.
- A declared `Content-Length` above the cap: 413 at once; a chunked body is counted while it
  arrives and cut at the cap (413). The body, once read, is handed to the app from memory;
  only an upload into a sandbox (`streams_body`) is handed on as it arrives, under the same bounds.
- A body that stalls for `ORCH_HTTP_BODY_STALL_S`, or is not complete within
  `ORCH_HTTP_BODY_TIMEOUT_S`, is answered 408 and the connection is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.log import kv
from orchestrator.settings import ApiSettings

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PROTECTED_PREFIX = "/v1/"
_SKILL_PUT = re.compile(r"^/v1/(admin/skills|users/[^/]+/skills)/[^/]+/?$")
_TOOL_CALL = re.compile(r"^/v1/runs/[^/]+/tools/[^/]+/?$")
_UPLOAD = re.compile(r"^/v1/runs/[^/]+/files/incoming/[^/]+/?$")
_MCP = re.compile(r"^/v1/runs/[^/]+/mcp/?$")
JSON_OVERHEAD = 1024 * 1024  # field names, quoting and escapes around the largest value


LOGGED_PATH_MAX = 200  # the client chose the path, and sent it without a token outside /v1/


def logged_path(path: str) -> str:
    """Pure: a request's path as a log line names it, cut to LOGGED_PATH_MAX characters (kv
    escapes what could end or rewrite the line)."""
    return path if len(path) <= LOGGED_PATH_MAX else f"{path[:LOGGED_PATH_MAX]}...({len(path)} chars)"


def body_limit(method: str, path: str, api: ApiSettings) -> int:
    """Pure: the largest request body a route takes, in bytes.

    A skill PUT carries the whole skill as JSON: base64 (4/3) or escaped text (a newline or a
    quote doubles), so twice the skill's cap plus some per file. A tool call carries at most a
    file's content (write_file), bounded like what read_bytes may return. An upload into a
sandbox is the file itself, up to ORCH_UPLOAD_MAX_BYTES. Everything else is
    small (ORCH_HTTP_BODY_MAX_BYTES)."""
    if method == "PUT" and _SKILL_PUT.match(path):
        return 2 * api.skill_upload_max_bytes + 512 * api.skill_upload_max_files + JSON_OVERHEAD
    if method == "PUT" and _UPLOAD.match(path):  # the raw file, streamed to disk
        return api.upload_max_bytes
    if method == "POST" and (_TOOL_CALL.match(path) or _MCP.match(path)):  # an MCP tools/call too
        return api.read_bytes_max + JSON_OVERHEAD
    return api.http_body_max_bytes


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str
    message: str
    details: tuple[tuple[str, Any], ...] = ()

    def body(self) -> bytes:
        return json.dumps({"error": {"code": self.code, "message": self.message, **dict(self.details)}}).encode()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return value.decode("latin-1")
    return None


def declared_length(scope: Scope) -> int | None:
    raw = _header(scope, b"content-length")
    return int(raw) if raw is not None and raw.strip().isdigit() else None


def too_large(limit: int) -> Refusal:
    return Refusal(
        413, "payload_too_large", f"the request body is larger than this route takes ({limit} bytes)", (("limit", limit),)
    )


class BodyTimeout(Exception):
    pass


class StreamedBodyTooLarge(OrchestratorError):
    """A streamed body went past its cap: raised into the route reading it, which the app's
    error mapping answers like any refusal (413)."""

    status_code = 413
    code = "payload_too_large"


class StreamedBodyTimeout(OrchestratorError):
    status_code = 408
    code = "request_timeout"


def streams_body(method: str, path: str) -> bool:
    """Pure: whether the route reads its body itself, as it arrives (an upload into a sandbox)."""
    return method == "PUT" and _UPLOAD.match(path) is not None


class RequestGuard:
    def __init__(self, app: ASGIApp, *, settings: ApiSettings, authorized: Callable[[str | None], bool]) -> None:
        self.app = app
        self.settings = settings
        self.authorized = authorized  # the Authorization header's value -> a valid bot or admin token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path.startswith(PROTECTED_PREFIX) and not self.authorized(_header(scope, b"authorization")):
            await self._refuse(send, Refusal(401, "unauthorized", "missing or wrong bearer token"))
            return
        length = declared_length(scope)
        if length is None and _header(scope, b"transfer-encoding") is None:
            await self.app(scope, receive, send)  # no body at all (GET, HEAD, ...)
            return
        limit = body_limit(scope["method"], path, self.settings)
        if length is not None and length > limit:
            await self._refuse(send, too_large(limit))
            return
        if streams_body(scope["method"], path):
            await self._stream(scope, receive, send, limit, path)
            return
        try:
            body = await self._read_body(receive, limit)
        except BodyTimeout as exc:
            log.warning("request body timed out %s", kv(path=logged_path(path), reason=str(exc)))
            await self._refuse(send, self._timeout_refusal(exc))
            return
        if body is None:
            await self._refuse(send, too_large(limit))
            return
        if isinstance(body, dict):  # the client went away while sending
            return
        await self.app(scope, replay_body(body, receive), send)

    async def _stream(self, scope: Scope, receive: Receive, send: Send, limit: int, path: str) -> None:
        """An upload: the app reads the body as it arrives (to disk, not to memory), under the
        same cap, stall and time bounds; a breach the app has not answered yet is our 413/408."""
        deadline = time.monotonic() + self.settings.http_body_timeout_s
        total = 0
        started = False

        async def bounded_receive() -> Message:
            nonlocal total
            try:
                message = await self._next_message(receive, deadline)
            except BodyTimeout as exc:
                log.warning("request body timed out %s", kv(path=logged_path(path), reason=str(exc)))
                raise StreamedBodyTimeout(f"the request body {exc}") from None
            total += len(message.get("body", b""))
            if total > limit:
                raise StreamedBodyTooLarge(f"the request body is larger than this route takes ({limit} bytes)")
            return message

        async def noting_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded_receive, noting_send)
        except (StreamedBodyTooLarge, StreamedBodyTimeout) as exc:
            if started:  # answered by the app's error mapping (the usual case)
                return
            await self._refuse(send, Refusal(exc.status_code, exc.code, str(exc)))

    def _timeout_refusal(self, exc: BodyTimeout) -> Refusal:
        timeout = (("timeout_s", self.settings.http_body_timeout_s), ("stall_s", self.settings.http_body_stall_s))
        return Refusal(408, "request_timeout", f"the request body {exc}", timeout)

    async def _next_message(self, receive: Receive, deadline: float) -> Message:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BodyTimeout(f"did not arrive within {self.settings.http_body_timeout_s:g} s")
        wait = min(left, self.settings.http_body_stall_s)
        try:
            async with asyncio.timeout(wait):  # no extra task, unlike wait_for (hot path)
                return await receive()
        except TimeoutError:
            if wait < self.settings.http_body_stall_s:
                raise BodyTimeout(f"did not arrive within {self.settings.http_body_timeout_s:g} s") from None
            raise BodyTimeout(f"stalled for {self.settings.http_body_stall_s:g} s") from None

    async def _read_body(self, receive: Receive, limit: int) -> bytes | dict | None:
        """The whole body; None above `limit`; the disconnect message when the client left."""
        chunks: list[bytes] = []
        total = 0
        deadline = time.monotonic() + self.settings.http_body_timeout_s
        while True:
            message = await self._next_message(receive, deadline)
            if message["type"] == "http.disconnect":
                return dict(message)
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
                return None
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    async def _refuse(send: Send, refusal: Refusal) -> None:
        body = refusal.body()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # the rest of the body is never read
        ]
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def replay_body(body: bytes, receive: Receive) -> Receive:
    """The body already read, then the real channel (a disconnect the app may wait for)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
