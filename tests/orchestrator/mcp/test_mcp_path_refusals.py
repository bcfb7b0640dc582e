"""A refused path argument keeps its `path` in the MCP answer: the structured error an MCP
client reads is the one the plain API answers (tests/orchestrator/tools/
test_path_refusals_api.py), `path` included."""

from __future__ import annotations

import anyio

from orchestrator.client import OrchestratorClient
from orchestrator.mcp.connect import run_session
from tests.conftest import API_TOKEN
from tests.orchestrator.mcp.conftest import OWNER, Live

TOO_LONG = "/" + "a/" * 2100 + "x"  # longer than the kernel opens


def test_a_refused_path_argument_answers_its_path_over_mcp(live: Live, bot: OrchestratorClient) -> None:
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    refusals = [
        ("read_file", {"path": ""}, ""),
        ("write_file", {"path": "notes\x00.md", "content": "x"}, "notes\x00.md"),
        ("read_bytes", {"path": TOO_LONG}, TOO_LONG[:200] + "..."),
        ("glob_search", {"pattern": "../*"}, "../*"),
        ("grep_search", {"pattern": "x", "glob": "/etc/*"}, "/etc/*"),
    ]

    async def scenario() -> list[tuple[bool, dict]]:
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, _):
            answers = []
            for name, arguments, _ in refusals:
                result = await mcp.call_tool(name, arguments)
                answers.append((result.is_error, result.structured_content or {}))
            return answers

    for (name, arguments, path), (is_error, error) in zip(refusals, anyio.run(scenario)):
        assert is_error and error["code"] == "invalid_arguments", (name, arguments, error)
        assert error["path"] == path, (name, error)
