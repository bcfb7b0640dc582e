"""The agent's tools. Each takes a `ToolContext` and its validated arguments and
returns a JSON-able result, or raises `AgentToolError`."""
