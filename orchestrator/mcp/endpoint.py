"""`/v1/runs/{run_id}/mcp`: the streamable-HTTP MCP endpoint of a run.

The bearer token, the run id and `X-Acting-User` are checked here, as the run's tool route
checks them, before the SDK's transport sees the request; then the caller rides in the ASGI
scope to the handlers (orchestrator/mcp/caller.py). The transport is stateless: every POST is
answered on its own, so a run's endpoint keeps no MCP session state and survives a restart;
the run is the state. A request that asks for progress (a `progressToken` in its body) is
answered as an SSE stream, which can carry the notifications; every other one as plain JSON,
which costs the client far less to read (docs/performance.md, "MCP").
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.concurrency import run_in_threadpool
from starlette.types import Message, Receive, Scope, Send

from mounts import ids
from orchestrator.errors import InvalidInput, OrchestratorError, Unauthorized
from orchestrator.http.acting import own_run
from orchestrator.http.auth import caller_for, parse_acting_user
from orchestrator.mcp.caller import SCOPE_KEY, McpCaller
from orchestrator.mcp.server import RunMcpServer

PATH = "/v1/runs/{run_id}/mcp"
METHODS = ["GET", "POST", "DELETE"]
# Without auth the server listens on loopback only (orchestrator serve): a browser page could
# still reach it by DNS rebinding, so then the Host and Origin headers must be loopback ones.
LOOPBACK_ONLY = TransportSecuritySettings(
    enable_dns_rebinding_protection=True,
    allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]"],
    allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
)


class McpEndpoint:
    """The ASGI app of the route; `running()` goes into the FastAPI app's lifespan."""

    def __init__(self, service: Any) -> None:
        self._service = service
        self.mcp = RunMcpServer(service, progress_interval_s=service.settings.mcp_progress_interval_s)
        self._body_max = service.settings.read_bytes_max + 1024 * 1024  # a tools/call carries a file at most
        self._json, self._stream = (
            StreamableHTTPSessionManager(
                app=self.mcp.server,
                stateless=True,
                json_response=json_response,
                security_settings=None if service.settings.auth_enabled else LOOPBACK_ONLY,
                max_request_body_size=self._body_max,
            )
            for json_response in (True, False)
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self._json.run(), self._stream.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            scope[SCOPE_KEY] = await self._caller(scope)
        except OrchestratorError as exc:
            await _refuse(send, exc)
            return
        if scope["method"] != "POST":
            await self._stream.handle_request(scope, receive, send)
            return
        body = await _read_body(receive, self._body_max)
        if body is None:
            await _refuse(send, PayloadTooLarge(f"the request body is larger than this route takes ({self._body_max} bytes)"))
            return
        manager = self._stream if wants_stream(body) else self._json
        await manager.handle_request(scope, _replay(body, receive), send)

    async def _caller(self, scope: Scope) -> McpCaller:
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        authorization = [v for k, v in headers if k == "authorization"]
        caller = caller_for(self._service, authorization[0] if len(authorization) == 1 else None)
        if caller is None:
            raise Unauthorized("missing or wrong bearer token")
        try:
            run_id = ids.session_id(scope.get("path_params", {}).get("run_id"), "run_id")
        except ids.InvalidIdentifier as exc:
            raise InvalidInput(exc.message, field=exc.field) from None
        acting = parse_acting_user([v for k, v in headers if k == "x-acting-user"])
        if acting is not None:  # the person of the run only, as on the tool route
            await run_in_threadpool(own_run, self._service, run_id, acting)
        return McpCaller(run_id=run_id, actor=caller.actor, acting_user=acting)


def wants_stream(body: bytes) -> bool:
    """Pure: whether a POST is answered as an SSE stream: when it asks for progress. A
    `progressToken` inside an argument (a file's content) only costs a stream, never a notice."""
    return b'"progressToken"' in body


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body (the request guard has it in memory already), None past `limit`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands `body` on once, then waits for the client's disconnect (the SSE
    answer watches for it)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


class PayloadTooLarge(OrchestratorError):
    status_code = 413
    code = "payload_too_large"


async def _refuse(send: Send, exc: OrchestratorError) -> None:
    """An HTTP refusal in the API's error shape (the client never reached MCP)."""
    body = json.dumps({"error": exc.body()}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if exc.status_code == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
