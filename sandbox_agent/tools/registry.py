"""The agent's tool table: name → (argument model, function)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from sandbox_agent import wire
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.files import edit_file, read_bytes, read_file, write_bytes, write_file
from sandbox_agent.tools.search import glob_search, grep_search, list_dir
from sandbox_agent.tools.shell import shell

ToolFunction = Callable[[ToolContext, Any], dict[str, Any]]

TOOLS: dict[str, tuple[type[BaseModel], ToolFunction]] = {
    "read_file": (wire.ReadFileArgs, read_file),
    "write_file": (wire.WriteFileArgs, write_file),
    "write_bytes": (wire.WriteBytesArgs, write_bytes),
    "edit_file": (wire.EditFileArgs, edit_file),
    "list_dir": (wire.ListDirArgs, list_dir),
    "glob_search": (wire.GlobSearchArgs, glob_search),
    "grep_search": (wire.GrepSearchArgs, grep_search),
    "shell": (wire.ShellArgs, shell),
    "read_bytes": (wire.ReadBytesArgs, read_bytes),
}

assert set(TOOLS) == set(wire.TOOL_ARGUMENTS)
