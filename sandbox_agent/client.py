"""The orchestrator's clients of one agent: HTTP/1.1 over the agent's Unix socket, or over
any stream socket a `Connector` hands out (the kubernetes backend's port-forward).

Two transports share one protocol (requests built and answers judged by the same functions):

- `AsyncAgentClient`, on the hot path of every tool call: asyncio streams with a small pool
  of keep-alive connections, so a call waiting for its sandbox holds no thread (one user's
  slow or stopped agent cannot fill the server's thread pool), and every call has a deadline.
  Its own header parsing is cheaper than `http.client`'s (which goes through `email.parser`).
- `AgentClient`, blocking, for code that runs in threads (host tools, agent starts waiting for
  `/health`, cancels from sync routes, tests): the standard library's `http.client` on a
  keep-alive pool (an httpx client spent 0.70 ms of CPU per small call, httpcore 0.39 ms,
  `http.client` 0.22 ms: docs/performance.md). Thread-safe.

Both distrust the agent: with `expected_peer` every new connection's peer must show that
sandbox's uid or container (`sandbox_agent.peer`), and an answer is read only up to a bound derived from the agent's limits
(`AnswerLimits`): its Content-Length is read first and a larger (or unannounced) body is
refused without being read; text fields longer than the output cap are cut again here.

`read_bytes` answers arrive as raw bytes (`Accept: application/octet-stream`; the other
fields in the `X-Tool-Result` header), not as base64 in JSON.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import io
import json
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from pydantic import ValidationError

from sandbox_agent.answer_limits import DEFAULT_ANSWER_LIMITS, HEADER_MAX_BYTES, AnswerLimits, cap_text_fields
from sandbox_agent.errors import AgentTimedOut, AgentToolError, AgentUnavailable
from sandbox_agent.peer import ExpectedPeer, check_socket_peer
from sandbox_agent.unix_path import reachable
from sandbox_agent.wire import RAW_RESULT_HEADER, CallContext, Health, ReadBytesResult

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
# then fails as "not delivered", and the protocol recreates the sandbox).
VERIFY_IDLE_S = 0.25
VERIFY_TIMEOUT_S = 2.0
# A new forwarded connection is asked too: the API server opens a forward to a pod whose agent
# is gone (a terminating pod) and only then reports that nothing listens.
NEW_CONNECTION = float("inf")
MAX_IDLE_CONNECTIONS = 8
CANCEL_PATH = "/v1/calls/cancel"
HEALTH_MAX_BYTES = 64 * 1024  # a /health answer is some 200 bytes
# The asyncio stream's buffer: its reading pauses at twice this, and a smaller one made a
# 1 MiB read_bytes 45 % slower than http.client (a pause and resume every 128 KiB).
STREAM_BUFFER_BYTES = 2 * 1024 * 1024


# --- what both transports share -------------------------------------------------------------

# Opens one new connection to the agent within the timeout (seconds) and returns the connected
# stream socket; a failure is `AgentUnavailable(delivered=False)` (nothing was sent). Used
# instead of the Unix socket path when the agent is reached another way (a port-forward
# through the Kubernetes API): the connector, not SO_PEERCRED, vouches for the peer.
Connector = Callable[[float], socket.socket]


def check_peer(sock: socket.socket, expected: ExpectedPeer | None, socket_path: str) -> None:
    """Refuse a connection whose listener is not the sandbox's (nothing was sent yet)."""
    if expected is None:
        return
    problem = check_socket_peer(sock, expected)
    if problem is not None:
        raise AgentUnavailable(f"the listener on {socket_path} is not the sandbox's: {problem}: refused", delivered=False)


@dataclass(frozen=True)
class _Answer:
    status: int
    content_type: str
    raw_header: str  # X-Tool-Result
    content: bytes
    spooled: int | None = None  # a raw body written to the caller's sink instead: its length


def _content_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def body_limit(limits: AnswerLimits, accept: str | None) -> int:
    return limits.max_raw_bytes if accept == OCTET_STREAM else limits.max_json_bytes


