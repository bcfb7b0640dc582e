"""What every call to a sandbox agent shares whatever the backend: its deadline, the bounds
of the agent's answer, and the one wording of its failures (agent errors -> `ToolError`).
Pure."""

from __future__ import annotations

from typing import Any

from orchestrator.sandboxes.agent_launch import agent_limits
from orchestrator.errors import ToolError
from orchestrator.settings import AgentSettings, CallSettings
from sandbox_agent.answer_limits import AnswerLimits
from sandbox_agent.errors import AgentTimedOut, AgentUnavailable, ToolFailure
from sandbox_agent.wire import KERNEL_START_MARGIN_S, TIMED_TOOLS

# A shell's own deadline is enforced by the agent (it kills the tree and answers); this much
# more is for the kill, the last output and the answer.
SHELL_MARGIN_S = 15.0
HEALTH_TIMEOUT_S = 2.0

# The two outcomes a model is told when its sandbox failed. Exactly one is said: a call that
# may have reached the agent never also claims it did not run.
MAY_HAVE_RUN = (
    "The tool may have run partly: check its effects before repeating it. The sandbox is "
    "restarted on the next call."
)
DID_NOT_RUN = "The tool did not run; try again, and tell the user if it keeps failing."


def call_timeout_s(settings: CallSettings, tool: str, arguments: dict[str, Any]) -> float:
    """How long the host waits for the agent's answer to this call."""
    if tool == "process_output":  # a long poll: its own wait on top
        waited = arguments.get("wait_s")
        return settings.agent_call_timeout_s + (float(waited) if isinstance(waited, (int, float)) and waited > 0 else 0.0)
    if tool == "kernel_restart":  # it starts the new kernel before it answers
        return settings.agent_call_timeout_s + KERNEL_START_MARGIN_S
    if tool not in TIMED_TOOLS:
        return settings.agent_call_timeout_s
    asked = arguments.get("timeout_s")
    shell = float(asked) if isinstance(asked, (int, float)) and asked > 0 else settings.tool_timeout_s
    start = KERNEL_START_MARGIN_S if tool == "run_code" else 0.0  # its kernel may start first
    return min(shell, settings.tool_timeout_max_s) + SHELL_MARGIN_S + start


def answer_limits(settings: AgentSettings) -> AnswerLimits:
    return AnswerLimits.of(agent_limits(settings))


def tool_error(failure: ToolFailure) -> ToolError:
    """A sandbox's failure raised, for the host's code that handles failures as exceptions
    (host tools reading a sandbox's bytes, the disk quotas' rewording of no_space)."""
    # `path` only when the error is about one (no `"path": null` on the others).
    located = {"path": failure.path} if failure.path is not None else {}
    return ToolError(failure.code, failure.message, **located, **failure.details)


def tool_failure(error: ToolError) -> ToolFailure:
    details = dict(error.details)
    return ToolFailure(error.code, error.message, details.pop("path", None), details)


def sandbox_unavailable(user_id: int, why: str, *, may_have_run: bool = False, **details: Any) -> ToolError:
    """The `sandbox_unavailable` error: `may_have_run` when the request may have reached the
    agent, else the tool certainly did not run."""
    outcome = MAY_HAVE_RUN if may_have_run else DID_NOT_RUN
    return ToolError(
        "sandbox_unavailable", f"The sandbox of user {user_id} is not available ({why}). {outcome}", **details
    )


def call_failure(user_id: int, exc: AgentUnavailable) -> ToolError:
    """The tool error of a call whose agent stopped answering."""
    if isinstance(exc, AgentTimedOut):
        return sandbox_unavailable(user_id, "it did not answer in time", may_have_run=True)
    if exc.delivered:
        return sandbox_unavailable(user_id, "it stopped answering during the call", may_have_run=True)
    return sandbox_unavailable(user_id, exc.message)
