"""Which MCP hints each tool carries: one decision per tool name, in one table.

A client uses the hints to decide what needs a confirmation: `readOnlyHint` for tools that
change nothing, `destructiveHint` for tools that may overwrite or kill, `openWorldHint` for
tools that reach outside the sandbox (a delivery to the chat, a shell with egress). The table
is keyed by name, so a tool that is not registered (yet) is simply absent from tools/list;
a test checks that every registered tool has a row here (tests/orchestrator/mcp/).
"""

from __future__ import annotations

from dataclasses import dataclass

import mcp_types as types


@dataclass(frozen=True)
class ToolHints:
    read_only: bool
    destructive: bool
    open_world: bool

    def annotations(self) -> types.ToolAnnotations:
        # destructiveHint only means something for a tool that writes (the spec's reading).
        return types.ToolAnnotations(
            read_only_hint=self.read_only,
            destructive_hint=None if self.read_only else self.destructive,
            open_world_hint=self.open_world,
        )


READS = ToolHints(read_only=True, destructive=False, open_world=False)
ADDS = ToolHints(read_only=False, destructive=False, open_world=False)  # writes, never overwrites others' data
OVERWRITES = ToolHints(read_only=False, destructive=True, open_world=False)
REACHES_OUT = ToolHints(read_only=False, destructive=False, open_world=True)
# shell may delete anything its user may, and may use the egress proxy: both hints.
RUNS_ANYTHING = ToolHints(read_only=False, destructive=True, open_world=True)

TOOL_HINTS: dict[str, ToolHints] = {
    # Sandbox file tools.
    "read_file": READS,
    "read_bytes": READS,
    "list_dir": READS,
    "glob_search": READS,
    "grep_search": READS,
    "write_file": OVERWRITES,
    "write_bytes": OVERWRITES,
    "edit_file": OVERWRITES,
    "shell": RUNS_ANYTHING,
    # Long-running processes (docs/mcp.md): starting one runs a command like shell does, and
    # so does writing to its stdin (a shell reads commands there); a signal may kill it; a
    # resize only changes its terminal's size; its output and the list only read.
    "process_start": RUNS_ANYTHING,
    "process_write": RUNS_ANYTHING,
    "process_signal": OVERWRITES,
    "process_resize": ADDS,
    "process_output": READS,
    "process_list": READS,
    # Code kernels (docs/interpreter.md): code runs like a shell; a restart or shutdown ends
    # a kernel and its state; the list only reads.
    "run_code": RUNS_ANYTHING,
    "kernel_restart": OVERWRITES,
    "kernel_shutdown": OVERWRITES,
    "kernel_list": READS,
    # Conversations: the owner's history, read only.
    "list_conversations": READS,
    "read_conversation": READS,
    "session_search": READS,
    # Host tools that write into the runtime user's own places only.
    "dump_user_messages": ADDS,
    "publish_artifact": REACHES_OUT,  # makes a file publicly readable by URL
    # Deliveries and collaboration: a message leaves the sandbox.
    "send_file": REACHES_OUT,
    "send_image": REACHES_OUT,
    "contact_session": REACHES_OUT,
    "reply_to_collaboration": REACHES_OUT,
}


def hints_for(tool: str) -> ToolHints | None:
    return TOOL_HINTS.get(tool)
