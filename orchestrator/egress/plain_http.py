"""A plain-HTTP proxy request (`GET http://host/...`), one per connection: the request as the
upstream sees it, and the exchange that forwards exactly that request and its answer.

One request per connection is what keeps the allow list meaningful for plain HTTP: the
checked target is the absolute URL's authority, so the Host header must name the same host
and port (a virtual-hosting upstream routes by Host), and nothing the client sends after the
first request's body ever reaches the upstream (a pipelined second request could name any
Host). For the same reason the head must be one the upstream reads
exactly as checked here: no bare CR, LF or NUL in a header line, no folded header line, no
space or control character in the request target, a method that is a token and the version
exactly HTTP/1.0 or HTTP/1.1 (each could hide a second Host). Deciding is pure
(`plan_plain_request`); `exchange` is the thin part with sockets.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.egress.policy import InvalidTarget, parse_http_authority
from orchestrator.request_head import smuggles
from sandbox_agent.relay import RelayIdle

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a method (RFC 9110's token)
HOP_BY_HOP = frozenset({b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive"})
CHUNK = 1 << 16
LINGER_S = 2.0  # after the answer: how long unread client bytes are drained before the close


_STATUS_TEXT = {400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed", 411: "Length Required", 429: "Too Many Requests",
                431: "Request Header Fields Too Large", 502: "Bad Gateway", 503: "Service Unavailable",
                504: "Gateway Timeout"}  # fmt: skip


def refusal_response(status: int, code: str, message: str) -> bytes:
    """The proxy's own answer: a plain-text message a model can act on, and the code."""
    body = (message + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {_STATUS_TEXT.get(status, 'Error')}\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        f"X-Egress-Refusal: {code}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class PlainRequestRefused(Exception):
    """A plain request the proxy does not forward; `code` is the audit reason."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass(frozen=True)
class PlainRequest:
    head: bytes  # origin-form request head, proxy headers dropped, `Connection: close`
    body_length: int  # bytes of body that follow the head (Content-Length; 0 without one)


def _header(line: bytes) -> tuple[bytes, bytes]:
    name, _, value = line.partition(b":")
    return name.strip().lower(), value.strip()


def plan_plain_request(
    method: str, version: str, header_lines: Sequence[bytes], host: str, port: int, path: str, *, default_port: int = 80
) -> PlainRequest:
    """The one request to send for `METHOD http://host:port/path`, or PlainRequestRefused.
    `default_port`: the port a Host header without one names (443 inside TLS)."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if version not in ("HTTP/1.0", "HTTP/1.1") or not _TOKEN.fullmatch(method):
        raise PlainRequestRefused(400, "bad_target", "Bad proxy request: the method or the HTTP version is not one.")
    if any(c <= " " or c == "\x7f" for c in path):
        raise PlainRequestRefused(400, "bad_target", "Bad proxy request: the request target holds a space or a control character.")
    for line in header_lines:
        if smuggles(line):  # an upstream ending a line at a bare LF would see another Host
            raise PlainRequestRefused(
                400, "bad_header", "A header line holds a bare CR, LF or NUL, or continues the previous one (obs-fold)."
            )
    headers = [_header(line) for line in header_lines]
    hosts = [value for name, value in headers if name == b"host"]
    if len(hosts) > 1:
        raise PlainRequestRefused(400, "host_mismatch", "The request has more than one Host header.")
    if hosts:
        shown = hosts[0].decode("ascii", errors="replace")[:80]
        try:
            named = parse_http_authority(shown, default_port)
        except InvalidTarget:
            named = None
        if named != (host, port):
            raise PlainRequestRefused(
                400, "host_mismatch", f"Bad proxy request: the Host header ({shown}) does not name the request's target ({target})."
            )
    if any(name == b"transfer-encoding" for name, _ in headers):
        raise PlainRequestRefused(
            411, "transfer_encoding", "A plain-HTTP request body must come with a Content-Length (Transfer-Encoding is not forwarded)."
        )
    lengths = {value for name, value in headers if name == b"content-length"}
    if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
        raise PlainRequestRefused(400, "bad_content_length", "The request's Content-Length is not one number.")
    body_length = int(next(iter(lengths))) if lengths else 0
    kept = [line for line, (name, _) in zip(header_lines, headers) if name not in HOP_BY_HOP]
    if not hosts:
        kept.append(f"Host: {target}".encode())
    head = b"\r\n".join([f"{method} {path} {version}".encode(), *kept, b"Connection: close", b"", b""])
    return PlainRequest(head, body_length)


OnBytes = Callable[[int, bool], None]  # (n, upstream) -> None; raising stops the exchange


async def exchange(
    conn: socket.socket, upstream: socket.socket, request: PlainRequest, already: bytes, *, on_bytes: OnBytes, idle_s: float
) -> BaseException | None:
    """Send the request head and exactly its body (the first of it in `already`), relay the
    answer until the upstream ends it, then drain and drop whatever else the client sent.
    Returns what stopped it early (RelayIdle, an OSError, whatever `on_bytes` raised)."""
    loop = asyncio.get_running_loop()

    async def receive(sock: socket.socket, n: int) -> bytes:
        try:
            return await asyncio.wait_for(loop.sock_recv(sock, n), idle_s)
        except asyncio.TimeoutError:
            raise RelayIdle(f"nothing moved for {idle_s:g} s") from None

    async def send_request() -> None:
        first = request.head + already[: request.body_length]
        on_bytes(len(first), True)
        await loop.sock_sendall(upstream, first)
        left = request.body_length - min(len(already), request.body_length)
        while left > 0:
            chunk = await receive(conn, min(CHUNK, left))
            if not chunk:
                return
            on_bytes(len(chunk), True)
            await loop.sock_sendall(upstream, chunk)
            left -= len(chunk)

    async def relay_answer() -> None:
        while chunk := await receive(upstream, CHUNK):
            on_bytes(len(chunk), False)
            await loop.sock_sendall(conn, chunk)

    sending = asyncio.ensure_future(send_request())
    answering = asyncio.ensure_future(relay_answer())  # alongside: `Expect: 100-continue`
    try:
        pending: set[asyncio.Future[None]] = {sending, answering}
        while answering in pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    return task.exception()
    finally:
        for task in (sending, answering):
            task.cancel()
        await asyncio.gather(sending, answering, return_exceptions=True)
    await _linger(conn)
    return None


async def _linger(conn: socket.socket) -> None:
    """Closing with unread bytes sends a reset, which can destroy the answer in the client's
    buffer: end our side, then read and drop until the client closes (bounded)."""
    loop = asyncio.get_running_loop()
    try:
        conn.shutdown(socket.SHUT_WR)
        async with asyncio.timeout(LINGER_S):
            while await loop.sock_recv(conn, CHUNK):
                pass
    except (OSError, asyncio.TimeoutError):
        pass