def answer_length(content_length: str | None, chunked: bool, limit: int, socket_path: str) -> int:
    """The body's announced length, or the tool error for an answer that is too large or does
    not say how large it is (the agent always sends Content-Length)."""
    if chunked or content_length is None:
        raise AgentToolError(
            "output_too_large", f"The sandbox agent at {socket_path} answered without a length; refused unread."
        )
    try:
        length = int(content_length)
    except ValueError:
        raise AgentToolError("agent_error", f"The sandbox agent answered a bad Content-Length {content_length!r}.") from None
    if length < 0:
        raise AgentToolError("agent_error", f"The sandbox agent answered a bad Content-Length {content_length!r}.")
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


def refused_context(answer: _Answer, context: CallContext | None) -> bool:
    """An agent of an earlier BUILD (it serves until idle) refuses the `context` field with a
    422 before running anything: the call is then sent as that agent knows it."""
    return context is not None and answer.status == 422


def cancel_request(run_id: str | None, session_id: str | None) -> bytes:
    if run_id is None and session_id is None:
        raise ValueError("cancel needs a run_id or a session_id")
    return json.dumps({"run_id": run_id, "session_id": session_id}).encode()


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


def tool_result(tool: str, answer: _Answer, limits: AnswerLimits) -> Any:
    """The tool's result (`read_bytes`: a `ReadBytesResult`); raises `AgentToolError` for a
    tool-level failure and `AgentUnavailable` for an answer that is not the protocol."""
    raw_bytes = tool == "read_bytes"
    if answer.status == 200 and answer.content_type == OCTET_STREAM and raw_bytes:
        try:
            return ReadBytesResult.from_raw(answer.raw_header, answer.content, spooled=answer.spooled)
        except ValueError as exc:
            raise AgentToolError("agent_error", f"The sandbox agent answered read_bytes without usable fields: {exc}") from None
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
                    raise AgentToolError("agent_error", f"The sandbox agent {exc}") from None
            if len(answer.content) > limits.output_cap_bytes:  # else no field can be over it
                result, _ = cap_text_fields(result, limits.output_cap_bytes)
            return result
        error = dict(payload.get("error") or {})
        code = str(error.pop("code", "agent_error"))
        message = str(error.pop("message", "the sandbox agent reported an error"))
        path = error.pop("path", None)
        raise AgentToolError(code, message, path, **error)
    error = payload.get("error", {}) if isinstance(payload, dict) else {}
    if answer.status == 401:
        raise AgentUnavailable("the agent rejected the token", delivered=False)
    if answer.status == 404:
        raise AgentToolError("unknown_tool", f"The sandbox agent has no tool {tool}.")
    if answer.status == 422:
        raise AgentToolError("invalid_arguments", f"The sandbox agent refused the request: {error or payload}")
    message = error.get("message", payload) if isinstance(error, dict) else payload
    raise AgentToolError("agent_error", f"The sandbox agent answered {answer.status}: {message}")


# --- the blocking client (http.client) ------------------------------------------------------

SPOOL_CHUNK = 256 * 1024  # bytes of a raw answer read and written at a time


def _copy_body(raw: http.client.HTTPResponse, length: int, sink: BinaryIO) -> int:
    """Copy `length` bytes of the body to `sink` in pieces; how many arrived (fewer: the agent
    closed early, and the caller refuses the answer as the size disagrees)."""
    copied = 0
    while copied < length:
        piece = raw.read(min(SPOOL_CHUNK, length - copied))
        if not piece:
            break
        sink.write(piece)
        copied += len(piece)
    if copied == length:
        raw.read()  # nothing left: marks the answer complete, so its connection can be reused
    return copied



