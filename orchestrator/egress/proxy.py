"""One egress connection, start to end (asyncio): read the bounded request head, decide with
the pure policy, resolve, decide again on the addresses, connect to the very address that was
checked, relay (CONNECT tunnel or one plain-HTTP request), and report the outcome.

The runtime user is the listener's, never anything the sandbox sends. No TLS is terminated:
a CONNECT tunnel carries the client's own TLS session to the upstream.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.log import kv
from orchestrator.descriptors.budget import EGRESS_TUNNEL_EXTRA, DescriptorHold, DescriptorsRefused
from orchestrator.throttled_log import ThrottledLog
from sandbox_agent.relay import RelayIdle, receive_connection, relay
from orchestrator.egress.caps import CapExceeded, ConnectionMeter, LookupGate, UserCaps
from orchestrator.credentials.injection import HOST_MINTS_BURST, HOST_MINTS_PER_S, CredentialInjection
from orchestrator.clock import seconds_until
from orchestrator.credentials.model import Usable
from orchestrator.egress.intercept import serve_intercepted
from orchestrator.egress.plain_http import PlainRequestRefused, exchange, plan_plain_request, refusal_response
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
throttled = ThrottledLog(log)

REFUSED_PAUSE_S = 0.05  # a listener that refused a connection accepts again after this long

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
    credential: str | None = None  # the credential injected (an intercepted connection)
    credential_owner: int | None = None  # whose it is (another user's: through grant_id)
    grant_id: str | None = None


class _Refused(Exception):
    def __init__(self, status: int, verdict: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.verdict, self.reason, self.message = status, verdict, reason, message


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


async def read_head(conn: socket.socket, already: bytes, *, max_bytes: int) -> tuple[bytes, bytes]:
    """The request head (through the blank line) and whatever the client sent after it."""
    loop = asyncio.get_running_loop()
    buffer = already
    while True:
        cut = buffer.find(b"\r\n\r\n")
        if cut >= 0:
            return buffer[: cut + 4], buffer[cut + 4 :]
        if len(buffer) >= max_bytes:
            raise _Refused(431, "bad_request", "head_too_large", "The request head is too large.")
        chunk = await loop.sock_recv(conn, max_bytes - len(buffer))
        if not chunk:
            raise _Refused(400, "bad_request", "no_head", "No complete request head arrived.")
        buffer += chunk


Admit = Callable[[socket.socket], Coroutine[Any, Any, None] | None]


async def serve_unix(listening: socket.socket, admit: Admit) -> None:
    """Accept on a bound, listening Unix socket until cancelled. `admit` answers the work for a
    connection (run as a task of its own, kept referenced here so none is collected while it
    waits), or None after it refused and closed it: then this listener pauses briefly, and
    what the sandbox opens meanwhile waits in the kernel's backlog, not in our descriptors."""
    loop = asyncio.get_running_loop()
    listening.setblocking(False)
    running: set[asyncio.Task[None]] = set()
    try:
        while True:
            try:
                conn, _ = await loop.sock_accept(listening)
            except OSError as exc:  # EMFILE and the like: back off instead of spinning
                throttled.log(logging.WARNING, ("accept", exc.errno), "egress accept failed", error=exc)
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            work = admit(conn)
            if work is None:
                await asyncio.sleep(REFUSED_PAUSE_S)
                continue
            task = asyncio.ensure_future(work)
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        for task in running:
            task.cancel()
        listening.close()


