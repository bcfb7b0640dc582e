"""`orchestrator mcp` as a real stdio subprocess, driven by the official client's stdio
transport: it starts a run, relays to the run's endpoint, and ends the run when stdin closes."""

from __future__ import annotations

import os
import sys

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from orchestrator.client import OrchestratorClient
from tests.conftest import API_TOKEN, REPO
from tests.orchestrator.mcp.conftest import MEMBER, OWNER, SKILL, Live


def relay_command(live: Live, *args: str) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator", "--log-level", "WARNING", "mcp", "--url", live.url, "--token", API_TOKEN, *args],
        env=env,
        cwd=str(REPO),
    )


def test_the_stdio_relay_serves_a_group_run_and_ends_it_when_stdin_closes(live: Live, bot: OrchestratorClient) -> None:
    session = bot.create_session(owner_user_id=OWNER, channel="feishu_group", group=("feishu", "oc_mcp_stdio"))
    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async def scenario() -> None:
        params = relay_command(live, "--session", session.session_id, "--speaker", str(MEMBER), "--trigger", "group_message")
        with open(os.devnull, "w") as quiet:
            async with stdio_client(params, errlog=quiet) as (read, write):
                async with ClientSession(read, write) as mcp:
                    initialized = await mcp.initialize()
                    assert "## Runtime identity" in (initialized.instructions or "")  # B in A's session
                    tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
                    assert tools["read_file"].annotations.read_only_hint is True
                    resources = [r.uri for r in (await mcp.list_resources()).resources]
                    assert f"skill://{SKILL}/SKILL.md" in resources
                    doc = await mcp.read_resource(f"skill://{SKILL}/SKILL.md")
                    assert isinstance(doc.contents[0], types.TextResourceContents) and "MCP demo" in doc.contents[0].text
                    written = await mcp.call_tool("write_file", {"path": "relay.txt", "content": "via stdio\n"})
                    assert f"/runtime/{MEMBER}/" in written.structured_content["path"]
                    shell = await mcp.call_tool("shell", {"command": "sleep 0.6; cat relay.txt"}, progress_callback=on_progress)
                    assert shell.structured_content["stdout"] == "via stdio\n"
                    refused = await mcp.call_tool("read_file", {"path": "/etc/shadow"})
                    assert refused.is_error and refused.structured_content["code"] == "path_escape"

    anyio.run(scenario)
    assert progress and progress[-1].startswith("shell done"), progress  # relayed from the endpoint
    runs = bot.list_runs(session.session_id).runs
    assert len(runs) == 1 and runs[0].status == "succeeded" and runs[0].runtime_user_id == MEMBER


def test_with_owner_the_relay_makes_a_session_and_needs_exactly_one_of_them(live: Live, bot: OrchestratorClient) -> None:
    import subprocess

    async def scenario() -> str:
        with open(os.devnull, "w") as quiet:
            async with stdio_client(relay_command(live, "--owner", "4242"), errlog=quiet) as (read, write):
                async with ClientSession(read, write) as mcp:
                    initialized = await mcp.initialize()
                    assert initialized.instructions is None  # the owner runs
                    written = await mcp.call_tool("write_file", {"path": "x.txt", "content": "x"})
                    return written.structured_content["path"]

    path = anyio.run(scenario)
    assert "/runtime/4242/" in path
    sessions = bot.list_sessions(owner_user_id=4242)
    assert len(sessions) == 1 and sessions[0].channel == "web"
    assert [run.status for run in bot.list_runs(sessions[0].session_id).runs] == ["succeeded"]

    both = subprocess.run(
        [sys.executable, "-m", "orchestrator", "mcp", "--url", live.url, "--session", "s", "--owner", "5"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_without_a_server_the_relay_says_so_in_one_line() -> None:
    import subprocess

    from tests.live_server import free_port

    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "mcp", "--url", f"http://127.0.0.1:{free_port()}", "--owner", "5"],
        capture_output=True, text=True, cwd=REPO, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1 and "cannot start a run" in done.stderr and "Traceback" not in done.stderr


def test_at_info_the_relay_logs_no_line_per_http_request(live: Live, bot: OrchestratorClient, tmp_path) -> None:  # type: ignore[no-untyped-def]
    params = relay_command(live, "--owner", "4243")
    params = params.model_copy(update={"args": [a for a in params.args if a not in ("--log-level", "WARNING")]})
    errlog_path = tmp_path / "stderr.log"

    async def scenario() -> None:
        with open(errlog_path, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as mcp:
                    await mcp.initialize()
                    for _ in range(5):
                        await mcp.list_tools()

    anyio.run(scenario)
    logged = errlog_path.read_text()
    assert "mcp relay run started" in logged  # INFO is on
    assert "HTTP Request" not in logged, logged
