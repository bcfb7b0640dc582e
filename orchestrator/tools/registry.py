"""Tool specifications: name, argument model, where it runs, and (for host tools) a handler."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel

from orchestrator.errors import InvalidInput
from orchestrator.runs.records import RunRecord
from orchestrator.sessions.records import SessionRecord
from orchestrator.tools.identity_table import CONTAINER_TOOLS, TOOL_IDENTITY
from sandbox_agent.wire import TIMED_TOOLS, CallContext


class ToolPlace(str, Enum):
    CONTAINER = "container"  # runs inside the acting user's sandbox
    HOST = "host"  # runs in the orchestrator


@dataclass(frozen=True)
class ToolCall:
    """Everything a host tool may trust: it comes from the run, never from the model."""

    run: RunRecord
    session: SessionRecord
    acting_user_id: int
    workdir: str
    arguments: BaseModel
    tool_call_id: str | None

    def context(self) -> CallContext:
        return CallContext(run_id=self.run.run_id, session_id=self.run.session_id)


HostHandler = Callable[[ToolCall], Any]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    arguments: type[BaseModel]
    place: ToolPlace
    handler: HostHandler | None = None
    # True for a tool that keys its effect by (run, tool_call_id) in the transaction that
    # makes it (the collaboration tools): it answers its own repeats, so the dispatcher keeps
    # no record for it and a repeat after a crash may run it again, safely.
    keyed_by_call_id: bool = False

    def __post_init__(self) -> None:
        if self.name not in TOOL_IDENTITY:
            raise ValueError(f"tool {self.name} needs a row in the identity table first")
        if (self.place is ToolPlace.CONTAINER) != (self.name in CONTAINER_TOOLS):
            raise ValueError(f"tool {self.name}: place {self.place.value} contradicts the identity table")
        if (self.place is ToolPlace.HOST) != (self.handler is not None):
            raise ValueError(f"tool {self.name}: host tools need a handler, container tools none")


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, ToolSpec] = {}

    def register(self, spec: ToolSpec) -> None:
        if spec.name in self._tools:
            raise ValueError(f"tool {spec.name} registered twice")
        self._tools[spec.name] = spec

    def get(self, name: str) -> ToolSpec | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def all(self) -> list[ToolSpec]:
        return sorted(self._tools.values(), key=lambda spec: spec.name)

    def describe(self, *, shell_timeout_max_s: float | None = None) -> list[dict[str, Any]]:
        """The tools as a model receives them. With `shell_timeout_max_s`, shell's `timeout_s`
        states this server's upper bound (a setting, so not part of the static model)."""
        described = [
            {
                "name": spec.name,
                "description": spec.description,
                "place": spec.place.value,
                "acts_as": TOOL_IDENTITY[spec.name].value,
                "parameters": spec.arguments.model_json_schema(),
            }
            for spec in self.all()
        ]
        if shell_timeout_max_s is not None:
            for tool in described:
                timeout = tool["parameters"].get("properties", {}).get("timeout_s") if tool["name"] in TIMED_TOOLS else None
                for branch in (timeout or {}).get("anyOf", []):
                    if branch.get("type") == "number":
                        branch["maximum"] = shell_timeout_max_s
        return described


MAX_TOOL_SUBSET_CHARS = 2000


def tool_subset(raw: str | None, known: Iterable[str], field: str = "names") -> frozenset[str] | None:
    """Pure: the tools a bot asked for (`names=read_file,shell`), None for all of them. Empty
    entries are ignored; a name no tool has is a 422 naming it, so a typo is not a silent gap."""
    if raw is None:
        return None
    if len(raw) > MAX_TOOL_SUBSET_CHARS:
        raise InvalidInput(f"{field} may be at most {MAX_TOOL_SUBSET_CHARS} characters", field=field)
    wanted = frozenset(name.strip() for name in raw.split(",") if name.strip())
    unknown = sorted(wanted - set(known))
    if unknown:
        shown = ", ".join(repr(name[:64]) for name in unknown[:20])
        raise InvalidInput(f"no tool is named {shown}", field=field, unknown=unknown[:20])
    return wanted
