"""The orchestrator's client of one agent: HTTP/1.1 over the agent's Unix socket, or over any
stream socket a `Connector` hands out (the kubernetes backend's port-forward).

One transport, `AsyncAgentClient`: asyncio streams with a small pool of keep-alive
connections per event loop, answers parsed by llhttp (`httptools`, the parser uvicorn serves
the API with: status line, headers, Content-Length and chunked framing, keep-alive; nothing
parsed by hand), so a call waiting for its sandbox holds no thread (one user's slow or stopped
agent cannot fill the server's thread pool), and every call has one deadline for its whole
answer. Chosen by measurement (`bench/agent_transport.py`, docs/performance.md): CPU per warm
`read_file` to a live agent 0.09 ms with llhttp, 0.25 ms with h11, 0.78 ms with httpx.

`AgentClient` is the sync façade for code that runs in threads (host tools, agent starts
waiting for `/health`, cancels from sync routes, tests): each method runs the transport's
coroutine on one shared event loop of its own (`blocking`) and waits for it. Thread-safe.

Both distrust the agent: with `expected_peer` every new connection's peer must show that
sandbox's uid or container (`sandbox_agent.peer`), and an answer is read only up to a bound
derived from the agent's limits (`AnswerLimits`): its Content-Length is read first and a larger
(or unannounced) body is refused without being read; text fields longer than the output cap
are cut again here. Lower-layer failures become agent errors in one place (`map_agent_errors`).

`read_bytes` answers arrive as raw bytes (`Accept: application/octet-stream`; the other fields
in the `X-Tool-Result` header), not as base64 in JSON.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

import httptools
from pydantic import ValidationError

from sandbox_agent.answer_limits import DEFAULT_ANSWER_LIMITS, HEADER_MAX_BYTES, AnswerLimits, cap_text_fields
from sandbox_agent.errors import AgentTimedOut, AgentToolError, AgentUnavailable, ContextRefused, ToolFailure
from sandbox_agent.peer import ExpectedPeer, check_socket_peer
from sandbox_agent.unix_path import reachable
from sandbox_agent.wire import RAW_RESULT_HEADER, CallContext, Health, ReadBytesResult

T = TypeVar("T")

OCTET_STREAM = "application/octet-stream"
NDJSON = "application/x-ndjson"
STREAM_LINE_MAX = 1024 * 1024  # one output event of a streamed call (the agent reads 64 KiB at a time)
CANCEL_TIMEOUT_S = 30.0  # the agent answers once the cancelled calls ended (it waits up to 10 s)
# The agent closes connections idle for 5 s (uvicorn timeout_keep_alive); one idle for longer
# than this is not reused, so a request never races the agent's close.
REUSE_IDLE_S = 3.0
# A connection a `Connector` made (a port-forward) can look open after the agent behind it is
# gone: the API server keeps the websocket of a deleted pod's forward. One idle for longer
# than this is asked `/health` before it carries a call, so a call is never sent into a dead
# forward and reported "may have run"; a dead one is dropped and a new one opened (which
# then fails as "not delivered", and the caller recreates the sandbox).
VERIFY_IDLE_S = 0.25
VERIFY_TIMEOUT_S = 2.0
# A new forwarded connection is asked too: the API server opens a forward to a pod whose agent
# is gone (a terminating pod) and only then reports that nothing listens.
NEW_CONNECTION = float("inf")
MAX_IDLE_CONNECTIONS = 8
CANCEL_PATH = "/v1/calls/cancel"
# The asyncio stream's buffer: its reading pauses at twice this, and a smaller one made a
# 1 MiB read_bytes 45 % slower (a pause and resume every 128 KiB).
STREAM_BUFFER_BYTES = 2 * 1024 * 1024
SPOOL_CHUNK = 256 * 1024  # bytes read off the socket at a time, so written to a spool at most


# Opens one new connection to the agent within the timeout (seconds) and returns the connected
# stream socket; a failure is `AgentUnavailable(delivered=False)` (nothing was sent). Used
# instead of the Unix socket path when the agent is reached another way (a port-forward
# through the Kubernetes API): the connector, not SO_PEERCRED, vouches for the peer.
Connector = Callable[[float], socket.socket]


# --- the protocol: requests built and answers judged ------------------------------------------


@dataclass(frozen=True)
class _Answer:
    status: int
    content_type: str
    raw_header: str  # X-Tool-Result
    content: bytes
    spooled: int | None = None  # a raw body written to the caller's sink instead: its length


def _content_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def answer_length(content_length: str | None, chunked: bool, limit: int, socket_path: str) -> int:
    """The body's announced length, or the tool error for an answer that is too large or does
    not say how large it is (the agent always sends Content-Length)."""
    if chunked or content_length is None:
        raise AgentToolError(
            "output_too_large", f"The sandbox agent at {socket_path} answered without a length; refused unread."
        )
    try:
        length = int(content_length)
        if length < 0:
            raise ValueError(length)
    except ValueError:
        raise AgentToolError("agent_error", f"The sandbox agent answered a bad Content-Length {content_length!r}.") from None
    if length > limit:
        raise AgentToolError(
            "output_too_large",
            f"The sandbox agent's answer is {length} bytes; the orchestrator accepts at most {limit}. "
            "Nothing of it was used; narrow the request (a smaller file, path or pattern, less output).",
        )
    return length


def tool_request(arguments: dict[str, Any], cwd: str, context: CallContext | None) -> bytes:
    body: dict[str, Any] = {"arguments": arguments, "cwd": cwd}
    if context is not None:
        body["context"] = context.model_dump(exclude_none=True)
    return json.dumps(body).encode()


def health_of(answer: _Answer) -> Health:
    if answer.status != 200:
        raise AgentUnavailable(f"agent health answered {answer.status}", delivered=True)
    try:
        return Health.model_validate_json(answer.content)
    except ValidationError as exc:
        raise AgentUnavailable(f"agent health answered something else: {exc}", delivered=True) from None


def cancelled_of(answer: _Answer) -> int:
    if answer.status == 404:  # an agent without cancel: nothing of ours to cancel there
        return 0
    try:
        count = json.loads(answer.content)["cancelled"] if answer.status == 200 else None
    except (ValueError, TypeError, KeyError):
        count = None
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise AgentUnavailable(f"agent cancel answered {answer.status} without a count", delivered=True)
    return count


def tool_result(tool: str, answer: _Answer, limits: AnswerLimits, context: CallContext | None = None) -> Any:
    """The tool's result (`read_bytes`: a `ReadBytesResult`) or its `ToolFailure`; raises
    `ContextRefused` when an agent of an earlier BUILD refused the call's `context`, and
    `AgentUnavailable` for an answer that is not the protocol."""
    if context is not None and answer.status == 422:
        # An agent of an earlier BUILD (it serves until idle) refuses the `context` field
        # before running anything: the caller sends the call again as that agent knows it.
        raise ContextRefused("the sandbox agent does not know the call's context; nothing ran")
    raw_bytes = tool == "read_bytes"
    if answer.status == 200 and answer.content_type == OCTET_STREAM and raw_bytes:
        try:
            return ReadBytesResult.from_raw(answer.raw_header, answer.content, spooled=answer.spooled)
        except ValueError as exc:
            return ToolFailure("agent_error", f"The sandbox agent answered read_bytes without usable fields: {exc}")
    try:
        payload = json.loads(answer.content)
    except ValueError:
        raise AgentUnavailable(f"agent answered {answer.status} with a body that is not JSON", delivered=True) from None
    if answer.status == 200 and isinstance(payload, dict) and "ok" in payload:
        if payload["ok"]:
            result = payload.get("result")
            if raw_bytes:
                try:  # an agent of an earlier BUILD (it serves until idle) answers in JSON
                    return ReadBytesResult.from_json_result(result)
                except ValueError as exc:
                    return ToolFailure("agent_error", f"The sandbox agent {exc}")
            if len(answer.content) > limits.output_cap_bytes:  # else no field can be over it
                result, _ = cap_text_fields(result, limits.output_cap_bytes)
            return result
        error = dict(payload.get("error") or {})
        code = str(error.pop("code", "agent_error"))
        message = str(error.pop("message", "the sandbox agent reported an error"))
        path = error.pop("path", None)
        return ToolFailure(code, message, path, error)
    error = payload.get("error", {}) if isinstance(payload, dict) else {}
    if answer.status == 401:
        raise AgentUnavailable("the agent rejected the token", delivered=False)
    if answer.status == 404:
        return ToolFailure("unknown_tool", f"The sandbox agent has no tool {tool}.")
    if answer.status == 422:
        return ToolFailure("invalid_arguments", f"The sandbox agent refused the request: {error or payload}")
    message = error.get("message", payload) if isinstance(error, dict) else payload
    return ToolFailure("agent_error", f"The sandbox agent answered {answer.status}: {message}")


# --- the transport ---------------------------------------------------------------------------


class RawSpool(Protocol):
    """Where the client writes a large raw `read_bytes` answer instead of holding it: answers
    of at least `min_bytes` go to the file `open` gives once their length is known (it may
    wait, e.g. for a transfer slot; reading the socket is paused meanwhile); smaller ones are
    read whole. `open` is called once per attempt and must hand back an empty file each time."""

    min_bytes: int

    async def open(self, length: int) -> BinaryIO: ...


class SinkSpool:
    """A `RawSpool` of one seekable file for every raw answer, emptied before each attempt
    (the sync callers' `sink`)."""

    min_bytes = 0

    def __init__(self, sink: BinaryIO) -> None:
        self.sink = sink

    async def open(self, length: int) -> BinaryIO:
        self.sink.seek(0)
        self.sink.truncate()  # nothing of a failed attempt stays in it
        return self.sink


# What a broken connection or a protocol violation raises below `map_agent_errors`.
_LOWER_ERRORS = (OSError, EOFError, ValueError, asyncio.IncompleteReadError)


@contextmanager
def map_agent_errors(where: str, timeout_s: float, *, delivered: bool = True) -> Iterator[None]:
    """The one place a lower layer's failure (a socket, the parser, the deadline) becomes an agent
    error: `AgentTimedOut` past the deadline, else `AgentUnavailable`, `delivered` unless
    nothing can have been sent. Once bytes may have left, the tool may have run: never
    "certainly not delivered". An `AgentToolError` (an answer refused unread) passes as it is."""
    try:
        yield
    except TimeoutError as exc:
        if not delivered:
            raise AgentUnavailable(f"the agent at {where} did not answer within {timeout_s:g} s", delivered=False) from exc
        raise AgentTimedOut(f"agent at {where} did not answer within {timeout_s:g} s") from exc
    except _LOWER_ERRORS as exc:
        if delivered:
            raise AgentUnavailable(f"agent at {where} failed mid-request: {exc!r}", delivered=True) from exc
        raise AgentUnavailable(f"the agent at {where} does not answer: {exc!r}", delivered=False) from exc


class _Parsed:
    """What llhttp (`httptools`) has parsed of one answer so far: its callbacks' target."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.head_bytes = 0
        self.keep_alive = False
        self.pieces: deque[bytes] = deque()  # body bytes not taken yet
        self.done = False
        self.extra = False  # bytes after the answer's end: the connection is not reused

    def on_message_begin(self) -> None:
        self.extra = self.extra or self.done

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()  # llhttp forgets it at the answer's end

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_complete(self) -> None:
        self.done = True

    def feed(self, data: bytes) -> None:
        """The answer's next bytes; a `ValueError` for bytes that are not HTTP/1.1 or a head
        longer than `HEADER_MAX_BYTES` (garbage after a whole answer only spoils reuse)."""
        if not self.head_done:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not self.done:
                raise ValueError(f"not an HTTP/1.1 answer: {exc}") from None
            self.extra = True  # garbage after a whole answer: used, never reused
        if not self.head_done and self.head_bytes > HEADER_MAX_BYTES:
            raise ValueError(f"the answer's head is longer than {HEADER_MAX_BYTES} bytes")


def _request(method: str, target: str, head: bytes, body: bytes | None) -> bytes:
    """One request's bytes: `head` holds the fixed header lines (checked at construction)."""
    lines = f"{method} {target} HTTP/1.1\r\n".encode("ascii") + head
    if body is None:
        return lines + b"\r\n"
    return lines + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body


class _Connection:
    """One keep-alive connection to the agent: its asyncio stream, the parser of the answer
    under way (llhttp through `httptools`, the API server's own parser), and the loop it
    belongs to (a connection is only ever used on that loop)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop) -> None:
        self.reader = reader
        self.writer = writer
        self.loop = loop
        self.parsed = _Parsed()
        self.since = 0.0

    def usable(self, now: float) -> bool:
        # An idle one the agent closed has seen its EOF (the loop ran since), so it is never
        # sent a request that would have to be reported as "may have run".
        return now - self.since <= REUSE_IDLE_S and not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        """From any thread: closed on its own loop."""
        if self.loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.writer.close()
        else:
            try:
                self.loop.call_soon_threadsafe(self.writer.close)
            except RuntimeError:
                pass

    def send(self, method: str, target: str, head: bytes, body: bytes | None) -> None:
        self.parsed = _Parsed()
        self.writer.write(_request(method, target, head, body))

    async def _feed(self) -> None:
        data = await self.reader.read(SPOOL_CHUNK)
        if not data:
            raise EOFError("the agent closed the connection before the end of its answer")
        self.parsed.feed(data)

    async def head(self) -> tuple[int, dict[str, str]]:
        """The answer's status and (lower-cased) headers."""
        while not self.parsed.head_done:
            await self._feed()
        return self.parsed.parser.get_status_code(), self.parsed.headers

    async def pieces(self) -> AsyncIterator[bytes]:
        """The body as it arrives, one read's worth at most at a time."""
        while True:
            while self.parsed.pieces:
                yield self.parsed.pieces.popleft()
            if self.parsed.done:
                return
            await self._feed()

    async def body(self) -> bytes:
        """The rest of the answer's body (its length was checked against the bound first)."""
        return b"".join([piece async for piece in self.pieces()])

    def finished(self) -> bool:
        """After the answer's end: whether the connection may carry the next request."""
        return self.parsed.done and not self.parsed.extra and self.parsed.keep_alive


async def _read_answer(
    conn: _Connection, limits: AnswerLimits, accept: str | None, where: str, spool: RawSpool | None,
    deadline: asyncio.Timeout | None,
) -> tuple[_Answer, bool]:  # fmt: skip
    """One answer, read to its announced length at most; and whether the connection may be
    reused. A large raw answer goes to `spool` when one is given (`RawSpool`)."""
    status, headers = await conn.head()
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    limit = limits.max_raw_bytes if accept == OCTET_STREAM else limits.max_json_bytes
    length = answer_length(headers.get("content-length"), chunked, limit, where)
    content_type = _content_type(headers.get("content-type"))
    raw_header = headers.get(RAW_RESULT_HEADER.lower(), "")
    if spool is not None and status == 200 and content_type == OCTET_STREAM and length >= spool.min_bytes:
        spooled, keep = await _spool_body(conn, length, spool, deadline)
        return _Answer(status, content_type, raw_header, b"", spooled), keep
    return _Answer(status, content_type, raw_header, await conn.body()), conn.finished()


async def _spool_body(conn: _Connection, length: int, spool: RawSpool, deadline: asyncio.Timeout | None) -> tuple[int, bool]:
    """Copy the body into the spool's file in pieces; how many bytes arrived (fewer: the agent
    hung up early, and the caller refuses the answer as the size disagrees) and whether the
    connection may be reused. The call's `deadline` stops while `open` waits (the spool
    bounds its own wait) and goes on after it: the agent has answered, and a wait for a slot
    must not pass for an agent that missed its deadline (which would replace the sandbox)."""
    transport = conn.writer.transport
    transport.pause_reading()  # while `open` waits, the socket's bytes stay in the kernel
    when = deadline.when() if deadline is not None else None
    if deadline is not None:
        deadline.reschedule(None)
    loop = asyncio.get_running_loop()
    waited_from = loop.time()
    try:
        sink = await spool.open(length)
    finally:
        transport.resume_reading()
        if deadline is not None and when is not None:
            deadline.reschedule(when + loop.time() - waited_from)
    copied = 0
    try:
        async for piece in conn.pieces():
            sink.write(piece)  # page cache: a 256 KiB write costs tens of microseconds
            copied += len(piece)
    except (EOFError, ValueError, ConnectionError):
        return copied, False  # cut short: refused by its size (a failing sink raises on)
    return copied, conn.finished()


async def _read_streamed(
    conn: _Connection, limits: AnswerLimits, where: str, on_output: Callable[[str, str], None]
) -> tuple[_Answer, bool]:
    """A chunked NDJSON answer: output lines to `on_output`, the result line as the answer."""
    status, headers = await conn.head()
    content_type = _content_type(headers.get("content-type"))
    if "chunked" not in headers.get("transfer-encoding", "").lower() or content_type != NDJSON:
        answer_length(headers.get("content-length"), False, limits.max_json_bytes, where)  # llhttp reads no more
        return _Answer(status, content_type, "", await conn.body()), conn.finished()
    budget = limits.max_json_bytes + limits.max_stream_bytes
    pending = bytearray()
    result: bytes | None = None
    async for piece in conn.pieces():
        budget -= len(piece)
        if budget < 0:
            raise AgentToolError("output_too_large", f"The sandbox agent at {where} streamed more than it may; refused.")
        pending += piece
        while (end := pending.find(b"\n")) >= 0:
            line = bytes(pending[:end])
            del pending[: end + 1]
            if result is not None:
                raise ValueError("a line after the result")
            event = output_event(line)
            if event is None:
                result = line
            else:
                on_output(*event)
        if len(pending) > max(STREAM_LINE_MAX, limits.max_json_bytes):
            raise ValueError("a streamed line without its end")
    if result is None:
        raise ValueError("the stream ended without a result")
    return _Answer(status, "application/json", "", result), conn.finished()


async def _connected_in_thread(connector: Connector, timeout_s: float) -> socket.socket:
    """A connector's socket, opened in a worker thread (it blocks: a TLS and websocket
    handshake). One that arrives after the timeout is closed, not leaked."""
    future = asyncio.get_running_loop().run_in_executor(None, connector, timeout_s)
    try:
        async with asyncio.timeout(timeout_s + 1.0):
            sock = await asyncio.shield(future)
    except TimeoutError:
        future.add_done_callback(lambda done: done.exception() is None and done.result().close())
        raise
    sock.setblocking(False)
    return sock


class AsyncAgentClient:
    """The transport to one agent. Its methods run on any event loop (each loop keeps its own
    idle connections); `close` is safe from any thread."""

    def __init__(
        self,
        socket_path: str | Path,
        token: str,
        *,
        connector: Connector | None = None,
        expected_peer: ExpectedPeer | None = None,
        answer_limits: AnswerLimits = DEFAULT_ANSWER_LIMITS,
        timeout_s: float = 660.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.socket_path = str(socket_path)  # with a connector: where the agent is, for messages
        self.connector = connector
        self.expected_peer = expected_peer
        self.answer_limits = answer_limits
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        if not token.isprintable() or not token.isascii():
            raise ValueError("an agent token is printable ASCII")
        self._authorization = f"authorization: Bearer {token}\r\n".encode("ascii")
        self._head = b"host: sandbox-agent\r\n" + self._authorization
        self._idle: dict[asyncio.AbstractEventLoop, list[_Connection]] = {}
        self._lock = threading.Lock()  # the pool: the sync façade's loop and the server's share it
        self._closed = False

    def close(self) -> None:
        """Safe from any thread; calls under way end with AgentUnavailable."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def idle_connections(self) -> list[_Connection]:
        """The connections kept open for the next calls, on every loop."""
        with self._lock:
            return [conn for conns in self._idle.values() for conn in conns]

    # --- the connection pool --------------------------------------------------------------

    async def _checkout(self, connect_timeout_s: float) -> _Connection:
        """An open connection (reused when one is idle). Connecting failures are
        `AgentUnavailable(delivered=False)`: nothing was sent."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        while True:
            with self._lock:
                if self._closed:
                    raise AgentUnavailable(f"the client of {self.socket_path} is closed", delivered=False)
                idle = self._idle.get(loop)
                if not idle:
                    break
                conn = idle.pop()
            if conn.usable(now) and await self._still_answers(conn, now - conn.since):
                return conn
            conn.close()
        sock = await self._connect(connect_timeout_s)
        with map_agent_errors(self.socket_path, connect_timeout_s, delivered=False):
            reader, writer = await asyncio.open_connection(sock=sock, limit=STREAM_BUFFER_BYTES)
        conn = _Connection(reader, writer, loop)
        if not await self._still_answers(conn, NEW_CONNECTION):
            conn.close()
            raise AgentUnavailable(f"nothing answers behind the new connection to {self.socket_path}", delivered=False)
        return conn

    async def _connect(self, timeout_s: float) -> socket.socket:
        """A new connected socket to the agent, non-blocking: the connector's, else one to the
        Unix socket whose listener shows `expected_peer`. A failure is
        `AgentUnavailable(delivered=False)`: nothing was sent."""
        with map_agent_errors(self.socket_path, timeout_s, delivered=False):
            if self.connector is not None:
                return await _connected_in_thread(self.connector, timeout_s)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                async with asyncio.timeout(timeout_s):
                    with reachable(self.socket_path) as short:  # refused, no socket, permission, backlog full
                        await asyncio.get_running_loop().sock_connect(sock, short)
                problem = None if self.expected_peer is None else check_socket_peer(sock, self.expected_peer)
                if problem is not None:
                    raise AgentUnavailable(f"the listener on {self.socket_path} is not the sandbox's: {problem}: refused", delivered=False)
            except BaseException:
                sock.close()
                raise
        return sock

    async def _still_answers(self, conn: _Connection, idle_s: float) -> bool:
        """A forwarded connection idle for a while answers `/health` before it is reused."""
        if self.connector is None or idle_s < VERIFY_IDLE_S:
            return True
        try:
            async with asyncio.timeout(VERIFY_TIMEOUT_S):
                conn.send("GET", "/health", self._head, None)
                answer, keep = await _read_answer(conn, self.answer_limits, None, self.socket_path, None, None)
        except (TimeoutError, AgentToolError, *_LOWER_ERRORS):
            return False
        return answer.status == 200 and keep

    def _checkin(self, conn: _Connection) -> None:
        with self._lock:
            idle = self._idle.setdefault(conn.loop, [])
            if not self._closed and len(idle) < MAX_IDLE_CONNECTIONS:
                conn.since = time.monotonic()
                idle.append(conn)
                return
        conn.close()

    async def _send(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        accept: str | None = None,
        timeout_s: float | None = None,
        on_output: Callable[[str, str], None] | None = None,
        spool: RawSpool | None = None,
    ) -> _Answer:
        """One request and its answer within the deadline; with `on_output`, the answer is a
        streamed call's (`_read_streamed`); with `spool`, a large raw answer goes there."""
        timeout = self._timeout_s if timeout_s is None else timeout_s
        conn = await self._checkout(min(timeout, self._connect_timeout_s))
        head = self._head if accept is None else self._head + f"accept: {accept}\r\n".encode("ascii")
        keep = False
        try:
            with map_agent_errors(self.socket_path, timeout):
                async with asyncio.timeout(timeout) as deadline:
                    conn.send(method, url, head, body)
                    if on_output is None:
                        answer, keep = await _read_answer(conn, self.answer_limits, accept, self.socket_path, spool, deadline)
                    else:
                        answer, keep = await _read_streamed(conn, self.answer_limits, self.socket_path, on_output)
        finally:
            if keep:
                self._checkin(conn)
            else:  # also on cancellation: a half-read answer must never meet the next request
                conn.close()
        return answer

    # --- the API ----------------------------------------------------------------------------

    async def health(self, *, timeout_s: float | None = None) -> Health:
        return health_of(await self._send("GET", "/health", timeout_s=timeout_s))

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        cwd: str,
        context: CallContext | None = None,
        timeout_s: float | None = None,
        spool: RawSpool | None = None,
    ) -> Any:
        """The tool's result (`read_bytes`: a `ReadBytesResult`) or its `ToolFailure` (also an
        answer refused unread: too large, no length); raises `ContextRefused` for an agent that
        does not know `context`, and `AgentUnavailable` when the agent could not be reached.
        With a `spool`, a large raw read_bytes answer goes to its file (`RawSpool`) and the
        result's `data` is empty."""
        accept = OCTET_STREAM if tool == "read_bytes" else None
        spool = spool if tool == "read_bytes" else None
        body = tool_request(arguments, cwd, context)
        try:
            answer = await self._send("POST", f"/v1/tools/{tool}", body=body, accept=accept, timeout_s=timeout_s, spool=spool)
        except AgentToolError as refused:
            return refused.failure()
        return tool_result(tool, answer, self.answer_limits, context)

    async def stream(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        cwd: str,
        on_output: Callable[[str, str], None],
        context: CallContext | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """A streamed call (`shell`): `on_output(stream, text)` for every output event as it
        arrives, then the result as `call` returns it. Bounded like every answer: each line,
        and all of them together; an answer that is not a stream (an error) is read as one."""
        body = tool_request(arguments, cwd, context)
        try:
            answer = await self._send(
                "POST", f"/v1/tools/{tool}", body=body, accept=NDJSON, timeout_s=timeout_s, on_output=on_output
            )
        except AgentToolError as refused:
            return refused.failure()
        return tool_result(tool, answer, self.answer_limits, context)

    async def cancel(self, *, run_id: str | None = None, session_id: str | None = None, timeout_s: float = CANCEL_TIMEOUT_S) -> int:
        """Kill the matching in-flight calls' process trees; how many calls were cancelled."""
        if run_id is None and session_id is None:
            raise ValueError("cancel needs a run_id or a session_id")
        body = json.dumps({"run_id": run_id, "session_id": session_id}).encode()
        return cancelled_of(await self._send("POST", CANCEL_PATH, body=body, timeout_s=timeout_s))

    async def open_port(self, port: int, *, timeout_s: float) -> tuple[socket.socket, bytes]:
        """A stream to 127.0.0.1:`port` inside the sandbox (`sandbox_agent.port_tunnel`), on a
        connection of its own (never pooled): the connected socket, non-blocking, and any bytes
        of the port's that already came with the agent's answer. Raises `AgentToolError`
        `port_not_listening` when nothing accepts there, `AgentUnavailable` when the agent
        cannot be reached or refuses."""
        loop = asyncio.get_running_loop()
        sock = await self._connect(min(timeout_s, self._connect_timeout_s))
        parsed = _Parsed()
        target = f"127.0.0.1:{port}"
        try:
            with map_agent_errors(self.socket_path, timeout_s):
                async with asyncio.timeout(timeout_s):
                    head = f"host: {target}\r\n".encode() + self._authorization
                    await loop.sock_sendall(sock, _request("CONNECT", target, head, None))
                    while not parsed.head_done:
                        piece = await loop.sock_recv(sock, 4096)
                        if not piece:
                            raise EOFError("the agent closed the tunnel before answering")
                        parsed.feed(piece)
        except BaseException:
            sock.close()
            raise
        status = parsed.parser.get_status_code()
        if status == 200:  # what came after the head is the port's (a body without a length, to llhttp)
            return sock, b"".join(parsed.pieces)
        sock.close()
        if status == 503:
            raise AgentToolError("port_not_listening", f"Nothing accepts connections on port {port} in the sandbox.")
        if status == 401:
            raise AgentUnavailable("the agent rejected the token", delivered=False)
        raise AgentToolError("agent_error", f"The sandbox agent answered {status} to a tunnel to port {port}.")


def output_event(line: bytes) -> tuple[str, str] | None:
    """(stream, text) of one output line of a streamed call; None for anything else. Only the
    two streams and a string are taken from the agent."""
    event = json.loads(line)
    if not isinstance(event, dict) or event.get("event") != "output":
        return None
    stream, text = event.get("stream"), event.get("text")
    if stream not in ("stdout", "stderr") or not isinstance(text, str):
        raise ValueError("an output event without a stream and a text")
    return stream, text


# --- the sync façade ---------------------------------------------------------------------------

_facade_loop: asyncio.AbstractEventLoop | None = None
_facade_lock = threading.Lock()


def blocking(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` on the sync callers' event loop (one daemon thread for the process) and wait
    for its outcome: how code in a worker thread uses the transport. Never call it from that
    loop itself."""
    global _facade_loop
    with _facade_lock:
        if _facade_loop is None or _facade_loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="agent-client", daemon=True).start()
            _facade_loop = loop
        loop = _facade_loop
    return asyncio.run_coroutine_threadsafe(work, loop).result()


class AgentClient:
    """The sync façade of `AsyncAgentClient` (thread-safe): the same arguments and answers,
    except that a tool's failure is raised (`AgentToolError`), as its sync callers (starts,
    scripts, tests) handle it; read_bytes' raw bytes go to a `sink` file as they arrive."""

    def __init__(self, socket_path: str | Path, token: str, **options: Any) -> None:
        self.transport = AsyncAgentClient(socket_path, token, **options)

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()

    def health(self, *, timeout_s: float | None = None) -> Health:
        return blocking(self.transport.health(timeout_s=timeout_s))

    def call(self, tool: str, arguments: dict[str, Any], *, sink: BinaryIO | None = None, **options: Any) -> Any:
        """As `AsyncAgentClient.call` (`cwd`, `context`, `timeout_s`); with a `sink`,
        read_bytes' raw bytes are written to it in pieces as they arrive (never held whole) and
        the result's `data` is empty."""
        spool = SinkSpool(sink) if sink is not None else None
        result = blocking(self.transport.call(tool, arguments, spool=spool, **options))
        if isinstance(result, ToolFailure):
            raise result.raised()
        return result

    def cancel(self, **options: Any) -> int:
        """As `AsyncAgentClient.cancel` (`run_id`, `session_id`, `timeout_s`)."""
        return blocking(self.transport.cancel(**options))
