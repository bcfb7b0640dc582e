"""The orchestrator's client of one agent: HTTP/1.1 over the agent's Unix socket.

It is on the hot path of every tool call, so it uses the standard library's `http.client`
on a small pool of keep-alive connections: measured against the same agent, an httpx client
spent 0.70 ms of CPU per small call, httpcore 0.39 ms and `http.client` 0.22 ms
(docs/performance.md). Thread-safe: each call takes an idle connection or opens one.

`read_bytes` answers arrive as raw bytes (`Accept: application/octet-stream`; the other
fields in the `X-Tool-Result` header), not as base64 in JSON.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandbox_agent.errors import AgentToolError, AgentUnavailable
from sandbox_agent.wire import RAW_RESULT_HEADER, CallContext, CancelRequest, CancelResult, Health, ReadBytesResult

OCTET_STREAM = "application/octet-stream"
CANCEL_TIMEOUT_S = 30.0  # the agent answers once the cancelled calls ended (it waits up to 10 s)
# The agent closes connections idle for 5 s (uvicorn timeout_keep_alive); one idle for longer
# than this is not reused, so a request never races the agent's close.
REUSE_IDLE_S = 3.0
MAX_IDLE_CONNECTIONS = 8


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, connect_timeout_s: float) -> None:
        super().__init__("sandbox-agent", timeout=connect_timeout_s)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def closed_by_peer(self) -> bool:
        """An idle connection that is readable has been closed (or broken) by the agent."""
        if self.sock is None:
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


class _Response:
    __slots__ = ("status", "content_type", "headers", "content")

    def __init__(self, raw: http.client.HTTPResponse, content: bytes) -> None:
        self.status = raw.status
        self.headers = raw.headers
        self.content_type = (raw.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        self.content = content


class AgentClient:
    def __init__(
        self,
        socket_path: str | Path,
        token: str,
        *,
        timeout_s: float = 660.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.socket_path = str(socket_path)
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._authorization = f"Bearer {token}"
        self._idle: list[tuple[_UnixConnection, float]] = []
        self._lock = threading.Lock()
        self._closed = False

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
            if now - since <= REUSE_IDLE_S and not conn.closed_by_peer():
                return conn, True
            conn.close()
        conn = _UnixConnection(self.socket_path, connect_timeout_s)
        try:
            conn.connect()
        except OSError as exc:  # refused, no socket, timeout, permission
            conn.close()
            raise AgentUnavailable(f"agent socket {self.socket_path} does not answer: {exc!r}", delivered=False) from exc
        return conn, False

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
    ) -> _Response:
        timeout = self._timeout_s if timeout_s is None else timeout_s
        conn, reused = self._checkout(min(timeout, self._connect_timeout_s))
        headers = {"Authorization": self._authorization}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if accept is not None:
            headers["Accept"] = accept
        try:
            assert conn.sock is not None
            conn.sock.settimeout(timeout)
            conn.request(method, url, body=body, headers=headers)
            raw = conn.getresponse()
            content = raw.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            # Once bytes may have left, the tool may have run: never "certainly not delivered".
            kind = "a reused" if reused else "a new"
            raise AgentUnavailable(
                f"agent at {self.socket_path} failed mid-request on {kind} connection: {exc!r}", delivered=True
            ) from exc
        if raw.will_close:
            conn.close()
        else:
            self._checkin(conn)
        return _Response(raw, content)

    # --- the API ----------------------------------------------------------------------------

    def health(self, *, timeout_s: float | None = None) -> Health:
        response = self._send("GET", "/health", timeout_s=timeout_s)
        if response.status != 200:
            raise AgentUnavailable(f"agent health answered {response.status}", delivered=True)
        try:
            return Health.model_validate_json(response.content)
        except ValidationError as exc:
            raise AgentUnavailable(f"agent health answered something else: {exc}", delivered=True) from None

    def cancel(self, *, run_id: str | None = None, session_id: str | None = None) -> int:
        """Kill the calls in flight for this run or session (whole process trees); returns how
        many there were, once they have ended. `AgentUnavailable` when the agent cannot say."""
        body = CancelRequest(run_id=run_id, session_id=session_id).model_dump_json().encode()
        response = self._send("POST", "/v1/calls/cancel", body=body, timeout_s=CANCEL_TIMEOUT_S)
        if response.status != 200:
            raise AgentUnavailable(f"agent cancel answered {response.status}", delivered=True)
        try:
            return CancelResult.model_validate_json(response.content).cancelled
        except ValidationError as exc:
            raise AgentUnavailable(f"agent cancel answered something else: {exc}", delivered=True) from None

    def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        cwd: str,
        timeout_s: float | None = None,
        context: CallContext | None = None,
    ) -> Any:
        """The tool's result (`read_bytes`: a `ReadBytesResult`); raises `AgentToolError` for a
        tool-level failure and `AgentUnavailable` when the agent could not be reached."""
        request: dict[str, Any] = {"arguments": arguments, "cwd": cwd}
        if context is not None:
            request["context"] = context.model_dump()
        raw_bytes = tool == "read_bytes"
        url, accept = f"/v1/tools/{tool}", OCTET_STREAM if raw_bytes else None
        response = self._send("POST", url, body=json.dumps(request).encode(), accept=accept, timeout_s=timeout_s)
        if response.status == 422 and "context" in request:
            # An agent of an earlier BUILD (it serves until idle) refused the field before
            # running anything: send the call as it knows it.
            del request["context"]
            response = self._send("POST", url, body=json.dumps(request).encode(), accept=accept, timeout_s=timeout_s)
        if response.status == 200 and response.content_type == OCTET_STREAM and raw_bytes:
            return _raw_result(response)
        try:
            payload = json.loads(response.content)
        except ValueError:
            raise AgentUnavailable(
                f"agent answered {response.status} with a body that is not JSON", delivered=True
            ) from None
        if response.status == 200 and isinstance(payload, dict) and "ok" in payload:
            if payload["ok"]:
                result = payload.get("result")
                if not raw_bytes:
                    return result
                try:  # an agent of an earlier BUILD (it serves until idle) answers in JSON
                    return ReadBytesResult.from_json_result(result)
                except ValueError as exc:
                    raise AgentToolError("agent_error", f"The sandbox agent {exc}") from None
            error = dict(payload.get("error") or {})
            code = str(error.pop("code", "agent_error"))
            message = str(error.pop("message", "the sandbox agent reported an error"))
            path = error.pop("path", None)
            raise AgentToolError(code, message, path, **error)
        error = payload.get("error", {}) if isinstance(payload, dict) else {}
        if response.status == 401:
            raise AgentUnavailable("the agent rejected the token", delivered=False)
        if response.status == 404:
            raise AgentToolError("unknown_tool", f"The sandbox agent has no tool {tool}.")
        if response.status == 422:
            raise AgentToolError("invalid_arguments", f"The sandbox agent refused the request: {error or payload}")
        raise AgentToolError(
            "agent_error", f"The sandbox agent answered {response.status}: {error.get('message', payload)}"
        )


def _raw_result(response: _Response) -> ReadBytesResult:
    try:
        return ReadBytesResult.from_raw(response.headers.get(RAW_RESULT_HEADER) or "", response.content)
    except ValueError as exc:
        raise AgentToolError("agent_error", f"The sandbox agent answered read_bytes without usable fields: {exc}") from None
