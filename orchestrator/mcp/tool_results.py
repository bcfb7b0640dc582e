"""Pure mappings between the tool registry's shapes and MCP's: the tool list and a call's result.

Both surfaces come from the registry's one description (`ToolRegistry.describe`, which also
answers GET /v1/tools), so a tool's name, description and input schema cannot drift apart.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from orchestrator.mcp.annotations import hints_for


def mcp_tools(described: list[dict[str, Any]]) -> list[types.Tool]:
    """The registry's tools as MCP tools. A tool without an annotation decision is left out
    rather than sent without hints (a test keeps the table complete)."""
    tools = []
    for tool in described:
        hints = hints_for(tool["name"])
        if hints is None:
            continue
        tools.append(
            types.Tool(
                name=tool["name"],
                description=tool["description"],
                input_schema=tool["parameters"],
                annotations=hints.annotations(),
                meta={"acts_as": tool["acts_as"], "place": tool["place"]},
            )
        )
    return tools


def call_result(body: dict[str, Any]) -> types.CallToolResult:
    """A dispatcher outcome (`{"ok": true, "result"}` or `{"ok": false, "error"}`) as an MCP
    result. A failure is `isError` with our diagnostic message as its text, so the model reads
    exactly what it reads over the plain API; the whole error (code, url, ...) is the
    structured content."""
    if not body.get("ok"):
        error = body.get("error") or {}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=str(error.get("message", "the tool call failed")))],
            structured_content=error,
            is_error=True,
        )
    result = body.get("result")
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    # structuredContent is a JSON object by the spec: a non-object result is wrapped.
    structured = result if isinstance(result, dict) else {"result": result}
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=structured)
