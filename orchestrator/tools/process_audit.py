"""Which audit rows a background-process tool call adds to its own `tool.call` row: a start
(`process.start`), a signal (`process.signal`) and, on the first answer that shows a process
ended, its exit (`process.exit`). Pure: the tool, its arguments and its result in, rows out.

Everything here comes from the sandbox, so only what has the expected form is recorded (a
process id of the agent's form, an int exit code); the rest is left out, never trusted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sandbox_agent.processes import ENDED_KEPT
from sandbox_agent.wire import PROCESS_ID_PATTERN

_PROCESS_ID = re.compile(PROCESS_ID_PATTERN)
_END_REASONS = frozenset({"exited", "signal", "max_runtime", "session_deleted", "agent_stopped"})


@dataclass(frozen=True)
class ProcessEvent:
    action: str
    detail: dict[str, Any]


def _process_id(value: object) -> str | None:
    return value if isinstance(value, str) and _PROCESS_ID.fullmatch(value) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and -1 <= value <= 1 << 16 else None


def _exit(item: dict[str, Any]) -> ProcessEvent | None:
    process_id = _process_id(item.get("process_id"))
    if item.get("exit_new") is not True or process_id is None:
        return None
    reason = item.get("end_reason")
    return ProcessEvent(
        "process.exit",
        {"process_id": process_id, "exit_code": _int(item.get("exit_code")), "end_reason": reason if reason in _END_REASONS else None},
    )


def process_events(tool: str, arguments: dict[str, Any], result: object) -> list[ProcessEvent]:
    if not isinstance(result, dict):
        return []
    events: list[ProcessEvent] = []
    if tool == "process_start":
        process_id = _process_id(result.get("process_id"))
        if process_id is not None:
            command = str(arguments.get("command", ""))
            detail = {"process_id": process_id, "pid": _int(result.get("pid")), "pty": bool(arguments.get("pty"))}
            events.append(ProcessEvent("process.start", {**detail, "command": command[:500]}))
    elif tool == "process_signal":
        process_id = _process_id(result.get("process_id"))
        if process_id is not None:
            detail = {"process_id": process_id, "signal": str(arguments.get("signal")), "delivered": result.get("delivered") is True}
            events.append(ProcessEvent("process.signal", detail))
    if tool == "process_list":
        # A real list shows at most the agent's kept ended processes newly ended, each once; a
        # forged one could fill the whole answer bound with exits (~200,000 rows in one write).
        items = result.get("processes")
        seen: set[str] = set()
        for item in items if isinstance(items, list) else []:
            event = _exit(item) if isinstance(item, dict) else None
            if event is not None and event.detail["process_id"] not in seen:
                seen.add(event.detail["process_id"])
                events.append(event)
                if len(seen) >= ENDED_KEPT:
                    break
    elif tool.startswith("process_"):
        event = _exit(result)
        if event is not None:
            events.append(event)
    return events

