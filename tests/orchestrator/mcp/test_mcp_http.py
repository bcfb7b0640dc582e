"""The MCP endpoint of a run, driven by the official `mcp` client (ClientSession over the SDK's
streamable-HTTP transport) against a live server with real process-backend agents."""

from __future__ import annotations

import os

import anyio
import httpx
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from orchestrator.client import OrchestratorClient
from orchestrator.mcp.connect import run_endpoint, run_session
from orchestrator.mcp.server import RUN_UNAVAILABLE
from tests.conftest import ADMIN_TOKEN, API_TOKEN
from tests.orchestrator.mcp.conftest import BROKEN_SKILL, MEMBER, OWNER, SKILL, Live

READ_ONLY = {"read_file", "list_dir", "glob_search", "grep_search", "read_bytes", "list_conversations", "read_conversation", "session_search"}
DESTRUCTIVE = {"write_file", "edit_file", "shell"}
OPEN_WORLD = {"send_file", "send_image", "shell"}


def group_runs(bot: OrchestratorClient, chat: str):  # type: ignore[no-untyped-def]
    """A group session of OWNER, with a run of the owner and one of MEMBER speaking."""
    session = bot.create_session(owner_user_id=OWNER, channel="feishu_group", group=("feishu", chat))
    owner_run = bot.start_run(session.session_id, trigger="group_message", speaker_user_id=OWNER)
    member_run = bot.start_run(session.session_id, trigger="group_message", speaker_user_id=MEMBER)
    return session, owner_run, member_run


def text_of(result: types.CallToolResult) -> str:
    assert len(result.content) == 1 and isinstance(result.content[0], types.TextContent)
    return result.content[0].text


def test_tools_list_is_get_v1_tools_with_annotations(live: Live, bot: OrchestratorClient) -> None:
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    plain = httpx.get(f"{live.url}/v1/tools", headers={"Authorization": f"Bearer {API_TOKEN}"}).json()["tools"]

    async def scenario() -> None:
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, initialized):
            assert initialized.instructions is None  # the owner runs: no identity section, as in a prompt
            assert initialized.capabilities.tools is not None and initialized.capabilities.resources is not None
            listed = {tool.name: tool for tool in (await mcp.list_tools()).tools}
            assert set(listed) == {tool["name"] for tool in plain}
            for tool in plain:
                assert listed[tool["name"]].input_schema == tool["parameters"], tool["name"]
                assert listed[tool["name"]].description == tool["description"]
                assert listed[tool["name"]].annotations is not None
            for name in READ_ONLY:
                assert listed[name].annotations.read_only_hint is True, name
            for name in DESTRUCTIVE:
                assert listed[name].annotations.destructive_hint is True, name
                assert listed[name].annotations.read_only_hint is False, name
            for name in OPEN_WORLD:
                assert listed[name].annotations.open_world_hint is True, name
            assert listed["read_file"].annotations.open_world_hint is False
            # The server's own bound is in shell's schema on both surfaces.
            timeout = listed["shell"].input_schema["properties"]["timeout_s"]["anyOf"]
            assert {"maximum": live.service.settings.tool_timeout_max_s}.items() <= timeout[0].items()

    anyio.run(scenario)


def test_a_bot_offers_a_subset_of_the_tools_over_mcp(live: Live, bot: OrchestratorClient) -> None:
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")

    async def scenario() -> None:
        async with run_session(live.url, run.run_id, API_TOKEN, tools=["read_file", "shell"]) as (mcp, _):
            assert sorted(tool.name for tool in (await mcp.list_tools()).tools) == ["read_file", "shell"]

    anyio.run(scenario)
    unknown = httpx.post(
        run_endpoint(live.url, run.run_id, ["read_file", "nope"]), json={}, headers={"Authorization": f"Bearer {API_TOKEN}"}
    )
    assert unknown.status_code == 422 and "'nope'" in unknown.json()["error"]["message"], unknown.text


