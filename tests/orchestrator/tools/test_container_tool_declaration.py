"""The container tools are declared once (`sandbox_agent.wire.CONTAINER_TOOLS`); the agent's
tool table, the identity table and the host registry follow from it."""

from __future__ import annotations

import pytest

from orchestrator.tools.container_tools import register_container_tools
from orchestrator.tools.identity_table import TOOL_IDENTITY, ActingIdentity
from orchestrator.tools.registry import ToolPlace, ToolRegistry
from sandbox_agent import wire
from sandbox_agent.tools.registry import TOOLS, tool_table


def test_every_list_of_container_tools_is_the_declared_one() -> None:
    declared = {tool.name: tool for tool in wire.CONTAINER_TOOLS}
    assert len(declared) == len(wire.CONTAINER_TOOLS)  # no name declared twice
    registry = ToolRegistry()
    register_container_tools(registry)
    specs = {spec.name: spec for spec in registry.all()}
    assert specs.keys() == declared.keys() == TOOLS.keys() == wire.CONTAINER_TOOL_NAMES
    for name, tool in declared.items():
        assert specs[name].place is ToolPlace.CONTAINER and specs[name].handler is None
        assert specs[name].arguments is tool.arguments is TOOLS[name][0] is wire.TOOL_ARGUMENTS[name]
        assert specs[name].description == tool.description
        assert TOOL_IDENTITY[name] is ActingIdentity.RUNTIME  # a sandbox runs as the runtime user


def _noop(context, arguments):  # pragma: no cover - never called
    return {}


def test_the_agent_refuses_a_declared_tool_it_cannot_run_and_a_function_nobody_declared() -> None:
    extra = wire.ContainerTool("make_coffee", wire.ShellArgs, "not a tool")
    functions = {name: function for name, (_, function) in TOOLS.items()}
    with pytest.raises(RuntimeError, match=r"without a function: \['make_coffee'\]"):
        tool_table((*wire.CONTAINER_TOOLS, extra), functions)
    with pytest.raises(RuntimeError, match=r"functions of no declared tool: \['make_coffee'\]"):
        tool_table(wire.CONTAINER_TOOLS, {**functions, "make_coffee": _noop})
    assert tool_table(wire.CONTAINER_TOOLS, functions) == TOOLS
