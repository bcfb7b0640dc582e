"""What every backend does the same way around one agent call: its deadline, the bounds of
the agent's answer, and how the agent's errors become tool errors. Pure."""

from __future__ import annotations

from typing import Any

from orchestrator.sandboxes.agent_launch import agent_limits
from orchestrator.errors import ToolError
from orchestrator.settings import Settings
from sandbox_agent.answer_limits import AnswerLimits
from sandbox_agent.errors import AgentToolError

# A shell's own deadline is enforced by the agent (it kills the tree and answers); this much
# more is for the kill, the last output and the answer.
SHELL_MARGIN_S = 15.0
HEALTH_TIMEOUT_S = 2.0


def call_timeout_s(settings: Settings, tool: str, arguments: dict[str, Any]) -> float:
    """How long the host waits for the agent's answer to this call."""
    if tool != "shell":
        return settings.agent_call_timeout_s
    asked = arguments.get("timeout_s")
    shell = float(asked) if isinstance(asked, (int, float)) and asked > 0 else settings.tool_timeout_s
    return min(shell, settings.tool_timeout_max_s) + SHELL_MARGIN_S


def answer_limits(settings: Settings) -> AnswerLimits:
    return AnswerLimits.of(agent_limits(settings))


def tool_error(exc: AgentToolError) -> ToolError:
    return ToolError(exc.code, exc.message, path=exc.path, **exc.details)