def test_group_scenario_through_mcp_only(live: Live, bot: OrchestratorClient) -> None:
    """Member B speaks in owner A's group: B reads a skill as a resource, B's read_file of A's
    upload is an isError with the diagnostic, send_file of it carries the public URL."""
    bot.put_user(MEMBER, display_name="Qin")
    _, owner_run, member_run = group_runs(bot, "oc_mcp_group")
    published: dict = {}

    async def owner_publishes() -> None:
        async with run_session(live.url, owner_run.run_id, API_TOKEN) as (mcp, _):
            assert not (await mcp.call_tool("write_file", {"path": "chart.png", "content": "not really a png"})).is_error
            result = await mcp.call_tool("publish_artifact", {"path": "chart.png"})
            assert not result.is_error, text_of(result)
            published.update(result.structured_content or {})

    async def member_works() -> None:
        async with run_session(live.url, member_run.run_id, API_TOKEN) as (mcp, initialized):
            # The run's prompt identity section, as the bot gets it at the run's start.
            assert initialized.instructions == member_run.prompt_identity_section
            assert "user #67 Qin" in initialized.instructions
            resources = {r.uri: r for r in (await mcp.list_resources()).resources}
            doc_uri = f"skill://{SKILL}/SKILL.md"
            assert doc_uri in resources and f"skill://{SKILL}/scripts/hello.sh" in resources
            assert resources[doc_uri].title == "MCP demo"
            assert resources[doc_uri].description == "Shows how a skill reaches an MCP client as resources."
            assert not any(uri.startswith(f"skill://{BROKEN_SKILL}/") for uri in resources)  # failed: absent
            read = await mcp.read_resource(doc_uri)
            assert read.contents[0].text.startswith("---\nname: MCP demo")
            script = await mcp.read_resource(f"skill://{SKILL}/scripts/hello.sh")
            assert script.contents[0].text == "#!/bin/sh\necho hello\n"
            with pytest.raises(MCPError) as broken:
                await mcp.read_resource(f"skill://{BROKEN_SKILL}/SKILL.md")
            assert broken.value.code == -32002

            refused = await mcp.call_tool("read_file", {"path": published["path"]})
            assert refused.is_error and refused.structured_content["code"] == "foreign_upload_path"
            assert text_of(refused) == refused.structured_content["message"]
            assert "current runtime identity 67" in text_of(refused) and "http" not in text_of(refused)

            send = await mcp.call_tool("send_file", {"path_or_url": published["path"]})
            assert send.is_error and send.structured_content["code"] == "foreign_upload_path"
            assert send.structured_content["url"] == published["url"] and published["url"] in text_of(send)
            sent = await mcp.call_tool("send_file", {"path_or_url": published["url"]})
            assert not sent.is_error, text_of(sent)
            assert bot.fetch_delivery(sent.structured_content["delivery_id"]).data == b"not really a png"

    anyio.run(owner_publishes)
    anyio.run(member_works)


def test_write_read_edit_and_shell_with_progress(live: Live, bot: OrchestratorClient) -> None:
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def scenario() -> None:
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, _):
            written = await mcp.call_tool("write_file", {"path": "notes/a.txt", "content": "one\ntwo\n"})
            assert written.structured_content["bytes_written"] == 8 and written.structured_content["created"]
            edited = await mcp.call_tool("edit_file", {"path": "notes/a.txt", "old": "two", "new": "deux"})
            assert edited.structured_content["replacements"] == 1
            read = await mcp.call_tool("read_file", {"path": "notes/a.txt"})
            assert "deux" in text_of(read) and "deux" in read.structured_content["content"]
            shell = await mcp.call_tool("shell", {"command": "sleep 1; cat notes/a.txt; id -u"}, progress_callback=on_progress)
            assert shell.structured_content["exit_code"] == 0
            assert shell.structured_content["stdout"].startswith("one\ndeux\n")
            assert shell.structured_content["stdout"].split()[-1] != "0"  # the sandbox user, not root
            invalid = await mcp.call_tool("read_file", {"path": ""})
            assert invalid.is_error and invalid.structured_content["code"] == "invalid_arguments"
            unknown = await mcp.call_tool("no_such_tool", {})
            assert unknown.is_error and unknown.structured_content["code"] == "unknown_tool"

    anyio.run(scenario)
    assert [value for value, _ in progress] == sorted(value for value, _ in progress)
    assert progress[-1][1].startswith("shell done")
    assert any(message and message.startswith("shell running") for _, message in progress)  # beats while quiet
    # The output as it came, before the result: "one\ndeux\n" after the sleep, then the uid.
    streamed = "".join(message for _, message in progress[:-1] if message and not message.startswith("shell running"))
    assert streamed.startswith("one\ndeux\n"), progress


def test_a_tool_call_id_makes_a_call_idempotent_and_every_call_is_audited(live: Live, bot: OrchestratorClient) -> None:
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")

    async def scenario() -> list[str]:
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, _):
            outputs = []
            for _ in range(2):
                result = await mcp.call_tool("shell", {"command": "head -c 8 /dev/urandom | od -An -tx1"}, meta={"tool_call_id": "mcp-call-1"})
                outputs.append(result.structured_content["stdout"])
            other = await mcp.call_tool("shell", {"command": "head -c 8 /dev/urandom | od -An -tx1"})
            outputs.append(other.structured_content["stdout"])
            return outputs

    first, repeat, other = anyio.run(scenario)
    assert first == repeat and other != first
    audit = httpx.get(
        f"{live.url}/v1/admin/audit",
        params={"action": "tool.call", "session_id": session.session_id},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ).json()["entries"]
    assert len(audit) == 2  # the repeat ran nothing
    assert all(entry["actor"] == "bot" for entry in audit)


