"""The MCP Inspector CLI, a client none of us wrote, against a run's endpoint: tools/list and
one tools/call (tests/orchestrator/mcp/inspector.py installs it into a cache once)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from orchestrator.client import OrchestratorClient
from orchestrator.mcp.connect import run_endpoint
from tests.conftest import API_TOKEN
from tests.orchestrator.mcp.conftest import OWNER, Live
from tests.orchestrator.mcp.inspector import REQUIRED, installed_bin


@pytest.fixture(scope="module")
def inspector():  # type: ignore[no-untyped-def]
    found, why = installed_bin()
    if found is None:
        if REQUIRED:
            pytest.fail(f"REQUIRE_MCP_INSPECTOR=1 but {why}", pytrace=False)
        pytest.skip(f"the MCP Inspector CLI is not available: {why}")
    return found


def inspect(inspector, endpoint: str, *args: str) -> dict:  # type: ignore[no-untyped-def]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}, "HOME": str(inspector.parent.parent.parent)}
    done = subprocess.run(
        [str(inspector), "--cli", endpoint, "--transport", "http", "--header", f"Authorization: Bearer {API_TOKEN}", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    return json.loads(done.stdout)


def test_the_inspector_lists_the_tools_and_calls_one(live: Live, bot: OrchestratorClient, inspector) -> None:  # type: ignore[no-untyped-def]
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    bot.call_tool(run.run_id, "write_file", {"path": "hello.txt", "content": "hello inspector\n"}).raise_for_error()
    endpoint = run_endpoint(live.url, run.run_id)
    listed = inspect(inspector, endpoint, "--method", "tools/list")
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert {tool.name for tool in bot.list_tools()} == set(tools)
    assert tools["read_file"]["annotations"]["readOnlyHint"] is True
    called = inspect(inspector, endpoint, "--method", "tools/call", "--tool-name", "read_file", "--tool-arg", "path=hello.txt")
    assert called.get("isError") is not True
    assert "hello inspector" in called["structuredContent"]["content"]
