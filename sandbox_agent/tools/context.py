"""What every tool call gets: the PathSandbox, the agent's configuration and the cwd."""

from __future__ import annotations

from dataclasses import dataclass

from sandbox_agent.path_sandbox import PathSandbox
from sandbox_agent.wire import AgentConfig, AgentLimits


@dataclass(frozen=True)
class ToolContext:
    sandbox: PathSandbox
    config: AgentConfig
    cwd: str

    @property
    def limits(self) -> AgentLimits:
        return self.config.limits