def test_an_ended_run_or_a_deleted_session_is_a_clear_mcp_error(live: Live, bot: OrchestratorClient) -> None:
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    other = bot.create_session(owner_user_id=OWNER, channel="web")
    other_run = bot.start_run(other.session_id, trigger="web")

    async def scenario() -> None:
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, _):
            bot.end_run(run.run_id)
            with pytest.raises(MCPError) as ended:
                await mcp.call_tool("read_file", {"path": "x"})
            assert ended.value.code == RUN_UNAVAILABLE and ended.value.error.data["code"] == "run_ended"
            assert "has ended" in ended.value.message
            with pytest.raises(MCPError):
                await mcp.list_tools()
        with pytest.raises(MCPError) as at_start:  # a new client of the ended run fails at initialize
            async with run_session(live.url, run.run_id, API_TOKEN):
                pass
        assert at_start.value.error.data["code"] == "run_ended"
        async with run_session(live.url, other_run.run_id, API_TOKEN) as (mcp, _):
            bot.delete_session(other.session_id)
            with pytest.raises(MCPError) as deleted:
                await mcp.call_tool("read_file", {"path": "x"})
            assert deleted.value.code == RUN_UNAVAILABLE and deleted.value.error.data["code"] in {"not_found", "run_ended"}

    anyio.run(scenario)


