"""The container tools: they run in the acting user's sandbox agent. They are
declared once, in `sandbox_agent.wire.CONTAINER_TOOLS`; their argument models are the wire
models the agent validates with, so the schema `GET /v1/tools` shows is exactly what the agent
accepts."""

from __future__ import annotations

from sandbox_agent import wire

from orchestrator.tools.registry import ToolPlace, ToolRegistry, ToolSpec

CONTAINER_TOOL_SPECS = tuple(
    ToolSpec(tool.name, tool.description, tool.arguments, ToolPlace.CONTAINER) for tool in wire.CONTAINER_TOOLS
)


def register_container_tools(registry: ToolRegistry) -> None:
    for spec in CONTAINER_TOOL_SPECS:
        registry.register(spec)
