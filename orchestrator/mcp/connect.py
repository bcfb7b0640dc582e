"""A client of a run's MCP endpoint, over the SDK's streamable-HTTP transport: what the stdio
relay, the benchmark and a bot written in Python use (docs/mcp.md has the same few lines)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from urllib.parse import urlencode

import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

# A long shell call answers late: the read timeout is the server's largest tool timeout and more.
READ_TIMEOUT_S = 900.0


def run_endpoint(base_url: str, run_id: str, tools: Sequence[str] | None = None) -> str:
    """The run's MCP URL; with `tools`, its tools/list offers only those."""
    url = f"{base_url.rstrip('/')}/v1/runs/{run_id}/mcp"
    return url if tools is None else f"{url}?{urlencode({'tools': ','.join(tools)})}"


@asynccontextmanager
async def run_session(
    base_url: str, run_id: str, token: str | None, *, headers: dict[str, str] | None = None, tools: Sequence[str] | None = None
) -> AsyncIterator[tuple[ClientSession, types.InitializeResult]]:
    """An initialized MCP client session of the run, and the server's initialize answer."""
    sent = dict(headers or {})
    if token:
        sent["Authorization"] = f"Bearer {token}"
    timeout = httpx2.Timeout(30.0, read=READ_TIMEOUT_S)
    try:
        async with httpx2.AsyncClient(headers=sent, timeout=timeout) as http:
            async with streamable_http_client(run_endpoint(base_url, run_id, tools), http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    initialized = await session.initialize()
                    yield session, initialized
    except BaseExceptionGroup as group:
        # The transport's task groups wrap what went wrong; one error is raised as itself
        # (an MCPError of an ended run, an HTTP error), so callers can catch it by type.
        sole = _sole(group)
        if sole is None:
            raise
        raise sole from None


def _sole(group: BaseExceptionGroup) -> BaseException | None:
    """Pure: the one leaf exception of nested groups, or None when there are several."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    return leaves[0] if len(leaves) == 1 else None
