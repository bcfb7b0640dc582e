"""The agent's tool table: name → (argument model, function). The names and argument models
come from the one declaration in `wire.CONTAINER_TOOLS`; this module adds the functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from sandbox_agent import wire
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.kernels import kernel_list, kernel_restart, kernel_shutdown, run_code
from sandbox_agent.tools.files import edit_file, read_bytes, read_file, write_bytes, write_file
from sandbox_agent.tools.processes import (
    process_list,
    process_output,
    process_resize,
    process_signal,
    process_start,
    process_write,
)
from sandbox_agent.tools.search import glob_search, grep_search, list_dir
from sandbox_agent.tools.shell import shell

ToolFunction = Callable[[ToolContext, Any], dict[str, Any]]

_FUNCTIONS: dict[str, ToolFunction] = {
    "read_file": read_file,
    "write_file": write_file,
    "write_bytes": write_bytes,
    "edit_file": edit_file,
    "list_dir": list_dir,
    "glob_search": glob_search,
    "grep_search": grep_search,
    "shell": shell,
    "read_bytes": read_bytes,
    "process_start": process_start,
    "process_output": process_output,
    "process_write": process_write,
    "process_resize": process_resize,
    "process_signal": process_signal,
    "process_list": process_list,
    "run_code": run_code,
    "kernel_restart": kernel_restart,
    "kernel_shutdown": kernel_shutdown,
    "kernel_list": kernel_list,
}


def tool_table(
    declared: tuple[wire.ContainerTool, ...], functions: dict[str, ToolFunction]
) -> dict[str, tuple[type[BaseModel], ToolFunction]]:
    """Pair every declared tool with its function. A declared tool without one (or a function
    for no declared tool) is refused at import: the host would offer a tool nobody runs."""
    names = {tool.name for tool in declared}
    if names != set(functions):
        raise RuntimeError(
            f"container tools without a function: {sorted(names - set(functions))}; "
            f"functions of no declared tool: {sorted(set(functions) - names)}"
        )
    return {tool.name: (tool.arguments, functions[tool.name]) for tool in declared}


TOOLS = tool_table(wire.CONTAINER_TOOLS, _FUNCTIONS)
