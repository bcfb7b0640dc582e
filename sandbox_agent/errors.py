"""Errors of the agent and of its client, free of any orchestrator type.

`ToolFailure` is a tool-level failure the model should see (`{code, message, path}`) as a
value: a call's result is the tool's result or a `ToolFailure`, carried to the bot as it is.
`AgentToolError` raises one where a value cannot travel (the agent's tools, the client's own
reading of an answer, the sync façade). `AgentUnavailable` means the agent could not be
reached or did not answer properly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolFailure:
    code: str
    message: str
    path: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        # `path` only when the error is about one: a null key on every other error reads as
        # "the path was null" (the host's errors name their field the same way).
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.path is not None:
            body["path"] = self.path
        body.update(self.details)
        return body

    def raised(self) -> AgentToolError:
        return AgentToolError(self.code, self.message, self.path, **self.details)


class AgentToolError(Exception):
    def __init__(self, code: str, message: str, path: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.path = path
        self.details = details

    def failure(self) -> ToolFailure:
        return ToolFailure(self.code, self.message, self.path, self.details)

    def body(self) -> dict[str, Any]:
        return self.failure().body()


class AgentUnavailable(Exception):
    """The agent did not answer. `delivered` is False when the request certainly never
    reached it (connection refused, no socket), so a retry cannot run a tool twice."""

    def __init__(self, message: str, *, delivered: bool) -> None:
        super().__init__(message)
        self.message = message
        self.delivered = delivered


class AgentTimedOut(AgentUnavailable):
    """The agent accepted the call but did not answer in time: it may have run, and an agent
    that stalls on a short call (stopped, hung) is replaced before the next one."""

    def __init__(self, message: str) -> None:
        super().__init__(message, delivered=True)


class ContextRefused(Exception):
    """An agent of an earlier BUILD (it serves until idle) refused the call's `context` field
    before running anything: the call may be sent again without it, to the same agent."""