class EgressProxy:
    def __init__(
        self,
        *,
        allow_for: Callable[[int], Sequence[HostPattern]],
        caps_for: Callable[[int], UserCaps],
        report: Callable[[ConnectionRecord], None],
        allow_loopback: bool,
        timeouts: ProxyTimeouts = ProxyTimeouts(),
        resolver: Resolver,
        lookups: LookupGate,
        head_max_bytes: int = 16 * 1024,
        credentials: CredentialInjection | None = None,
    ) -> None:
        self._allow_for = allow_for
        self._caps_for = caps_for
        self._report = report
        self._allow_loopback = allow_loopback
        self._timeouts = timeouts
        self._resolver = resolver
        self._lookups = lookups
        self._head_max = head_max_bytes
        self._credentials = credentials
        self._intercepting: dict[asyncio.Task[Any], Usable] = {}  # the loop's alone
        self._cut_tasks: dict[asyncio.Task[Any], str] = {}  # a task cut, and why (the audit's reason)

    def cut(self, predicate: Callable[[str | None, int, str], bool]) -> None:
        """On the loop: end the intercepted connections whose credential `predicate` matches
        (grant id or None, owner, name): a revoked grant, a deleted or replaced credential."""
        for task, usable in list(self._intercepting.items()):
            grant_id = usable.grant.grant_id if usable.grant is not None else None
            if predicate(grant_id, usable.credential.user_id, usable.credential.name):
                self._cut_task(task, "credential_revoked")

    def _cut_task(self, task: asyncio.Task[Any], reason: str) -> None:
        self._cut_tasks[task] = reason
        task.cancel()

    async def handle(
        self,
        user_id: int,
        unix: socket.socket,
        *,
        context: tuple[str | None, str | None] = (None, None),
        descriptors: DescriptorHold | None = None,
    ) -> None:
        """Serve one connection of `user_id` (the listener's user) and close it: the client the
        forwarder handed over on `unix`, or `unix` itself. `descriptors`: what the connection
        holds of the server's descriptor budget so far; a tunnel takes more before it opens."""
        try:
            conn, already = await asyncio.wait_for(receive_connection(unix), self._timeouts.head_s)
        except (OSError, ValueError, asyncio.TimeoutError) as exc:
            unix.close()
            # A sandbox can open these as fast as it likes: a line per interval, with the count.
            throttled.log(logging.WARNING, ("handoff", user_id), "egress handoff refused", user=user_id,
                          error=exc or type(exc).__name__)  # fmt: skip
            return
        await self._serve(user_id, conn, already, context, descriptors)

    async def _serve(
        self, user_id: int, conn: socket.socket, already: bytes, context: tuple[str | None, str | None],
        descriptors: DescriptorHold | None,
    ) -> None:  # fmt: skip
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        method, host, port, address = "?", "", 0, None
        verdict, reason = "allowed", "ok"
        caps = self._caps_for(user_id)
        meter = ConnectionMeter(caps)
        admitted = False
        upstream: socket.socket | None = None
        injected: Usable | None = None
        try:
            try:
                raw, rest = await asyncio.wait_for(
                    read_head(conn, already, max_bytes=self._head_max), self._timeouts.head_s
                )
            except asyncio.TimeoutError:
                raise _Refused(400, "bad_request", "no_head", "No complete request head arrived in time.") from None
            try:
                head = parse_head(raw)
                method = head.method
                if method == "CONNECT":
                    host, port = parse_authority(head.target)
                    plain = None
                else:
                    host, port, path = parse_absolute_url(head.target)
                    plain = plan_plain_request(head.method, head.version, head.header_lines, host, port, path)
            except InvalidTarget as exc:
                raise _Refused(400, "bad_request", "bad_target", f"Bad proxy request: {exc}.") from None
            except PlainRequestRefused as exc:
                raise _Refused(exc.status, "bad_request", exc.code, str(exc)) from None
            allow = self._allow_for(user_id)
            decision = decide_host(host, port, allow)
            if not decision.allowed:
                raise _Refused(403, decision.verdict.value, decision.reason, refusal_message(host, port, user_id, allow, decision))
            if self._credentials is not None:
                session = self._credentials.session_of(user_id, context[0])
                if method == "CONNECT":
                    injected = self._credentials.choose(host, port, runtime_user_id=user_id, session_id=session)
                    if injected is not None and not self._credentials.admit_host(user_id, host, time.monotonic()):
                        raise _Refused(429, "cap", "host_certificates", (
                            f"Egress to {host}:{port} refused: too many new host certificates for your credentials "
                            f"(at most {HOST_MINTS_BURST} at once, then one every {1 / HOST_MINTS_PER_S:g} s); "
                            "hosts already used are served at once."))  # fmt: skip
                elif self._credentials.is_credential_host(host, runtime_user_id=user_id, session_id=session):
                    raise _Refused(403, "bad_request", "credential_plain_http", (
                        f"Plain http:// to {host}:{port} is refused: a credential is for {host}, and it is never sent "
                        f"in clear. Use https://{host}/ instead."))  # fmt: skip
            try:
                caps.admit()
            except CapExceeded as exc:
                raise _Refused(429, "cap", exc.code, f"Egress to {host}:{port} refused: {exc}.") from None
            admitted = True
            if descriptors is not None:
                try:  # the upstream socket and the relay's pipes
                    descriptors.grow(EGRESS_TUNNEL_EXTRA)
                except DescriptorsRefused as exc:
                    raise _Refused(exc.status_code, "cap", exc.code, f"Egress to {host}:{port} refused: {exc.message}.") from None
            addresses = await self._resolve(user_id, host, port)
            usable, decision = decide_addresses(addresses, allow_loopback=self._allow_loopback)
            if not decision.allowed:
                raise _Refused(403, decision.verdict.value, decision.reason, refusal_message(host, port, user_id, allow, decision))
            upstream, address = await self._connect(host, port, usable)
            on_bytes = lambda n, up: meter.charge(n, upstream=up)  # noqa: E731
            if injected is not None:  # the 200 is the interception's own (intercept.py)
                verdict, reason = await self._intercept(conn, upstream, host, port, injected, rest, on_bytes)
                stopped = None
            elif method == "CONNECT":
                await loop.sock_sendall(conn, b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    meter.charge(len(rest), upstream=True)
                    await loop.sock_sendall(upstream, rest)
                stopped = await relay(conn, upstream, on_bytes=on_bytes, idle_s=self._timeouts.idle_s)
            else:  # one request, one answer: nothing after the request's body reaches the upstream
                assert plain is not None
                stopped = await exchange(conn, upstream, plain, rest, on_bytes=on_bytes, idle_s=self._timeouts.idle_s)
            if meter.cut is not None:
                verdict, reason = "cut", meter.cut.code
                log.warning("egress connection cut %s", kv(user=user_id, host=host, code=meter.cut.code, why=str(meter.cut)))
                if method != "CONNECT" and meter.delivered_down == 0:
                    # Nothing of the answer reached the client yet: it can still read why.
                    # (In a CONNECT tunnel any byte of ours would be taken for TLS.)
                    message = f"Egress to {host}:{port}: {meter.cut}; ask an admin to raise the cap."
                    await asyncio.wait_for(loop.sock_sendall(conn, refusal_response(403, reason, message)), 5)
            elif isinstance(stopped, RelayIdle):
                verdict, reason = "cut", "idle"
        except _Refused as refusal:
            verdict, reason = refusal.verdict, refusal.reason
            try:
                await asyncio.wait_for(
                    loop.sock_sendall(conn, refusal_response(refusal.status, refusal.reason, refusal.message)), 5
                )
            except (OSError, asyncio.TimeoutError):
                pass
        except CapExceeded as exc:  # the first bytes alone passed a cap
            verdict, reason = "cut", exc.code
        except (OSError, asyncio.TimeoutError) as exc:
            verdict, reason = "upstream_failed", type(exc).__name__
        finally:
            if admitted:
                caps.release()
            session_id, run_id = context
            # Reported before the close: whoever sees the close finds the row on its way.
            self._report(
                ConnectionRecord(
                    user_id=user_id, session_id=session_id, run_id=run_id, method=method, host=host, port=port,
                    address=address, verdict=verdict, reason=reason, bytes_up=meter.up, bytes_down=meter.down,
                    duration_ms=int((time.monotonic() - started) * 1000),
                    credential=injected.credential.name if injected else None,
                    credential_owner=injected.credential.user_id if injected else None,
                    grant_id=injected.grant.grant_id if injected and injected.grant else None,
                )
            )  # fmt: skip
            for sock in (conn, upstream):
                if sock is not None:
                    sock.close()

    async def _intercept(
        self, conn: socket.socket, upstream: socket.socket, host: str, port: int, usable: Usable, rest: bytes,
        on_bytes: Callable[[int, bool], None],
    ) -> tuple[str, str]:  # fmt: skip
        """The (verdict, reason) of an intercepted connection (orchestrator/egress/intercept.py)."""
        credentials = self._credentials
        assert credentials is not None
        if rest:  # a TLS client waits for the CONNECT's answer before its hello
            return "bad_request", "early_bytes"
        task = asyncio.current_task()
        assert task is not None
        self._intercepting[task] = usable
        # A connection made under a grant ends when the grant does, as at a revocation.
        expiry = None if usable.grant is None else asyncio.get_running_loop().call_later(
            max(0.0, seconds_until(usable.grant.expires_at)), self._cut_task, task, "grant_expired"
        )  # fmt: skip
        try:
            outcome = await serve_intercepted(
                conn, upstream, host=host, port=port, server_context=credentials.server_context(host),
                client_context=credentials.client_context, header_for=lambda: credentials.header_for(usable, host, port),
                on_bytes=on_bytes, idle_s=self._timeouts.idle_s, handshake_s=self._timeouts.head_s,
                head_max_bytes=self._head_max,
            )  # fmt: skip
        except asyncio.CancelledError:
            if task not in self._cut_tasks:
                raise
            task.uncancel()
            return "cut", self._cut_tasks[task]
        except RelayIdle:
            return "cut", "idle"
        finally:
            if expiry is not None:
                expiry.cancel()
            self._intercepting.pop(task, None)
            self._cut_tasks.pop(task, None)
        if outcome.reason == "ok":
            return "allowed", "credential"
        if outcome.reason == "credential_revoked":
            return "cut", outcome.reason
        if outcome.reason == "upstream_tls":
            return "upstream_failed", outcome.reason
        return ("bad_request" if outcome.refused else "upstream_failed"), outcome.reason

    async def _resolve(self, user_id: int, host: str, port: int) -> Sequence[IpAddress]:
        literal = literal_address(host)
        if literal is not None:
            return [literal]
        try:
            self._lookups.admit(user_id)
        except CapExceeded as exc:
            status = 503 if exc.code == "dns_lookups_busy" else 429
            raise _Refused(status, "cap", exc.code, f"Egress to {host}:{port} refused: {exc}.") from None
        try:
            found = await asyncio.wait_for(self._resolver(host, port), self._timeouts.resolve_s)
        except asyncio.TimeoutError:
            raise _Refused(
                502, "upstream_failed", "dns", f"Egress to {host}:{port}: the name did not resolve within {self._timeouts.resolve_s:g} s."
            ) from None
        except OSError as exc:
            raise _Refused(502, "upstream_failed", "dns", f"Egress to {host}:{port}: the name does not resolve ({exc}).") from None
        finally:
            self._lookups.release(user_id)  # a lookup given up on frees its slot at once
        if not found:
            raise _Refused(502, "upstream_failed", "dns", f"Egress to {host}:{port}: the name has no address.")
        return found

    async def _connect(self, host: str, port: int, usable: Sequence[IpAddress]) -> tuple[socket.socket, str]:
        loop = asyncio.get_running_loop()
        last: Exception | None = None
        for address in usable:
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                # The checked address itself, never the name again: no second lookup to rebind.
                await asyncio.wait_for(loop.sock_connect(sock, (str(address), port)), self._timeouts.connect_s)
                return sock, str(address)
            except (OSError, asyncio.TimeoutError) as exc:
                sock.close()
                last = exc
        raise _Refused(
            502, "upstream_failed", "connect", f"Egress to {host}:{port}: the upstream did not accept a connection ({last})."
        )


__all__ = ["ConnectionRecord", "Decision", "EgressProxy", "ProxyTimeouts", "Verdict", "refusal_response", "serve_unix"]
