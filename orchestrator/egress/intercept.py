"""One intercepted connection: a CONNECT to a host one of the runtime user's credentials is
for (or one delegated to them). The proxy answers the CONNECT, terminates the client's TLS
with a certificate of the deployment's CA, opens TLS to the upstream verified against the
upstream CA bundle, and forwards one HTTP/1.1 request with the credential's header put in
(any header of that name the client sent, a placeholder, is dropped), then relays the answer
until the upstream ends it. One request per connection, as for plain HTTP
(orchestrator/egress/plain_http.py): the request's own Host must name the CONNECT's target,
so the header goes nowhere else. TRACE is refused: its answer is the request itself.

The secret exists in clear only in the request head written to the upstream's TLS stream.
"""

from __future__ import annotations

import asyncio
import ssl
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.egress.plain_http import PlainRequestRefused, plan_plain_request, refusal_response
from orchestrator.egress.policy import InvalidTarget
from sandbox_agent.relay import RelayIdle

CHUNK = 1 << 16
CLOSE_S = 2.0  # how long the client's TLS close may take before the connection is dropped
CONNECTED = b"HTTP/1.1 200 Connection established\r\n\r\n"
HTTPS_PORT = 443
REFLECTING_METHODS = frozenset({"TRACE", "TRACK"})  # RFC 9110's loop-back, and IIS's old twin


class _TlsStreamProtocol(asyncio.StreamReaderProtocol):
    """A stream protocol whose transport becomes TLS after it was made (start_tls): the end
    of the client's stream closes it (a half-close means nothing under TLS)."""

    def eof_received(self) -> bool:
        super().eof_received()
        return False


