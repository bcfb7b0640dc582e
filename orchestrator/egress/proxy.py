"""One egress connection, start to end (asyncio): read the bounded request head, decide with
the pure policy, resolve, decide again on the addresses, connect to the very address that was
checked, relay (CONNECT tunnel or one plain-HTTP request), and report the outcome.

The runtime user is the listener's, never anything the sandbox sends. No TLS is terminated:
a CONNECT tunnel carries the client's own TLS session to the upstream.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from orchestrator.log import kv
from orchestrator.egress.caps import CapExceeded, ConnectionMeter, UserCaps
from orchestrator.egress.policy import (
    Decision,
    HostPattern,
    InvalidTarget,
    IpAddress,
    Verdict,
    decide_addresses,
    decide_host,
    literal_address,
    parse_absolute_url,
    parse_authority,
    refusal_message,
)

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
HOP_BY_HOP = frozenset({b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive"})

Resolver = Callable[[str, int], Awaitable[Sequence[IpAddress]]]


@dataclass(frozen=True)
class ProxyTimeouts:
    head_s: float = 10.0
    resolve_s: float = 10.0
    connect_s: float = 10.0
    idle_s: float = 300.0  # a tunnel with no byte either way for this long is closed


@dataclass(frozen=True)
class ConnectionRecord:
    """What the audit row and the log line say about one connection."""

    user_id: int
    session_id: str | None
    run_id: str | None
    method: str
    host: str
    port: int
    address: str | None
    verdict: str  # allowed | host_not_allowed | address_forbidden | cap | bad_request | upstream_failed | cut
    reason: str
    bytes_up: int
    bytes_down: int
    duration_ms: int


async def system_resolver(host: str, port: int) -> Sequence[IpAddress]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[IpAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0])
        if address not in seen:
            seen.append(address)
    return seen


class _Refused(Exception):
    def __init__(self, status: int, verdict: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.verdict, self.reason, self.message = status, verdict, reason, message


_STATUS_TEXT = {400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
                502: "Bad Gateway", 504: "Gateway Timeout"}  # fmt: skip


def refusal_response(status: int, code: str, message: str) -> bytes:
    body = (message + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {_STATUS_TEXT.get(status, 'Error')}\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        f"X-Egress-Refusal: {code}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    version: str
    header_lines: tuple[bytes, ...]


def parse_head(raw: bytes) -> RequestHead:
    lines = raw[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise InvalidTarget("not an HTTP/1.x request line")
    try:
        method, target, version = (p.decode("ascii") for p in parts)
    except UnicodeDecodeError:
        raise InvalidTarget("the request line is not ASCII") from None
    return RequestHead(method.upper(), target, version, tuple(lines[1:]))


def origin_request(head: RequestHead, path: str) -> bytes:
    """The plain-HTTP request as the upstream should see it: origin-form, no proxy headers,
    one request per connection (so a second request cannot ride to another host)."""
    kept = [line for line in head.header_lines if line.split(b":", 1)[0].strip().lower() not in HOP_BY_HOP]
    return b"\r\n".join([f"{head.method} {path} {head.version}".encode(), *kept, b"Connection: close", b"", b""])


class EgressProxy:
    def __init__(
        self,
        *,
        allow_for: Callable[[int], Sequence[HostPattern]],
        caps_for: Callable[[int], UserCaps],
        report: Callable[[ConnectionRecord], None],
        allow_loopback: bool,
        timeouts: ProxyTimeouts = ProxyTimeouts(),
        resolver: Resolver = system_resolver,
    ) -> None:
        self._allow_for = allow_for
        self._caps_for = caps_for
        self._report = report
        self._allow_loopback = allow_loopback
        self._timeouts = timeouts
        self._resolver = resolver

    async def handle(
        self,
        user_id: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        context: tuple[str | None, str | None] = (None, None),
    ) -> None:
        started = time.monotonic()
        method, host, port, address = "?", "", 0, None
        verdict, reason = "allowed", "ok"
        caps = self._caps_for(user_id)
        meter = ConnectionMeter(caps)
        admitted = False
        upstream: asyncio.StreamWriter | None = None
        try:
            try:
                raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._timeouts.head_s)
            except (asyncio.LimitOverrunError, ValueError):
                raise _Refused(431, "bad_request", "head_too_large", "The request head is too large.") from None
            except (asyncio.IncompleteReadError, asyncio.TimeoutError):
                raise _Refused(400, "bad_request", "no_head", "No complete request head arrived.") from None
            try:
                head = parse_head(raw)
                method = head.method
                if method == "CONNECT":
                    host, port = parse_authority(head.target)
                    path = ""
                else:
                    host, port, path = parse_absolute_url(head.target)
            except InvalidTarget as exc:
                raise _Refused(400, "bad_request", "bad_target", f"Bad proxy request: {exc}.") from None
            allow = self._allow_for(user_id)
            decision = decide_host(host, port, allow)
            if not decision.allowed:
                raise _Refused(403, decision.verdict.value, decision.reason, refusal_message(host, port, user_id, allow, decision))
            try:
                caps.admit()
            except CapExceeded as exc:
                raise _Refused(429, "cap", exc.code, f"Egress to {host}:{port} refused: {exc}.") from None
            admitted = True
            addresses = await self._resolve(host, port)
            usable, decision = decide_addresses(addresses, allow_loopback=self._allow_loopback)
            if not decision.allowed:
                raise _Refused(403, decision.verdict.value, decision.reason, refusal_message(host, port, user_id, allow, decision))
            up_reader, upstream, address = await self._connect(host, port, usable)
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                request = origin_request(head, path)
                meter.charge(len(request), upstream=True)
                upstream.write(request)
            await self._relay(reader, writer, up_reader, upstream, meter)
            if meter.cut is not None:
                verdict, reason = "cut", meter.cut.code
                log.warning("egress connection cut %s", kv(user=user_id, host=host, code=meter.cut.code, why=str(meter.cut)))
        except _Refused as refusal:
            verdict, reason = refusal.verdict, refusal.reason
            try:
                writer.write(refusal_response(refusal.status, refusal.reason, refusal.message))
                await asyncio.wait_for(writer.drain(), 5)
            except (OSError, asyncio.TimeoutError):
                pass
        except (OSError, asyncio.TimeoutError) as exc:
            verdict, reason = "upstream_failed", type(exc).__name__
        finally:
            if admitted:
                caps.release()
            for w in (writer, upstream):
                if w is not None:
                    w.close()
            session_id, run_id = context
            self._report(
                ConnectionRecord(
                    user_id=user_id, session_id=session_id, run_id=run_id, method=method, host=host, port=port,
                    address=address, verdict=verdict, reason=reason, bytes_up=meter.up, bytes_down=meter.down,
                    duration_ms=int((time.monotonic() - started) * 1000),
                )
            )  # fmt: skip

    async def _resolve(self, host: str, port: int) -> Sequence[IpAddress]:
        literal = literal_address(host)
        if literal is not None:
            return [literal]
        try:
            found = await asyncio.wait_for(self._resolver(host, port), self._timeouts.resolve_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise _Refused(502, "upstream_failed", "dns", f"Egress to {host}:{port}: the name does not resolve ({exc}).") from None
        if not found:
            raise _Refused(502, "upstream_failed", "dns", f"Egress to {host}:{port}: the name has no address.")
        return found

    async def _connect(
        self, host: str, port: int, usable: Sequence[IpAddress]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str]:
        last: Exception | None = None
        for address in usable:
            try:
                # The checked address itself, never the name again: no second lookup to rebind.
                r, w = await asyncio.wait_for(
                    asyncio.open_connection(str(address), port, limit=CHUNK), self._timeouts.connect_s
                )
                return r, w, str(address)
            except (OSError, asyncio.TimeoutError) as exc:
                last = exc
        raise _Refused(502, "upstream_failed", "connect", f"Egress to {host}:{port}: the upstream did not accept a connection ({last}).")

    async def _relay(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
        meter: ConnectionMeter,
    ) -> None:
        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, upstream: bool) -> None:
            try:
                while True:
                    data = await asyncio.wait_for(src.read(CHUNK), self._timeouts.idle_s)
                    if not data:
                        break
                    meter.charge(len(data), upstream=upstream)
                    dst.write(data)
                    await dst.drain()
            except CapExceeded:
                return
            except (OSError, asyncio.TimeoutError):
                return
            finally:
                if meter.cut is None and dst.can_write_eof():
                    try:
                        dst.write_eof()  # half-close: the other direction may still be talking
                    except OSError:
                        pass

        tasks = [asyncio.create_task(pump(client_r, up_w, True)), asyncio.create_task(pump(up_r, client_w, False))]
        try:
            while tasks:
                done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                tasks = list(pending)
                if meter.cut is not None:
                    for t in tasks:
                        t.cancel()
                    break
        finally:
            for t in tasks:
                t.cancel()


__all__ = ["ConnectionRecord", "Decision", "EgressProxy", "ProxyTimeouts", "Verdict", "refusal_response"]
