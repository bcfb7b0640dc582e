"""The agent's tools (SPEC §6). Each takes a `ToolContext` and its validated arguments and
returns a JSON-able result, or raises `AgentToolError`."""