class InterceptRefused(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


@dataclass(frozen=True)
class InterceptOutcome:
    reason: str  # ok | client_tls | upstream_tls | no_request | a refusal's code
    refused: bool = False
    status: int | None = None  # the upstream's answer status, when one came


OnBytes = Callable[[int, bool], None]
HeaderFor = Callable[[], "tuple[str, str] | None"]  # (name, value), None: no longer usable


def without_header(header_lines: Sequence[bytes], name: str) -> list[bytes]:
    """Pure: the header lines without any of `name` (a placeholder the client sent)."""
    lowered = name.lower().encode()
    return [line for line in header_lines if line.partition(b":")[0].strip().lower() != lowered]


def with_header(head: bytes, name: str, value: str) -> bytes:
    """Pure: a planned request head (ending in a blank line) with `name: value` added last."""
    assert head.endswith(b"\r\n\r\n")
    return head[:-2] + f"{name}: {value}\r\n\r\n".encode()


def parse_request_line(raw: bytes) -> tuple[str, str, str, list[bytes]]:
    lines = raw[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise InvalidTarget("not an HTTP/1.x request line")
    try:
        method, target, version = (p.decode("ascii") for p in parts)
    except UnicodeDecodeError:
        raise InvalidTarget("the request line is not ASCII") from None
    if not target.startswith("/"):
        raise InvalidTarget("a request inside the tunnel names a path (origin form)")
    return method.upper(), target, version, lines[1:]


def upstream_context(ca_bundle: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_bundle)
    context.set_alpn_protocols(["http/1.1"])
    return context


async def serve_intercepted(
    conn: socket.socket,
    upstream: socket.socket,
    *,
    host: str,
    port: int,
    server_context: ssl.SSLContext,
    client_context: ssl.SSLContext,
    header_for: HeaderFor,
    on_bytes: OnBytes,
    idle_s: float,
    handshake_s: float,
    head_max_bytes: int,
) -> InterceptOutcome:
    """Answer the CONNECT with 200 and serve the intercepted connection."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=head_max_bytes, loop=loop)
    protocol = _TlsStreamProtocol(reader, loop=loop)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=conn)
    # No await between the 200 and start_tls, which pauses reading at once: the client's
    # hello, sent when it reads the 200, is never taken as plain bytes. (No StreamWriter on
    # the plain transport: a dropped one closes its transport.)
    transport.write(CONNECTED)
    try:
        tls = await loop.start_tls(transport, protocol, server_context, server_side=True, ssl_handshake_timeout=handshake_s)
    except (ssl.SSLError, asyncio.TimeoutError, ConnectionError, OSError):
        # The client does not trust the deployment's CA (or is no TLS client at all).
        transport.abort()
        return InterceptOutcome("client_tls")
    if tls is None:
        transport.abort()
        return InterceptOutcome("client_tls")
    writer = asyncio.StreamWriter(tls, protocol, reader, loop)
    try:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), handshake_s)
        except asyncio.LimitOverrunError:
            return await _refuse(writer, InterceptRefused(431, "head_too_large", "The request head is too large."))
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
            return InterceptOutcome("no_request")
        try:
            method, path, version, lines = parse_request_line(raw)
            if method in REFLECTING_METHODS:  # the answer is the request as received: the header with it
                raise InterceptRefused(
                    405, "trace_refused",
                    f"Egress to {host}:{port}: {method} is refused on a connection a credential is added to "
                    "(the upstream would send the request back, credential included).",
                )  # fmt: skip
            name_value = header_for()
            if name_value is None:
                raise InterceptRefused(
                    403, "credential_revoked",
                    f"Egress to {host}:{port}: the credential for it was revoked, expired or moved to other hosts; ask its owner to grant it again.",
                )  # fmt: skip
            # Planned without it (no refusal can ever quote the secret), then put in.
            name, value = name_value
            plan = plan_plain_request(method, version, without_header(lines, name), host, port, path, default_port=HTTPS_PORT)
            head = with_header(plan.head, name, value)
        except InvalidTarget as exc:
            return await _refuse(writer, InterceptRefused(400, "bad_target", f"Bad request: {exc}."))
        except PlainRequestRefused as exc:
            return await _refuse(writer, InterceptRefused(exc.status, exc.code, str(exc)))
        except InterceptRefused as exc:
            return await _refuse(writer, exc)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(sock=upstream, ssl=client_context, server_hostname=host, limit=CHUNK), handshake_s
            )
        except ssl.SSLCertVerificationError as exc:
            message = (f"Egress to {host}:{port}: the upstream's certificate does not verify against the proxy's upstream "
                       f"CA bundle ({exc.verify_message}).")  # fmt: skip
            await _refuse(writer, InterceptRefused(502, "upstream_tls", message))
            return InterceptOutcome("upstream_tls", refused=True, status=502)
        except (ssl.SSLError, asyncio.TimeoutError, ConnectionError) as exc:
            await _refuse(writer, InterceptRefused(502, "upstream_tls", f"Egress to {host}:{port}: TLS to the upstream failed ({type(exc).__name__})."))
            return InterceptOutcome("upstream_tls", refused=True, status=502)
        try:
            return await _exchange(reader, writer, up_reader, up_writer, head, plan.body_length, on_bytes, idle_s)
        finally:
            up_writer.transport.abort()  # the answer is all relayed, or the exchange failed
    finally:
        await _close(writer, transport)


async def _close(writer: asyncio.StreamWriter, plain: asyncio.BaseTransport) -> None:
    """Flush and end the client's TLS (bounded), then drop the socket's transport at once:
    the caller closes the socket itself, and a transport still registered on its descriptor
    would read whatever connection gets that descriptor number next."""
    try:
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), CLOSE_S)
    except (OSError, asyncio.TimeoutError, ssl.SSLError):
        pass
    finally:
        writer.transport.abort()
        plain.abort()  # type: ignore[attr-defined]


async def _refuse(writer: asyncio.StreamWriter, refusal: InterceptRefused) -> InterceptOutcome:
    try:
        writer.write(refusal_response(refusal.status, refusal.reason, refusal.message))
        await asyncio.wait_for(writer.drain(), 5)
    except (OSError, asyncio.TimeoutError):
        pass
    return InterceptOutcome(refusal.reason, refused=True, status=refusal.status)


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter, head: bytes, body_length: int, on_bytes: OnBytes, idle_s: float,
) -> InterceptOutcome:  # fmt: skip
    async def read(stream: asyncio.StreamReader, n: int) -> bytes:
        try:
            return await asyncio.wait_for(stream.read(n), idle_s)
        except asyncio.TimeoutError:
            raise RelayIdle(f"nothing moved for {idle_s:g} s") from None

    async def send_request() -> None:
        on_bytes(len(head), True)
        up_writer.write(head)
        left = body_length
        while left > 0:
            chunk = await read(reader, min(CHUNK, left))
            if not chunk:
                break
            on_bytes(len(chunk), True)
            up_writer.write(chunk)
            await up_writer.drain()
            left -= len(chunk)
        await up_writer.drain()

    status: int | None = None

    async def relay_answer() -> None:
        nonlocal status
        while chunk := await read(up_reader, CHUNK):
            if status is None and chunk.startswith(b"HTTP/1."):
                try:
                    status = int(chunk[9:12])
                except ValueError:
                    pass
            on_bytes(len(chunk), False)
            writer.write(chunk)
            await writer.drain()

    sending = asyncio.ensure_future(send_request())
    answering = asyncio.ensure_future(relay_answer())
    try:
        pending: set[asyncio.Future[None]] = {sending, answering}
        while answering in pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = task.exception()
                if error is not None:
                    raise error
    finally:
        for task in (sending, answering):
            task.cancel()
        await asyncio.gather(sending, answering, return_exceptions=True)
    return InterceptOutcome("ok", status=status)
