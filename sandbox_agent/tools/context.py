"""What every tool call gets: the PathSandbox, the agent's configuration and the cwd."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox_agent.path_sandbox import PathSandbox
from sandbox_agent.wire import AgentConfig, AgentLimits

if TYPE_CHECKING:
    from sandbox_agent.calls import InFlightCall
    from sandbox_agent.kernels import KernelTable
    from sandbox_agent.processes import ProcessTable


@dataclass(frozen=True)
class ToolContext:
    sandbox: PathSandbox
    config: AgentConfig
    cwd: str
    call: InFlightCall | None = None  # a shell attaches its process tree, so a cancel can kill it
    processes: ProcessTable | None = None  # the agent's background processes (process_* tools)
    on_output: Callable[[str, bytes], None] | None = None  # a streamed shell: (stream, bytes) as read
    kernels: KernelTable | None = None  # the agent's code kernels (run_code, kernel_* tools)

    @property
    def limits(self) -> AgentLimits:
        return self.config.limits