def test_the_endpoint_checks_the_token_the_run_id_and_the_acting_user(live: Live, bot: OrchestratorClient) -> None:
    _, _, member_run = group_runs(bot, "oc_mcp_auth")
    endpoint = run_endpoint(live.url, member_run.run_id)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    assert httpx.post(endpoint, json=initialize, headers=accept).status_code == 401
    wrong = httpx.post(endpoint, json=initialize, headers={**accept, "Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
    bad_id = httpx.post(run_endpoint(live.url, "..%2f..%2fx"), json=initialize, headers={**accept, "Authorization": f"Bearer {API_TOKEN}"})
    assert bad_id.status_code in {404, 422}

    async def as_person(user: int) -> str | None:
        async with run_session(live.url, member_run.run_id, API_TOKEN, headers={"X-Acting-User": str(user)}) as (mcp, init):
            return init.instructions

    assert anyio.run(as_person, MEMBER) is not None  # the run's person may
    # Stateless: a bare tools/call needs no session; plain JSON unless it asks for progress.
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_dir", "arguments": {}}}
    headers = {**accept, "Authorization": f"Bearer {API_TOKEN}", "MCP-Protocol-Version": "2025-11-25"}
    plain = httpx.post(endpoint, json=call, headers=headers)
    assert plain.headers["content-type"].startswith("application/json") and plain.json()["result"]["isError"] is False
    for method in ("GET", "DELETE"):  # stateless: no standalone stream, no session to end
        assert httpx.request(method, endpoint, headers=headers).status_code == 405
    call["params"]["_meta"] = {"progressToken": "p1"}
    streamed = httpx.post(endpoint, json=call, headers=headers)
    assert streamed.headers["content-type"].startswith("text/event-stream") and '"isError":false' in streamed.text
    owner = httpx.post(endpoint, json=initialize, headers={**accept, "Authorization": f"Bearer {API_TOKEN}", "X-Acting-User": str(OWNER)})
    assert owner.status_code == 404 and owner.json()["error"]["code"] == "not_found"  # another person's run


def test_skill_uris_that_leave_the_skill_are_refused_and_a_planted_link_reads_nothing_foreign(
    live: Live, bot: OrchestratorClient
) -> None:
    """B's sandbox (hostile) replaces its session's skill link with one into A's runtime dir;
    reading that resource runs as B in B's sandbox, so A's file stays unreadable."""
    _, owner_run, member_run = group_runs(bot, "oc_mcp_links")
    secret = bot.call_tool(owner_run.run_id, "write_file", {"path": "secret.txt", "content": "A's secret\n"}).raise_for_error()
    a_dir = os.path.dirname(secret.result["path"])
    planted = bot.call_tool(
        member_run.run_id, "shell", {"command": f"ln -sfn {a_dir} skills/{SKILL} && ln -s {a_dir} skills/evil && ls -l skills"}
    ).raise_for_error()
    assert planted.result["exit_code"] == 0, planted.result

    async def scenario() -> None:
        async with run_session(live.url, member_run.run_id, API_TOKEN) as (mcp, _):
            for uri in [f"skill://{SKILL}/secret.txt", "skill://evil/secret.txt"]:
                with pytest.raises(MCPError) as refused:
                    await mcp.read_resource(uri)
                assert refused.value.code == -32002
                assert refused.value.error.data["code"] == "foreign_runtime_path", refused.value.error.data
            for uri in [f"skill://{SKILL}/../../x", f"skill://{SKILL}/%2e%2e/x", "skill://../x", "file:///etc/passwd", f"skill://{SKILL}/a%2fb"]:
                with pytest.raises(MCPError) as invalid:
                    await mcp.read_resource(uri)
                assert invalid.value.code == types.INVALID_PARAMS, uri
            listed = [r.uri for r in (await mcp.list_resources()).resources]
            assert not any("secret" in uri for uri in listed), listed

    anyio.run(scenario)


def test_the_newer_protocol_without_initialize_gets_the_same_run(live: Live, bot: OrchestratorClient) -> None:
    """A 2026-07-28 client (server/discover, a per-request envelope, no initialize): the
    instructions come with discovery, calls act for the run, an ended run is the same error."""
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    _, _, member_run = group_runs(bot, "oc_mcp_modern")

    async def scenario() -> None:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {API_TOKEN}"}) as http:
            async with streamable_http_client(run_endpoint(live.url, member_run.run_id), http_client=http) as (read, write):
                async with ClientSession(read, write) as mcp:
                    discovered = await mcp.discover()
                    assert mcp.protocol_version == "2026-07-28"
                    assert discovered.instructions == member_run.prompt_identity_section
                    written = await mcp.call_tool("write_file", {"path": "m.txt", "content": "modern\n"})
                    assert f"/runtime/{MEMBER}/" in written.structured_content["path"]
                    bot.end_run(member_run.run_id)
                    with pytest.raises(MCPError) as ended:
                        await mcp.call_tool("read_file", {"path": "m.txt"})
                    assert ended.value.error.data["code"] == "run_ended"

    anyio.run(scenario)


def test_a_call_the_client_gave_up_on_still_completes_and_its_retry_gets_that_result(live: Live, bot: OrchestratorClient) -> None:
    """As over the plain API, a call whose client went away (a timeout, a cancel) runs to its end
    and is recorded: the retry with the same tool_call_id answers its result, nothing runs twice."""
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    command = "sleep 1; head -c 8 /dev/urandom | od -An -tx1 | tee -a runs.log"

    async def ignore(value: float, total: float | None, message: str | None) -> None:
        pass

    async def scenario() -> tuple[str, str]:
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, _):
            with pytest.raises(MCPError):
                await mcp.call_tool("shell", {"command": command}, read_timeout_seconds=0.3, meta={"tool_call_id": "slow-1"})
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, _):  # the client closed its connection
            with anyio.move_on_after(0.3):
                await mcp.call_tool("shell", {"command": command}, meta={"tool_call_id": "slow-2"})
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, _):  # the same, on a progress stream
            with anyio.move_on_after(0.3):
                await mcp.call_tool("shell", {"command": command}, progress_callback=ignore, meta={"tool_call_id": "slow-3"})
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, _):
            first = await mcp.call_tool("shell", {"command": command}, meta={"tool_call_id": "slow-1"})
            retried = await mcp.call_tool("shell", {"command": command}, meta={"tool_call_id": "slow-2"})
            streamed = await mcp.call_tool("shell", {"command": command}, meta={"tool_call_id": "slow-3"})
            results = [first, retried, streamed]
            assert not any(result.is_error for result in results), [text_of(result) for result in results]
            log = await mcp.call_tool("read_file", {"path": "runs.log"})
            return "".join(result.structured_content["stdout"] for result in results), log.structured_content["content"]

    stdout, log = anyio.run(scenario)
    assert sorted(log.splitlines()) == sorted(stdout.splitlines())  # each ran once; each retry answered its output
    audit = httpx.get(
        f"{live.url}/v1/admin/audit",
        params={"action": "tool.call", "session_id": session.session_id},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ).json()["entries"]
    assert sorted(e["detail"]["outcome"] for e in audit if e["detail"]["tool"] == "shell") == ["ok", "ok", "ok"]


def test_a_process_and_its_output_with_progress(live: Live, bot: OrchestratorClient) -> None:
    """process_start, then a long-polling process_output: heartbeats while it waits, the
    output in its result; process_list reads only."""
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async def scenario() -> str:
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, _):
            tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
            assert tools["process_list"].annotations.read_only_hint is True
            assert tools["process_start"].annotations.destructive_hint is True
            started = await mcp.call_tool("process_start", {"command": "sleep 1; echo late"})
            assert not started.is_error, text_of(started)
            process_id = started.structured_content["process_id"]
            output = await mcp.call_tool("process_output", {"process_id": process_id, "wait_s": 5}, progress_callback=on_progress)
            assert not output.is_error, text_of(output)
            listed = await mcp.call_tool("process_list", {})
            assert process_id in text_of(listed)
            return text_of(output)

    assert "late" in anyio.run(scenario)
    assert any(message and message.startswith("process_output running") for message in progress), progress
    assert progress[-1].startswith("process_output done")
