"""The client's surface: a method for every route of the app, the async client, typed tool
results, and HTTP timeouts that follow the call (live server, real process-backend agents)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from orchestrator import client as sdk
from orchestrator.client import AsyncOrchestratorClient, OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures
from tests.conftest import ADMIN_TOKEN, API_TOKEN, make_settings
from tests.live_server import free_port, live_server

OWNER = 17


@pytest.fixture
def server(agent_data_dir) -> Iterator[tuple[str, OrchestratorService]]:
    port = free_port()
    service = OrchestratorService(make_settings(agent_data_dir, public_base_url=f"http://127.0.0.1:{port}"))
    try:
        with live_server(create_app(service), port) as base:
            yield base, service
    finally:
        service.close()


def app_routes(service: OrchestratorService) -> set[tuple[str, str]]:
    """Every operation the app serves, from its OpenAPI (the framework's own routes, docs and
    the schema itself, are not in it; nor HEAD, which is a GET without its body)."""
    paths = create_app(service).openapi()["paths"]
    return {(method.upper(), path) for path, operations in paths.items() for method in operations}


def test_the_clients_have_a_method_for_every_route_of_the_app(agent_data_dir) -> None:
    service = OrchestratorService(make_settings(agent_data_dir))
    try:
        served = app_routes(service)
    finally:
        service.close()
    assert ("GET", "/v1/sessions/{session_id}/collaborations") in served  # the table is the real one
    assert sdk.routes_of(OrchestratorClient) == served
    assert sdk.routes_of(AsyncOrchestratorClient) == served
    sync_methods = {n for n in dir(OrchestratorClient) if not n.startswith("_")}
    async_methods = {n for n in dir(AsyncOrchestratorClient) if not n.startswith("_")}
    assert sync_methods - {"close"} == async_methods - {"aclose"}


def test_the_async_client_runs_a_bot_loop(server) -> None:
    base, _ = server

    async def loop() -> None:
        async with AsyncOrchestratorClient(base, token=API_TOKEN, admin_token=ADMIN_TOKEN) as bot:
            assert (await bot.health()).status == "ok"
            session = await bot.create_session(owner_user_id=OWNER, channel="web")
            run = await bot.start_run(session.session_id, trigger=sdk.Trigger.WEB)
            wrote, listed = await asyncio.gather(
                bot.call_tool(run.run_id, "write_file", {"path": "a.txt", "content": "one\ntwo\n"}, tool_call_id="w"),
                bot.call_tool(run.run_id, "list_dir", {"path": "."}),
            )
            assert isinstance(wrote.typed, sdk.WriteFileResult) and wrote.typed.bytes_written == 8
            assert isinstance(listed.typed, sdk.ListDirResult)
            read = await bot.call_tool(run.run_id, "read_file", {"path": "a.txt"})
            assert isinstance(read.typed, sdk.ReadFileResult) and read.typed.total_lines == 2
            shell = await bot.call_tool(run.run_id, "shell", {"command": "echo hi; echo oops >&2; exit 3"})
            assert isinstance(shell.typed, sdk.ShellResult)
            assert (shell.typed.exit_code, shell.typed.stdout, shell.typed.stderr) == (3, "hi\n", "oops\n")
            uploaded = await bot.upload_incoming(run.run_id, "chat file?.txt", b"from the chat\n")
            assert uploaded.name.startswith("chat file") and uploaded.size == 14
            echoed = await bot.call_tool(run.run_id, "read_file", {"path": uploaded.path})
            assert echoed.typed.content == "from the chat\n"
            invented = await bot.call_tool(run.run_id, "../end", {})
            assert invented.error.code == "unknown_tool" and invented.typed is None
            page = await bot.list_collaborations(session.session_id)
            assert page.collaborations == [] and page.next_before is None
            with pytest.raises(sdk.NotFoundError):
                await bot.get_collaboration(session.session_id, "cr-" + "0" * 24)
            with pytest.raises(sdk.NotFoundError):
                await bot.stop_collaboration(session.session_id, "cr-" + "0" * 24)
            assert (await bot.get_runtime_identity()).mode == sdk.IdentityMode.EXECUTION.value
            assert (await bot.end_run(run.run_id)).status == "succeeded"

    asyncio.run(loop())


def test_a_tool_calls_http_timeout_follows_its_timeout_s(server) -> None:
    base, _ = server
    # A 1 s default timeout: before, a 3 s shell call timed out in the client while it ran on.
    with OrchestratorClient(base, token=API_TOKEN) as setup:  # the set-up on a busy machine may take a second
        session = setup.create_session(owner_user_id=OWNER, channel="web")
        run = setup.start_run(session.session_id, trigger="web")
    with OrchestratorClient(base, token=API_TOKEN, timeout=1.0) as bot:
        started = time.monotonic()
        result = bot.call_tool(run.run_id, "shell", {"command": "sleep 3; echo done", "timeout_s": 10})
        assert result.typed.stdout == "done\n" and time.monotonic() - started >= 3
    assert sdk.tool_call_timeout_s("shell", {"timeout_s": 600}, 60.0) == 660.0
    assert sdk.tool_call_timeout_s("shell", {"timeout_s": 9999}, 60.0) == 660.0  # the server caps it at 600
    assert sdk.tool_call_timeout_s("shell", {}, 60.0) == 120.0  # the server's default 60 s
    assert sdk.tool_call_timeout_s("read_file", {}, 60.0) == 60.0


def test_a_result_of_the_wrong_shape_is_a_clear_error() -> None:
    with pytest.raises(sdk.InvalidResponseError) as bad:
        sdk.ToolResult.of("shell", {"ok": True, "result": {"exit_code": "zero"}})
    assert bad.value.code == "invalid_response"
    other = sdk.ToolResult.of("session_search", {"ok": True, "result": {"anything": 1}})
    assert other.typed is None and other.result == {"anything": 1}


def test_client_names_do_not_shadow_the_servers() -> None:
    import orchestrator.errors as server_errors
    import orchestrator.identity as identity

    server_names = {n for n in vars(server_errors) if isinstance(getattr(server_errors, n), type)}
    client_names = {n for n in sdk.__all__ if isinstance(getattr(sdk, n), type)}
    shadowing = {n for n in server_names & client_names if getattr(sdk, n) is not getattr(server_errors, n)}
    assert shadowing == set()
    # The client keeps its own copies (it imports nothing of the server): the same members and values.
    for ours, servers in [(sdk.Trigger, identity.Trigger), (sdk.IdentityMode, identity.IdentityMode)]:
        assert {m.name: m.value for m in ours} == {m.name: m.value for m in servers}, ours.__name__
