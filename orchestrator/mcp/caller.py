"""Who an MCP request acts for: established by the HTTP endpoint before the SDK sees the
request, read back by the handlers from the request's ASGI scope (the SDK runs handlers in
tasks of its own, so a context variable of the request would not reach them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcp.shared.exceptions import MCPError

import mcp_types as types

SCOPE_KEY = "orchestrator.mcp_caller"


@dataclass(frozen=True)
class McpCaller:
    run_id: str  # validated by mounts.ids
    actor: str  # bot | admin | local, as the audit names it
    acting_user: int | None  # X-Acting-User, checked against the run already
    tools: frozenset[str] | None = None  # `?tools=a,b` on the endpoint's URL: only these are listed


def caller_of(ctx: Any) -> McpCaller:
    request = getattr(ctx, "request", None)
    caller = request.scope.get(SCOPE_KEY) if request is not None else None
    if not isinstance(caller, McpCaller):  # only reachable if the SDK stops passing the request on
        raise MCPError(types.INTERNAL_ERROR, "the MCP request reached no run")
    return caller