class _DeadlineReader(io.RawIOBase):
    """An answer's bytes off the socket, each read waiting only for what is left of the call's
    deadline: a socket timeout alone bounds the wait between two bytes, which an agent that
    sends one now and then never reaches (it would hold the caller's thread for good)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer did not arrive before the call's deadline")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _DeadlineResponse(http.client.HTTPResponse):
    """http.client's answer, read through a `_DeadlineReader`."""

    def __init__(self, sock: socket.socket, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp.close()  # the plain file it made of the socket (the socket stays open)
        self.fp = io.BufferedReader(_DeadlineReader(sock, deadline))


class _UnixConnection(http.client.HTTPConnection):
    def __init__(
        self,
        socket_path: str,
        connect_timeout_s: float,
        expected_peer: ExpectedPeer | None,
        connector: Connector | None = None,
    ) -> None:
        super().__init__("sandbox-agent", timeout=connect_timeout_s)
        self._socket_path = socket_path
        self._expected_peer = expected_peer
        self._connector = connector

    def connect(self) -> None:
        if self._connector is not None:
            self.sock = self._connector(self.timeout)
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            with reachable(self._socket_path) as short:
                sock.connect(short)
            check_peer(sock, self._expected_peer, self._socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def within(self, timeout_s: float) -> None:
        """The next request and its whole answer take at most `timeout_s` (sendall's timeout
        is the whole send's; each read waits only for what is left)."""
        assert self.sock is not None
        self.sock.settimeout(timeout_s)
        self.response_class = functools.partial(_DeadlineResponse, deadline=time.monotonic() + timeout_s)

    def closed_by_peer(self) -> bool:
        """An idle connection that is readable has been closed (or broken) by the agent."""
        if self.sock is None:
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


class _AgentClientBase:
    """What both clients are configured with."""

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
        self._authorization = f"Bearer {token}"
        self._head = f"Host: sandbox-agent\r\nAuthorization: {self._authorization}\r\n"  # asyncio: raw HTTP
        self._idle: list[Any] = []
        self._lock = threading.Lock()  # the blocking client's pool; the asyncio one stays on its loop
        self._closed = False


class AgentClient(_AgentClientBase):
    """The blocking client (thread-safe)."""

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    # --- the connection pool --------------------------------------------------------------

    def _checkout(self, connect_timeout_s: float) -> tuple[_UnixConnection, bool]:
        """An open connection and whether it was reused. Connecting failures are
        `AgentUnavailable(delivered=False)`: nothing was sent."""
        now = time.monotonic()
        while True:
            with self._lock:
                if self._closed:
                    raise AgentUnavailable(f"the client of {self.socket_path} is closed", delivered=False)
                if not self._idle:
                    break
                conn, since = self._idle.pop()
            if now - since <= REUSE_IDLE_S and not conn.closed_by_peer() and self._still_answers(conn, now - since):
                return conn, True
            conn.close()
        conn = _UnixConnection(self.socket_path, connect_timeout_s, self.expected_peer, self.connector)
        try:
            conn.connect()
        except OSError as exc:  # refused, no socket, timeout, permission
            conn.close()
            raise AgentUnavailable(f"agent socket {self.socket_path} does not answer: {exc!r}", delivered=False) from exc
        except AgentUnavailable:
            conn.close()
            raise
        if not self._still_answers(conn, NEW_CONNECTION):
            conn.close()
            raise AgentUnavailable(f"nothing answers behind the new connection to {self.socket_path}", delivered=False)
        return conn, False

    def _still_answers(self, conn: _UnixConnection, idle_s: float) -> bool:
        """A forwarded connection idle for a while answers `/health` before it is reused."""
        if self.connector is None or idle_s < VERIFY_IDLE_S:
            return True
        try:
            assert conn.sock is not None
            conn.within(VERIFY_TIMEOUT_S)
            conn.request("GET", "/health", headers={"Authorization": self._authorization})
            raw = conn.getresponse()
            length = raw.getheader("Content-Length") or ""
            if not length.isdigit() or int(length) > HEALTH_MAX_BYTES:
                return False  # the caller closes it: nothing unread is left for the next call
            raw.read(int(length))
            return raw.status == 200 and not raw.will_close
        except (OSError, http.client.HTTPException, AssertionError):
            return False

    def _checkin(self, conn: _UnixConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def _send(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        accept: str | None = None,
        timeout_s: float | None = None,
        sink: BinaryIO | None = None,
    ) -> _Answer:
        timeout = self._timeout_s if timeout_s is None else timeout_s
        conn, reused = self._checkout(min(timeout, self._connect_timeout_s))
        headers = {"Authorization": self._authorization}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if accept is not None:
            headers["Accept"] = accept
        try:
            assert conn.sock is not None
            conn.within(timeout)
            conn.request(method, url, body=body, headers=headers)
            raw = conn.getresponse()
            length = answer_length(
                raw.getheader("Content-Length"), raw.chunked, body_limit(self.answer_limits, accept), self.socket_path
            )
            spooled = None
            if sink is not None and raw.status == 200 and _content_type(raw.getheader("Content-Type")) == OCTET_STREAM:
                content, spooled = b"", _copy_body(raw, length, sink)
            else:
                content = raw.read(length)
        except AgentToolError:
            conn.close()  # the rest of the answer stays unread
            raise
        except TimeoutError as exc:
            conn.close()
            raise AgentTimedOut(f"agent at {self.socket_path} did not answer within {timeout:g} s") from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            # Once bytes may have left, the tool may have run: never "certainly not delivered".
            kind = "a reused" if reused else "a new"
            raise AgentUnavailable(
                f"agent at {self.socket_path} failed mid-request on {kind} connection: {exc!r}", delivered=True
            ) from exc
        except BaseException:  # the sink failed (a full disk): the rest of the answer stays unread
            conn.close()
            raise
        if raw.will_close or (len(content) if spooled is None else spooled) != length:
            conn.close()
        else:
            self._checkin(conn)
        return _Answer(
            raw.status, _content_type(raw.getheader("Content-Type")), raw.getheader(RAW_RESULT_HEADER) or "", content,
            spooled,
        )  # fmt: skip

    # --- the API ----------------------------------------------------------------------------

    def health(self, *, timeout_s: float | None = None) -> Health:
        return health_of(self._send("GET", "/health", timeout_s=timeout_s))

    def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        cwd: str,
        context: CallContext | None = None,
        timeout_s: float | None = None,
        sink: BinaryIO | None = None,
    ) -> Any:
        """The tool's result (`read_bytes`: a `ReadBytesResult`); raises `AgentToolError` for a
        tool-level failure and `AgentUnavailable` when the agent could not be reached. With a
        `sink`, read_bytes' raw bytes are written to it in pieces as they arrive (never held
        whole) and the result's `data` is empty."""
        accept = OCTET_STREAM if tool == "read_bytes" else None
        sink = sink if tool == "read_bytes" else None
        url = f"/v1/tools/{tool}"
        body = tool_request(arguments, cwd, context)
        answer = self._send("POST", url, body=body, accept=accept, timeout_s=timeout_s, sink=sink)
        if refused_context(answer, context):
            body = tool_request(arguments, cwd, None)
            answer = self._send("POST", url, body=body, accept=accept, timeout_s=timeout_s, sink=sink)
        return tool_result(tool, answer, self.answer_limits)

    def cancel(self, *, run_id: str | None = None, session_id: str | None = None, timeout_s: float = CANCEL_TIMEOUT_S) -> int:
        """Kill the matching in-flight calls' process trees; how many calls were cancelled."""
        body = cancel_request(run_id, session_id)
        return cancelled_of(self._send("POST", CANCEL_PATH, body=body, timeout_s=timeout_s))


# --- the asyncio client ---------------------------------------------------------------------


class RawSpool(Protocol):
    """Where the asyncio client writes a large raw `read_bytes` answer instead of holding it:
    answers of at least `min_bytes` go to the file `open` gives once their length is known
    (it may wait, e.g. for a transfer slot; reading the socket is paused meanwhile); smaller
    ones are read whole as before. `open` is called once per attempt and must hand back an
    empty file each time."""

    min_bytes: int

    async def open(self, length: int) -> BinaryIO: ...


@dataclass
class _Stream:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    loop: asyncio.AbstractEventLoop
    since: float = 0.0

    def usable(self, loop: asyncio.AbstractEventLoop, now: float) -> bool:
        # A connection belongs to the loop it was opened on; an idle one the agent closed has
        # seen its EOF (the loop ran since), so it is never sent a request that would have to
        # be reported as "may have run".
        return (
            self.loop is loop
            and now - self.since <= REUSE_IDLE_S
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.writer.close()
        else:  # from another thread (an agent stopped by a worker): on its own loop
            try:
                self.loop.call_soon_threadsafe(self.writer.close)
            except RuntimeError:
                pass


async def _read_head(stream: _Stream) -> tuple[str, int, dict[str, str]]:
    """The status line and headers of one answer: (HTTP version, status, lower-cased headers)."""
    head = await stream.reader.readuntil(b"\r\n\r\n")  # LimitOverrunError past the stream's buffer
    if len(head) > HEADER_MAX_BYTES:
        raise ValueError(f"the answer's headers are {len(head)} bytes, more than {HEADER_MAX_BYTES}")
    lines = head[:-4].decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1 status line: {lines[0][:80]!r}")
    status = int(rest[:3])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"not a header line: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return version, status, headers


async def _read_answer(
    stream: _Stream, limits: AnswerLimits, accept: str | None, socket_path: str, spool: RawSpool | None = None,
    deadline: asyncio.Timeout | None = None,
) -> tuple[_Answer, bool]:  # fmt: skip
    """One answer, read to its announced length at most; and whether the agent keeps the
    connection open. A large raw answer goes to `spool` when one is given (`RawSpool`)."""
    version, status, headers = await _read_head(stream)
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length = answer_length(headers.get("content-length"), chunked, body_limit(limits, accept), socket_path)
    content_type = _content_type(headers.get("content-type"))
    keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
    spooled = None
    if spool is not None and status == 200 and content_type == OCTET_STREAM and length >= spool.min_bytes:
        content, spooled = b"", await _spool_body(stream, length, spool, deadline)
        keep = keep and spooled == length
    else:
        content = await stream.reader.readexactly(length) if length else b""
    answer = _Answer(status, content_type, headers.get(RAW_RESULT_HEADER.lower(), ""), content, spooled)
    return answer, keep


async def _spool_body(stream: _Stream, length: int, spool: RawSpool, deadline: asyncio.Timeout | None) -> int:
    """Copy `length` bytes of the body into the spool's file in pieces; how many arrived
    (fewer: the agent hung up early, and the caller refuses the answer as the size disagrees).
    The call's `deadline` stops while `open` waits (the spool bounds its own wait) and goes
    on after it: the agent has answered, and a wait for a slot must not pass for an agent
    that missed its deadline (which would replace the user's sandbox)."""
    transport = stream.writer.transport
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
    while copied < length:
        piece = await stream.reader.read(min(SPOOL_CHUNK, length - copied))
        if not piece:
            break
        sink.write(piece)  # page cache: a 256 KiB write costs tens of microseconds
        copied += len(piece)
    return copied


async def _connected_in_thread(connector: Connector, timeout_s: float, where: str) -> socket.socket:
    """A connector's socket, opened in a worker thread (it blocks: a TLS and websocket
    handshake). One that arrives after the timeout is closed, not leaked."""
    future = asyncio.get_running_loop().run_in_executor(None, connector, timeout_s)
    try:
        async with asyncio.timeout(timeout_s + 1.0):
            sock = await asyncio.shield(future)
    except TimeoutError:
        future.add_done_callback(lambda done: done.exception() is None and done.result().close())
        raise AgentUnavailable(f"the agent at {where} did not answer within {timeout_s:g} s", delivered=False) from None
    except OSError as exc:
        raise AgentUnavailable(f"the agent at {where} does not answer: {exc!r}", delivered=False) from exc
    sock.setblocking(False)
    return sock


class AsyncAgentClient(_AgentClientBase):
    """The agent client for the event loop. Not thread-safe: use it from the loop that runs
    the calls (a connection opened on one loop is never reused on another)."""


    def close(self) -> None:
        """Safe from any thread; calls under way end with AgentUnavailable."""
        self._closed = True
        idle, self._idle = self._idle, []
        for stream in idle:
            stream.close()

    async def _checkout(self) -> tuple[_Stream, bool]:
        if self._closed:
            raise AgentUnavailable(f"the client of {self.socket_path} is closed", delivered=False)
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        while self._idle:
            stream = self._idle.pop()
            if stream.usable(loop, now) and await self._still_answers(stream, now - stream.since):
                return stream, True
            stream.close()
        if self.connector is not None:
            sock = await _connected_in_thread(self.connector, self._connect_timeout_s, self.socket_path)
            reader, writer = await asyncio.open_connection(sock=sock, limit=STREAM_BUFFER_BYTES)
            stream = _Stream(reader, writer, loop)
            if not await self._still_answers(stream, NEW_CONNECTION):
                stream.close()
                raise AgentUnavailable(f"nothing answers behind the new connection to {self.socket_path}", delivered=False)
            return stream, False
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                with reachable(self.socket_path) as short:
                    reader, writer = await asyncio.open_unix_connection(short, limit=STREAM_BUFFER_BYTES)
        except (OSError, TimeoutError) as exc:  # refused, no socket, permission, backlog full
            raise AgentUnavailable(f"agent socket {self.socket_path} does not answer: {exc!r}", delivered=False) from exc
        stream = _Stream(reader, writer, loop)
        try:
            check_peer(writer.get_extra_info("socket"), self.expected_peer, self.socket_path)
        except BaseException:
            writer.close()
            raise
        return stream, False

    async def _still_answers(self, stream: _Stream, idle_s: float) -> bool:
        """A forwarded connection idle for a while answers `/health` before it is reused."""
        if self.connector is None or idle_s < VERIFY_IDLE_S:
            return True
        try:
            async with asyncio.timeout(VERIFY_TIMEOUT_S) as deadline:
                stream.writer.write(f"GET /health HTTP/1.1\r\n{self._head}\r\n".encode("latin-1"))
                answer, keep = await _read_answer(stream, self.answer_limits, None, self.socket_path, None, deadline)
        except (OSError, EOFError, ValueError, TimeoutError, AgentToolError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            return False
        return answer.status == 200 and keep

    def _checkin(self, stream: _Stream) -> None:
        if self._closed or len(self._idle) >= MAX_IDLE_CONNECTIONS:
            stream.close()
            return
        stream.since = time.monotonic()
        self._idle.append(stream)

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
        """One request and its answer; with `on_output`, the answer is a streamed call's
        (`_read_streamed`); with `spool`, a large raw answer goes there (`RawSpool`)."""
        timeout = self._timeout_s if timeout_s is None else timeout_s
        stream, reused = await self._checkout()
        head = f"{method} {url} HTTP/1.1\r\n{self._head}"
        if accept is not None:
            head += f"Accept: {accept}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        keep = False
        try:
            async with asyncio.timeout(timeout) as deadline:
                stream.writer.write(head.encode("latin-1") + b"\r\n" + (body or b""))
                if on_output is None:
                    limits = self.answer_limits
                    answer, keep = await _read_answer(stream, limits, accept, self.socket_path, spool, deadline)
                else:
                    answer, keep = await _read_streamed(stream, self.answer_limits, self.socket_path, on_output)
        except AgentToolError:
            raise  # an answer refused unread: the connection is closed below
        except TimeoutError as exc:
            raise AgentTimedOut(f"agent at {self.socket_path} did not answer within {timeout:g} s") from exc
        except (OSError, EOFError, ValueError, asyncio.LimitOverrunError, asyncio.IncompleteReadError) as exc:
            # Once bytes may have left, the tool may have run: never "certainly not delivered".
            kind = "a reused" if reused else "a new"
            raise AgentUnavailable(
                f"agent at {self.socket_path} failed mid-request on {kind} connection: {exc!r}", delivered=True
            ) from exc
        finally:
            if keep:
                self._checkin(stream)
            else:  # also on cancellation: a half-read answer must never meet the next request
                stream.close()
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
        """As `AgentClient.call`, without holding a thread while the agent works. With a
        `spool`, a large raw read_bytes answer goes to its file (`RawSpool`) and the result's
        `data` is empty."""
        accept = OCTET_STREAM if tool == "read_bytes" else None
        spool = spool if tool == "read_bytes" else None
        url = f"/v1/tools/{tool}"
        body = tool_request(arguments, cwd, context)
        answer = await self._send("POST", url, body=body, accept=accept, timeout_s=timeout_s, spool=spool)
        if refused_context(answer, context):
            body = tool_request(arguments, cwd, None)
            answer = await self._send("POST", url, body=body, accept=accept, timeout_s=timeout_s, spool=spool)
        return tool_result(tool, answer, self.answer_limits)

    async def cancel(self, *, run_id: str | None = None, session_id: str | None = None, timeout_s: float = CANCEL_TIMEOUT_S) -> int:
        body = cancel_request(run_id, session_id)
        return cancelled_of(await self._send("POST", CANCEL_PATH, body=body, timeout_s=timeout_s))

    async def open_port(self, port: int, *, timeout_s: float) -> tuple[socket.socket, bytes]:
        """A stream to 127.0.0.1:`port` inside the sandbox (`sandbox_agent.port_tunnel`), on a
        connection of its own (never pooled): the connected socket, non-blocking, and any bytes
        of the port's that already came with the agent's answer. Raises `AgentToolError`
        `port_not_listening` when nothing accepts there, `AgentUnavailable` when the agent
        cannot be reached or refuses."""
        loop = asyncio.get_running_loop()
        if self.connector is not None:
            sock = await _connected_in_thread(self.connector, min(timeout_s, self._connect_timeout_s), self.socket_path)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                async with asyncio.timeout(min(timeout_s, self._connect_timeout_s)):
                    with reachable(self.socket_path) as short:
                        await loop.sock_connect(sock, short)
                check_peer(sock, self.expected_peer, self.socket_path)
            except (OSError, TimeoutError) as exc:
                sock.close()
                raise AgentUnavailable(f"agent socket {self.socket_path} does not answer: {exc!r}", delivered=False) from exc
            except BaseException:
                sock.close()
                raise
        try:
            async with asyncio.timeout(timeout_s):
                request = f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {self._authorization}\r\n\r\n"
                await loop.sock_sendall(sock, request.encode("latin-1"))
                received = b""
                while (end := received.find(b"\r\n\r\n")) < 0:
                    if len(received) > HEADER_MAX_BYTES:
                        raise ValueError("the agent's answer to CONNECT has no end of head")
                    piece = await loop.sock_recv(sock, 4096)
                    if not piece:
                        raise EOFError("the agent closed the tunnel before answering")
                    received += piece
            status_line = received[:end].split(b"\r\n", 1)[0].decode("latin-1")
            status = int(status_line.split(" ", 2)[1]) if status_line.startswith("HTTP/1.") else 0
        except BaseException as exc:
            sock.close()
            if isinstance(exc, (OSError, EOFError, ValueError, TimeoutError, IndexError)):
                raise AgentUnavailable(f"agent at {self.socket_path} failed to open port {port}: {exc!r}", delivered=True) from exc
            raise
        if status == 200:
            return sock, received[end + 4 :]
        sock.close()
        body = received[end + 4 :]
        if status == 503:
            raise AgentToolError("port_not_listening", f"Nothing accepts connections on port {port} in the sandbox.")
        if status == 401:
            raise AgentUnavailable("the agent rejected the token", delivered=False)
        raise AgentToolError("agent_error", f"The sandbox agent answered {status} to a tunnel to port {port}: {body[:200]!r}")

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
        answer = await self._send(
            "POST", f"/v1/tools/{tool}", body=body, accept=NDJSON, timeout_s=timeout_s, on_output=on_output
        )
        return tool_result(tool, answer, self.answer_limits)


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


async def _read_streamed(
    stream: _Stream, limits: AnswerLimits, socket_path: str, on_output: Callable[[str, str], None]
) -> tuple[_Answer, bool]:
    """A chunked NDJSON answer: output lines to `on_output`, the result line as the answer."""
    version, status, headers = await _read_head(stream)
    keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
    content_type = _content_type(headers.get("content-type"))
    if "chunked" not in headers.get("transfer-encoding", "").lower() or content_type != NDJSON:
        length = answer_length(headers.get("content-length"), False, limits.max_json_bytes, socket_path)
        content = await stream.reader.readexactly(length) if length else b""
        return _Answer(status, content_type, "", content), keep
    budget = limits.max_json_bytes + limits.max_stream_bytes
    pending = bytearray()
    result: bytes | None = None
    while True:
        size_line = await stream.reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            await stream.reader.readuntil(b"\r\n")  # no trailers: the empty line
            break
        budget -= size
        if budget < 0:
            raise AgentToolError("output_too_large", f"The sandbox agent at {socket_path} streamed more than it may; refused.")
        pending += await stream.reader.readexactly(size)
        if await stream.reader.readexactly(2) != b"\r\n":
            raise ValueError("a chunk without its CRLF")
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
    return _Answer(status, "application/json", "", result), keep

