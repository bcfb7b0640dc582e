"""The streamable-HTTP side of the runs' MCP server: the SDK's transport, stateless.

The HTTP layer (orchestrator/http/routes_mcp.py) checks the token, the run id and
`X-Acting-User` first and hands the caller in; it rides in the ASGI scope to the handlers
(orchestrator/mcp/caller.py). Every POST is answered on its own, so a run's endpoint keeps no
MCP session state and survives a restart; the run is the state. A request that asks for
progress (a `progressToken` in its body) is answered as an SSE stream, which can carry the
notifications; every other one as plain JSON, which costs the client far less to read
(docs/performance.md, "MCP").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import Receive, Scope, Send

from orchestrator.mcp.caller import SCOPE_KEY, McpCaller
from orchestrator.mcp.server import McpParts, RunMcpServer

if TYPE_CHECKING:
    from orchestrator.settings import ApiSettings

# Without auth the server listens on loopback only (orchestrator serve): a browser page could
# still reach it by DNS rebinding, so then the Host and Origin headers must be loopback ones.
LOOPBACK_ONLY = TransportSecuritySettings(
    enable_dns_rebinding_protection=True,
    allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]"],
    allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
)


class McpEndpoint:
    """`running()` goes into the app's lifespan; `handle()` serves one checked request."""

    def __init__(self, parts: McpParts, api: ApiSettings, *, body_max: int) -> None:
        """`api`: the HTTP layer's settings, of which the endpoint reads whether tokens are
        checked, the progress interval and the largest shell timeout. `body_max`: the largest
        POST, the request guard's cap of this route (a tools/call may carry a file, like a plain
        tool call); the SDK checks it again."""
        self.mcp = RunMcpServer(
            parts, progress_interval_s=api.mcp_progress_interval_s, shell_timeout_max_s=api.tool_timeout_max_s
        )
        self._security = None if api.auth_enabled else LOOPBACK_ONLY
        self._body_max = body_max
        # (json, stream) managers of each lifespan now running, innermost last: the SDK's
        # manager runs once per instance, and an app's lifespan may be entered again (a second
        # test client of the same app, nested in the first).
        self._running: list[tuple[StreamableHTTPSessionManager, StreamableHTTPSessionManager]] = []

    def _manager(self, *, json_response: bool) -> StreamableHTTPSessionManager:
        return StreamableHTTPSessionManager(
            app=self.mcp.server,
            stateless=True,
            json_response=json_response,
            security_settings=self._security,
            max_request_body_size=self._body_max,
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        managers = (self._manager(json_response=True), self._manager(json_response=False))
        async with managers[0].run(), managers[1].run():
            self._running.append(managers)
            try:
                yield
            finally:
                self._running.remove(managers)

    async def handle(self, caller: McpCaller, scope: Scope, receive: Receive, send: Send, *, stream: bool) -> None:
        """Serve a POST for `caller`, as an SSE stream or as plain JSON (`wants_stream`)."""
        if not self._running:
            raise RuntimeError("the MCP endpoint serves only while the app's lifespan runs")
        scope[SCOPE_KEY] = caller
        json_manager, stream_manager = self._running[-1]
        await (stream_manager if stream else json_manager).handle_request(scope, receive, send)


def wants_stream(body: bytes) -> bool:
    """Pure: whether a POST is answered as an SSE stream: when it asks for progress. A
    `progressToken` inside an argument (a file's content) only costs a stream, never a notice."""
    return b'"progressToken"' in body
