"""A stream to a port the sandbox listens on, for the orchestrator's preview relay
(docs/previews.md): the sandbox has no network, so the agent opens the connection to
127.0.0.1:{port} from inside and relays raw bytes between it and the orchestrator.

The request is plain HTTP `CONNECT` on the agent's own socket (the Unix socket, or the pod's
loopback port behind a port-forward), with the agent token:

    CONNECT 127.0.0.1:8000 HTTP/1.1
    Authorization: Bearer <token>

answered `200 Connection established` and then bytes both ways (sandbox_agent/relay.py), or
401 (token), 400 (not a port we tunnel to), 503 with `{"error": {"code": "port_not_listening"}}`
when nothing accepts on the port. uvicorn does not tunnel CONNECT, so `TunnelOrHttp` sits in
front of its protocol: a connection whose first bytes are `CONNECT ` is taken over here, any
other is handed to uvicorn untouched.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from sandbox_agent.head_with_body import HeadWithBody
from sandbox_agent.relay import relay

log = logging.getLogger("sandbox_agent.tunnel")

CONNECT = b"CONNECT "
HEAD_MAX_BYTES = 8 * 1024
UNDECIDED_S = 10.0  # a connection that says nothing is closed (uvicorn's own timers start later)
CONNECT_TIMEOUT_S = 5.0
# The orchestrator's relay bounds a preview's idle time; this only frees the agent's side of a
# tunnel whose orchestrator end went away without a word.
TUNNEL_IDLE_S = 900.0


def tunnel_target(head: bytes, forbidden_ports: frozenset[int]) -> tuple[int | None, str | None, str]:
    """Pure: (port, authorization header, problem) of a CONNECT head; port None with the
    problem when it is not a tunnel this agent opens (only 127.0.0.1, never the agent's own
    ports)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    authorization = None
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == "authorization":
            authorization = value.strip()
    if len(parts) != 3 or parts[0] != "CONNECT" or not parts[2].startswith("HTTP/1."):
        return None, authorization, "not a CONNECT request line"
    host, sep, port_text = parts[1].rpartition(":")
    if not sep or host not in ("127.0.0.1", "localhost") or not port_text.isdigit():
        return None, authorization, "the target must be 127.0.0.1:<port>"
    port = int(port_text)
    if not 0 < port < 65536 or port in forbidden_ports:
        return None, authorization, f"port {port} is not one a preview may reach"
    return port, authorization, ""


def _answer(status: int, reason: str, code: str | None = None, message: str = "") -> bytes:
    body = json.dumps({"error": {"code": code, "message": message}}).encode() if code else b""
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    if body:
        head += "Content-Type: application/json\r\n"
    return head.encode("latin-1") + b"\r\n" + body


class PortTunnels:
    """The agent's tunnels: token check, the connect inside the sandbox, the relay. Each open
    tunnel counts as a call in flight (`enter`/`leave`), so the dead-man switch spares it."""

    def __init__(
        self,
        token_ok: Callable[[str | None], bool],
        forbidden_ports: frozenset[int],
        enter: Callable[[], None],
        leave: Callable[[], None],
    ) -> None:
        self._token_ok = token_ok
        self.forbidden_ports = forbidden_ports
        self._enter, self._leave = enter, leave
        self._running: set[asyncio.Task[None]] = set()  # referenced: none is collected mid-way

    def take_over(self, transport: asyncio.Transport, head: bytes, rest: bytes) -> None:
        """Own the connection under `transport` from now on (its socket is duplicated, the
        transport closed without a word to the peer)."""
        transport.pause_reading()
        raw = transport.get_extra_info("socket")
        try:
            conn = socket.socket(fileno=os.dup(raw.fileno()))
        except OSError:
            transport.abort()
            return
        transport.abort()  # closes its own descriptor only: the connection lives on in `conn`
        conn.setblocking(False)
        task = asyncio.ensure_future(self._serve(conn, head, rest))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _serve(self, conn: socket.socket, head: bytes, rest: bytes) -> None:
        loop = asyncio.get_running_loop()
        upstream: socket.socket | None = None
        try:
            port, authorization, problem = tunnel_target(head, self.forbidden_ports)
            if not self._token_ok(authorization):
                await loop.sock_sendall(conn, _answer(401, "Unauthorized", "unauthorized", "missing or wrong agent token"))
                return
            if port is None:
                await loop.sock_sendall(conn, _answer(400, "Bad Request", "invalid_request", problem))
                return
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.setblocking(False)
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await loop.sock_connect(upstream, ("127.0.0.1", port))
            except (OSError, TimeoutError) as exc:
                why = getattr(exc, "strerror", None) or "no answer"
                message = f"nothing accepts connections on 127.0.0.1:{port} in the sandbox ({why})"
                await loop.sock_sendall(conn, _answer(503, "Service Unavailable", "port_not_listening", message))
                return
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_sendall(conn, b"HTTP/1.1 200 Connection established\r\n\r\n")
            if rest:
                await loop.sock_sendall(upstream, rest)
            self._enter()
            try:
                await relay(conn, upstream, idle_s=TUNNEL_IDLE_S)
            finally:
                self._leave()
        except OSError:
            pass
        finally:
            conn.close()
            if upstream is not None:
                upstream.close()


class TunnelOrHttp(asyncio.Protocol):
    """uvicorn's HTTP protocol, unless the connection opens with `CONNECT `: then the
    tunnel's. uvicorn builds it with its usual keyword arguments (`protocol_class`)."""

    def __init__(self, *, inner: type[asyncio.Protocol], tunnels: PortTunnels, **kwargs: Any) -> None:
        self._inner = inner(**kwargs)
        self._tunnels = tunnels
        self._transport: asyncio.Transport | None = None
        self._head = b""
        self._mode: str | None = None  # None until the first bytes tell; "http" or "tunnel"
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(UNDECIDED_S, self._silent)

    def _silent(self) -> None:
        if self._mode is None and self._transport is not None:
            self._mode = "closed"
            self._transport.close()

    def _decided(self, mode: str) -> None:
        self._mode = mode
        if self._timer is not None:
            self._timer.cancel()

    def data_received(self, data: bytes) -> None:
        if self._mode == "http":
            self._inner.data_received(data)
            return
        if self._mode is not None:
            return
        assert self._transport is not None
        self._head += data
        if not (self._head.startswith(CONNECT) or CONNECT.startswith(self._head)):
            self._decided("http")
            # One send per small answer (head_with_body.py).
            self._inner.connection_made(HeadWithBody(self._transport, asyncio.get_running_loop()))  # type: ignore[arg-type]
            head, self._head = self._head, b""
            self._inner.data_received(head)
            return
        end = self._head.find(b"\r\n\r\n")
        if end >= 0:
            self._decided("tunnel")
            head, rest = self._head[:end], self._head[end + 4 :]
            self._head = b""
            self._tunnels.take_over(self._transport, head, rest)
        elif len(self._head) > HEAD_MAX_BYTES:
            self._decided("closed")
            self._transport.write(_answer(431, "Request Header Fields Too Large"))
            self._transport.close()

    def eof_received(self) -> bool | None:
        if self._mode == "http":
            return self._inner.eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._mode == "http":
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._mode == "http":
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._mode == "http":
            self._inner.resume_writing()


def protocol_class(inner: type[asyncio.Protocol], tunnels: PortTunnels) -> Callable[..., asyncio.Protocol]:
    """What to give uvicorn's `Config(http=...)`."""

    def build(**kwargs: Any) -> asyncio.Protocol:
        return TunnelOrHttp(inner=inner, tunnels=tunnels, **kwargs)

    return build
