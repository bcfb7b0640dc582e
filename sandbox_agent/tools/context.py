"""What every tool call gets: the PathSandbox, the agent's configuration and the cwd."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox_agent.path_sandbox import PathSandbox
from sandbox_agent.wire import AgentConfig, AgentLimits

if TYPE_CHECKING:
    from sandbox_agent.calls import InFlightCall


@dataclass(frozen=True)
class ToolContext:
    sandbox: PathSandbox
    config: AgentConfig
    cwd: str
    call: InFlightCall | None = None  # a shell attaches its process tree, so a cancel can kill it

    @property
    def limits(self) -> AgentLimits:
        return self.config.limits
