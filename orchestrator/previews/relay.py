"""The preview listener's connections (docs/previews.md): read a visitor's request head within
its deadline, find the preview its token names, take the user's share of descriptors and
bytes, open a stream to the port through the sandbox's agent (`AsyncAgentClient.open_port`:
the sandbox keeps no network) and relay raw bytes both ways, zero-copy, until the app's side
ends or the visitor hangs up (one that only half-closes its side gets no answer). One request
per connection (`Connection: close` upstream), or one WebSocket for as long as it lives: so
nothing here parses a response beyond its head (read to scope the app's cookies to the
preview), and chunked, streamed and large bodies pass as they come, never held whole.

Runs on the preview service's own event loop, never the API's."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from orchestrator.call_ledger import SandboxPaused, on_sandbox
from orchestrator.descriptors.budget import PREVIEW_COST, DescriptorBudget, DescriptorsRefused, Feature
from orchestrator.errors import ToolError
from orchestrator.previews.access import AccessCookie
from orchestrator.previews.model import (
    BadHead,
    PreviewRecord,
    app_cookie_prefix,
    RequestHead,
    parse_head,
    plain_answer,
    referred_token,
    host_token,
    interim_status,
    scoped_response_head,
    split_target,
    upstream_head,
    utc_day,
)
from orchestrator.sandboxes.base import LiveAgent
from sandbox_agent.errors import AgentToolError, AgentUnavailable
from sandbox_agent.relay import RelayIdle, relay

log = logging.getLogger(__name__)

HEAD_MAX_BYTES = 16 * 1024
RESPONSE_HEAD_MAX_BYTES = 64 * 1024  # an app's answer head, cookies and all
PENDING_HEADS_MAX = 512  # visitors' connections whose head has not arrived yet, all users together
OPEN_PORT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 5.0  # to write one of our own short answers to a visitor
NOT_LISTENING_RETRY_S = 2
UNAVAILABLE_RETRY_S = 5


@dataclass
class PreviewLimits:
    head_timeout_s: float
    idle_timeout_s: float
    bytes_per_day: int
    scheme: str
    host_suffix: str | None = None  # host mode: previews are `<token><suffix>` (model.host_suffix)
    access: AccessCookie | None = None  # previews need the signed cookie their link mints (access.py)


@dataclass
class ConnectionRecord:
    """One visitor connection as the audit and /metrics keep it."""

    user_id: int | None
    preview_id: str | None
    port: int | None
    outcome: str
    bytes_up: int = 0  # visitor to app
    bytes_down: int = 0
    opened_at: float = field(default_factory=time.time)
    duration_s: float = 0.0


class _OverDaily(Exception):
    pass


class PreviewRelay:
    def __init__(
        self,
        *,
        lookup: Callable[[str], PreviewRecord | None],
        agent_for: Callable[[int], Awaitable[LiveAgent]],
        forget: Callable[[int, LiveAgent], None],
        descriptors: DescriptorBudget,
        limits: PreviewLimits,
        report: Callable[[ConnectionRecord], None],
    ) -> None:
        self._lookup = lookup
        self._agent_for = agent_for
        self._forget = forget
        self._descriptors = descriptors
        self.limits = limits
        self._report = report
        self._pending = 0
        self._day = ""  # the UTC day `_day_bytes` counts (the loop's alone)
        self._day_bytes: dict[int, int] = {}
        self._open: dict[str, set[asyncio.Task[Any]]] = {}  # preview id -> its relays

    async def serve(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        running: set[asyncio.Task[None]] = set()
        listening.setblocking(False)
        while True:
            try:
                conn, address = await loop.sock_accept(listening)
            except OSError as exc:  # out of descriptors: back off instead of spinning
                log.warning("preview accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            if self._pending >= PENDING_HEADS_MAX:
                conn.close()
                continue
            task = asyncio.ensure_future(self._handle(conn, address[0] if isinstance(address, tuple) else "unknown"))
            running.add(task)
            task.add_done_callback(running.discard)

    def cut(self, preview_id: str) -> None:
        """End the open connections of a revoked preview (on the loop)."""
        for task in list(self._open.get(preview_id, ())):
            task.cancel()

    def bytes_today(self, user_id: int) -> int:
        return self._count_bytes(user_id, 0)

    def _count_bytes(self, user_id: int, n: int) -> int:
        """Add `n` to the user's bytes of today (a new UTC day starts every count afresh)."""
        today = utc_day(datetime.now(timezone.utc))
        if today != self._day:
            self._day, self._day_bytes = today, {}
        total = self._day_bytes[user_id] = self._day_bytes.get(user_id, 0) + n
        return total

    async def _answer(self, conn: socket.socket, data: bytes) -> None:
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                await asyncio.get_running_loop().sock_sendall(conn, data)
        except (OSError, TimeoutError):
            pass

    async def _read_head(self, conn: socket.socket) -> tuple[bytes, bytes] | None:
        loop = asyncio.get_running_loop()
        buffer = b""
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > HEAD_MAX_BYTES:
                await self._answer(conn, plain_answer(431, "Request Header Fields Too Large", "The request head is too large."))
                return None
            piece = await loop.sock_recv(conn, 8192)
            if not piece:
                return None
            buffer += piece
        return buffer[:end], buffer[end + 4 :]

    async def _handle(self, conn: socket.socket, visitor_ip: str) -> None:
        conn.setblocking(False)
        record = ConnectionRecord(None, None, None, "bad_request")
        started = time.monotonic()
        try:
            self._pending += 1
            try:
                async with asyncio.timeout(self.limits.head_timeout_s):
                    got = await self._read_head(conn)
            except TimeoutError:
                record.outcome = "head_timeout"
                await self._answer(conn, plain_answer(408, "Request Timeout", "The request head did not arrive in time."))
                return
            finally:
                self._pending -= 1
            if got is None:
                return
            await self._route(conn, visitor_ip, got[0], got[1], record)
        except OSError:
            record.outcome = "visitor_gone"
        except asyncio.CancelledError:  # the preview was revoked (`cut`)
            record.outcome = "revoked"
        except Exception:
            record.outcome = "internal_error"
            log.exception("preview connection failed")
        finally:
            conn.close()
            if record.preview_id is not None:
                record.duration_s = round(time.monotonic() - started, 3)
                self._report(record)

    async def _route(self, conn: socket.socket, visitor_ip: str, raw: bytes, rest: bytes, record: ConnectionRecord) -> None:
        try:
            head = parse_head(raw)
        except BadHead as exc:
            await self._answer(conn, plain_answer(400, "Bad Request", str(exc)))
            return
        if self.limits.host_suffix is not None:  # host mode: the Host names it, the path is the app's
            if not head.target.startswith("/"):
                await self._answer(conn, plain_answer(400, "Bad Request", "The request target must be a path."))
                return
            token, path = host_token(head.header("host"), self.limits.host_suffix), head.target
            prefix = ""
        elif (named := split_target(head.target)) is not None:
            token, path = named
            prefix = f"/{token}"
        else:  # a root-relative URL of a preview page: its Referer names it
            token, path = referred_token(head.header("referer")), head.target
            prefix = f"/{token}"
        preview = self._lookup(token) if token is not None else None
        if preview is None or not preview.live(datetime.now(timezone.utc)):
            record.outcome = "not_found"
            await self._answer(conn, plain_answer(404, "Not Found", "No such preview (the link is wrong, revoked or expired)."))
            return
        record.user_id, record.preview_id, record.port = preview.user_id, preview.preview_id, preview.port
        if not path.startswith("/"):  # `/{token}`: relative links need the trailing slash
            record.outcome = "redirect"
            location = {"Location": f"/{preview.token}/{path}"}
            await self._answer(conn, plain_answer(308, "Permanent Redirect", "The preview is under its own path.", extra=location))
            return
        if self.limits.access is not None:
            admission, path = self.limits.access.admit(preview, head, path, prefix, datetime.now(timezone.utc))
            if admission.status == 303:
                record.outcome = "cookie_minted"
                minted = {"Location": admission.location, "Set-Cookie": admission.set_cookie}
                await self._answer(conn, plain_answer(303, "See Other", "Opened: the preview follows.", extra=minted))
                return
            if not admission.allowed:
                record.outcome = "no_access_cookie"
                await self._answer(conn, plain_answer(403, "Forbidden", admission.message))
                return
        if self.bytes_today(preview.user_id) >= self.limits.bytes_per_day:
            record.outcome = "daily_bytes"
            await self._answer(conn, plain_answer(429, "Too Many Requests", "This user's previews moved all the bytes they may today (UTC).",
                                                  extra={"Retry-After": "3600"}))  # fmt: skip
            return
        try:
            hold = self._descriptors.try_acquire(preview.user_id, Feature.PREVIEWS, PREVIEW_COST)
        except DescriptorsRefused as refusal:
            record.outcome = refusal.code
            status, reason = (429, "Too Many Requests") if refusal.status_code == 429 else (503, "Service Unavailable")
            await self._answer(conn, plain_answer(status, reason, f"{refusal.code}: {refusal}", extra={"Retry-After": "1"}))
            return
        task = asyncio.current_task()
        assert task is not None
        self._open.setdefault(preview.preview_id, set()).add(task)
        try:
            await self._through_agent(conn, visitor_ip, head, path, prefix, rest, preview, record)
        finally:
            hold.release()
            tasks = self._open.get(preview.preview_id)
            if tasks is not None:
                tasks.discard(task)
                if not tasks:
                    del self._open[preview.preview_id]

    async def _through_agent(self, conn: socket.socket, visitor_ip: str, head: RequestHead, path: str, prefix: str,
                             rest: bytes, preview: PreviewRecord, record: ConnectionRecord) -> None:  # fmt: skip
        for attempt in range(2):
            agent: LiveAgent | None = None
            try:
                agent = await self._agent_for(preview.user_id)
                with on_sandbox(agent.count):  # the reaper neither pauses nor stops it meanwhile
                    upstream, already = await agent.calls.open_port(preview.port, timeout_s=OPEN_PORT_TIMEOUT_S)
                    try:
                        await self._relay(conn, upstream, already, visitor_ip, head, path, prefix, rest, preview, record)
                    finally:
                        upstream.close()
                return
            except SandboxPaused:
                continue  # frozen just as it was handed out: the next attempt resumes it
            except AgentToolError as exc:
                if exc.code != "port_not_listening":
                    raise
                record.outcome = "port_not_listening"
                message = f"Nothing in the sandbox listens on port {preview.port} yet. Retry shortly."
                await self._answer(conn, plain_answer(503, "Service Unavailable", message, extra={"Retry-After": str(NOT_LISTENING_RETRY_S)}))
                return
            except (AgentUnavailable, ToolError) as exc:
                if isinstance(exc, AgentUnavailable) and not exc.delivered and agent is not None and attempt == 0:
                    self._forget(preview.user_id, agent)  # gone: never handed out again, the next is started
                    continue
                record.outcome = "sandbox_unavailable"
                log.info("preview sandbox unavailable user=%s error=%s", preview.user_id, exc)
                await self._answer(conn, plain_answer(503, "Service Unavailable", "The sandbox is not available yet. Retry shortly.",
                                                      extra={"Retry-After": str(UNAVAILABLE_RETRY_S)}))  # fmt: skip
                return
        record.outcome = "sandbox_unavailable"  # paused again at once, or replaced twice
        await self._answer(conn, plain_answer(503, "Service Unavailable", "The sandbox is not available yet. Retry shortly.",
                                              extra={"Retry-After": str(UNAVAILABLE_RETRY_S)}))  # fmt: skip

    async def _relay(self, conn: socket.socket, upstream: socket.socket, already: bytes, visitor_ip: str,
                     head: RequestHead, path: str, prefix: str, rest: bytes, preview: PreviewRecord, record: ConnectionRecord) -> None:  # fmt: skip
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(upstream, upstream_head(
            head, path, port=preview.port, visitor_ip=visitor_ip, public_host=head.header("host"),
            scheme=self.limits.scheme, prefix=prefix, cookie_prefix=app_cookie_prefix(preview.token),
        ) + rest)  # fmt: skip
        record.bytes_up += len(rest)
        self._count_bytes(preview.user_id, len(rest))
        answered = await self._answer_head(conn, upstream, already, prefix, preview, record)
        if answered is None:
            return
        limit = self.limits.bytes_per_day

        def counted(n: int, from_visitor: bool) -> None:
            if from_visitor:
                record.bytes_up += n
            else:
                record.bytes_down += n
            if self._count_bytes(preview.user_id, n) > limit:
                raise _OverDaily()

        record.outcome = "relayed"
        if answered:
            await loop.sock_sendall(conn, answered)
            self._count_bytes(preview.user_id, len(answered))
        error = await relay(conn, upstream, on_bytes=counted, idle_s=self.limits.idle_timeout_s, until_one_ends=True)
        if isinstance(error, _OverDaily):
            record.outcome = "daily_bytes"
        elif error is not None:
            record.outcome = "idle" if isinstance(error, RelayIdle) else "cut"

    async def _answer_head(self, conn: socket.socket, upstream: socket.socket, already: bytes, prefix: str,
                           preview: PreviewRecord, record: ConnectionRecord) -> bytes | None:  # fmt: skip
        """Read the app's response head (and any interim 1xx heads before it) while the visitor's
        bytes keep flowing to the app (a body the app reads before it answers), send each head on
        with its cookies scoped to the preview (`scoped_response_head`), and return what the app
        sent after the last head (relayed as it is with the rest). None when either side ended
        or went quiet first, or the head is too large (502)."""
        loop = asyncio.get_running_loop()
        buffer = bytearray(already)
        record.bytes_down += len(already)
        searched = 0  # the buffer holds no head's end before this offset
        while True:
            while (end := buffer.find(b"\r\n\r\n", max(searched - 3, 0))) < 0:
                searched = len(buffer)
                if len(buffer) > RESPONSE_HEAD_MAX_BYTES:
                    record.outcome = "bad_response"
                    await self._answer(conn, plain_answer(502, "Bad Gateway", "The app's response head is too large."))
                    return None
                try:
                    async with asyncio.timeout(self.limits.idle_timeout_s):
                        readable = await _first_readable(loop, conn, upstream)
                        piece = await loop.sock_recv(readable, 65536)
                        if piece and readable is conn:
                            await loop.sock_sendall(upstream, piece)
                except TimeoutError:
                    record.outcome = "idle"
                    return None
                if not piece:
                    record.outcome = "cut"
                    return None
                if readable is conn:
                    record.bytes_up += len(piece)
                    self._count_bytes(preview.user_id, len(piece))
                else:
                    record.bytes_down += len(piece)
                    buffer += piece
            scoped = scoped_response_head(bytes(buffer[:end]), prefix, app_cookie_prefix(preview.token))
            if scoped is None:
                record.outcome = "bad_response"
                message = "The app's response head is malformed (a bare CR or LF, or a folded line)."
                await self._answer(conn, plain_answer(502, "Bad Gateway", message))
                return None
            head, buffer, searched = scoped + b"\r\n\r\n", buffer[end + 4 :], 0
            await loop.sock_sendall(conn, head)
            self._count_bytes(preview.user_id, len(head))
            if not interim_status(head):
                return bytes(buffer)


async def _first_readable(loop: asyncio.AbstractEventLoop, *socks: socket.socket) -> socket.socket:
    """The first of `socks` with bytes (or an end) to read."""
    ready: asyncio.Future[socket.socket] = loop.create_future()
    for sock in socks:
        loop.add_reader(sock.fileno(), lambda s=sock: ready.done() or ready.set_result(s))
    try:
        return await ready
    finally:
        for sock in socks:
            loop.remove_reader(sock.fileno())
