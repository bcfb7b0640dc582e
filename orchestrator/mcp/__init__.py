"""The Model Context Protocol surface of a run (docs/mcp.md): the streamable-HTTP endpoint, the
tool and skill-resource mappings, and the `orchestrator mcp` stdio relay."""
