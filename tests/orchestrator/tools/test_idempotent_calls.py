"""A tool_call_id makes a tool call idempotent, and an invented tool name is a tool result:
real shell calls through a live server (real sockets, process-backend agents, SQLite)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from orchestrator import client as sdk
from orchestrator.client import OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures
from tests.conftest import ADMIN_TOKEN, API_TOKEN, make_settings
from tests.live_server import free_port, live_server, serve_process

OWNER = 17


@contextmanager
def serving(data_dir: Path, **overrides: object) -> Iterator[tuple[OrchestratorClient, OrchestratorService]]:
    port = free_port()
    service = OrchestratorService(make_settings(data_dir, public_base_url=f"http://127.0.0.1:{port}", **overrides))
    try:
        with live_server(create_app(service), port) as base, OrchestratorClient(
            base, token=API_TOKEN, admin_token=ADMIN_TOKEN
        ) as bot:
            yield bot, service
    finally:
        service.close()


def new_run(bot: OrchestratorClient) -> sdk.RunContext:
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    return bot.start_run(session.session_id, trigger="web")


def lines(run: sdk.RunContext, name: str) -> list[str]:
    path = Path(run.workdir) / name
    return path.read_text().splitlines() if path.exists() else []


def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_a_repeat_while_the_first_runs_waits_for_it_and_never_runs_twice(agent_data_dir) -> None:
    with serving(agent_data_dir) as (bot, service):
        run = new_run(bot)
        command = {"command": "echo ran >> count.txt; sleep 2; echo done-$RANDOM"}
        first: list[sdk.ToolResult] = []
        thread = threading.Thread(target=lambda: first.append(bot.call_tool(run.run_id, "shell", command, tool_call_id="c1")))
        thread.start()
        wait_for(lambda: lines(run, "count.txt") == ["ran"])  # the first is running now
        repeat = bot.call_tool(run.run_id, "shell", command, tool_call_id="c1")
        thread.join()
        assert first[0].ok and repeat.ok and repeat.result == first[0].result
        assert repeat.typed is not None and repeat.typed.stdout.startswith("done-")
        again = bot.call_tool(run.run_id, "shell", command, tool_call_id="c1")  # after it ended
        assert again.result == first[0].result
        assert lines(run, "count.txt") == ["ran"]
        # A new id is a new call; without an id every call runs.
        bot.call_tool(run.run_id, "shell", command, tool_call_id="c2")
        bot.call_tool(run.run_id, "shell", command)
        assert lines(run, "count.txt") == ["ran"] * 3
        ran = [e for e in bot.audit(action="tool.call", session_id=run.session_id) if e["detail"]["tool"] == "shell"]
        assert len(ran) == 3  # a repeat is answered from the record: no audit row of a run


def test_the_same_id_with_another_call_is_a_409_and_runs_nothing(agent_data_dir) -> None:
    with serving(agent_data_dir) as (bot, _):
        run = new_run(bot)
        assert bot.call_tool(run.run_id, "shell", {"command": "echo a >> count.txt"}, tool_call_id="c1").ok
        with pytest.raises(sdk.ConflictError) as reused:
            bot.call_tool(run.run_id, "shell", {"command": "echo b >> count.txt"}, tool_call_id="c1")
        assert reused.value.status == 409 and reused.value.code == "tool_call_id_reused"
        assert reused.value.field == "tool_call_id"
        with pytest.raises(sdk.ConflictError):
            bot.call_tool(run.run_id, "write_file", {"path": "count.txt", "content": "x"}, tool_call_id="c1")
        assert lines(run, "count.txt") == ["a"]
        # Ids belong to their run: another run may use "c1" for its own call.
        other = new_run(bot)
        assert bot.call_tool(other.run_id, "shell", {"command": "echo c >> count.txt"}, tool_call_id="c1").ok
        assert lines(other, "count.txt") == ["c"]


def test_the_record_survives_a_server_restart(agent_data_dir) -> None:
    command = {"command": "echo ran >> count.txt; echo out-$RANDOM"}
    with serving(agent_data_dir) as (bot, _):
        run = new_run(bot)
        first = bot.call_tool(run.run_id, "shell", command, tool_call_id="c1")
    with serving(agent_data_dir) as (bot, _):
        repeat = bot.call_tool(run.run_id, "shell", command, tool_call_id="c1")
        assert repeat.result == first.result and lines(run, "count.txt") == ["ran"]


def server_pid(port: int) -> int:
    """The pid of the `orchestrator serve --port PORT` this test started."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in argv and str(port).encode() in argv and b"orchestrator" in argv:
                return int(entry.name)
    raise AssertionError(f"no orchestrator serve on port {port}")


def test_a_call_left_running_by_a_killed_server_is_interrupted_not_run_again(agent_data_dir) -> None:
    """A server killed mid-call leaves the call's record `running`: after a restart the repeat
    answers `interrupted` (it may have run), and never runs it a second time."""
    env = {
        "ORCH_BACKEND": "process",
        **{k: os.environ[k] for k in ("ORCH_SANDBOX_UID_BASE", "ORCH_MAX_USER_ID") if k in os.environ},
    }
    command = {"command": "echo ran >> count.txt; sleep 30"}
    port = free_port()
    with serve_process(str(agent_data_dir), port, env) as base, OrchestratorClient(base) as bot:
        run = new_run(bot)
        thread = threading.Thread(
            target=lambda: pytest.raises(sdk.TransportError, bot.call_tool, run.run_id, "shell", command, tool_call_id="c1"),
            daemon=True,
        )
        thread.start()
        wait_for(lambda: lines(run, "count.txt") == ["ran"])
        os.kill(server_pid(port), signal.SIGKILL)
        thread.join(timeout=30)
    with serve_process(str(agent_data_dir), free_port(), env) as base, OrchestratorClient(base) as bot:
        repeat = bot.call_tool(run.run_id, "shell", command, tool_call_id="c1")
        assert not repeat.ok and repeat.error.code == "interrupted" and "may have run" in repeat.error.message
        assert lines(run, "count.txt") == ["ran"]


def test_a_repeat_after_the_run_ended_still_gets_the_recorded_answer(agent_data_dir) -> None:
    with serving(agent_data_dir) as (bot, _):
        run = new_run(bot)
        first = bot.call_tool(run.run_id, "shell", {"command": "echo ran >> count.txt"}, tool_call_id="c1")
        bot.end_run(run.run_id)
        assert bot.call_tool(run.run_id, "shell", {"command": "echo ran >> count.txt"}, tool_call_id="c1") == first
        with pytest.raises(sdk.ConflictError) as ended:  # anything new is refused: the run has ended
            bot.call_tool(run.run_id, "shell", {"command": "echo ran >> count.txt"}, tool_call_id="c2")
        assert "has ended" in ended.value.message
        assert lines(run, "count.txt") == ["ran"]


def test_records_expire_and_large_results_are_not_kept(agent_data_dir) -> None:
    with serving(agent_data_dir, tool_call_result_ttl_s=1.0, tool_call_result_max_bytes=1024) as (bot, service):
        run = new_run(bot)
        # The sandbox started first: on a loaded host its start alone can outlast the 1 s TTL.
        assert bot.call_tool(run.run_id, "shell", {"command": "true"}).ok
        big = {"command": "echo ran >> count.txt; head -c 5000 /dev/zero | tr '\\0' x"}
        first = bot.call_tool(run.run_id, "shell", big, tool_call_id="big")
        assert first.ok and len(first.typed.stdout) == 5000
        repeat = bot.call_tool(run.run_id, "shell", big, tool_call_id="big")
        assert not repeat.ok and repeat.error.code == "result_not_kept" and repeat.error.details["outcome"] == "ok"
        assert lines(run, "count.txt") == ["ran"]
        time.sleep(1.2)  # past the TTL: the id is free again, and the next write sweeps the old row
        assert bot.call_tool(run.run_id, "shell", big, tool_call_id="big").ok
        assert lines(run, "count.txt") == ["ran", "ran"]
        with service.store.read() as tx:
            assert tx.one("SELECT COUNT(*) AS n FROM tool_call_results")["n"] == 1


@pytest.mark.parametrize("name", ["../end", "read_file?x=1", "..", ".", "no_such_tool", "shell/../end", "a%2Fb", "read_file#x"])
def test_an_invented_tool_name_is_an_unknown_tool_result_and_nothing_else_runs(agent_data_dir, name: str) -> None:
    with serving(agent_data_dir) as (bot, _):
        run = new_run(bot)
        bot.call_tool(run.run_id, "write_file", {"path": "notes.md", "content": "x"})
        result = bot.call_tool(run.run_id, name, {"path": "notes.md"}, tool_call_id="u1")
        assert result.ok is False and result.error.code == "unknown_tool", result
        assert name in result.error.message
        tools = result.error.details["tools"]
        assert "shell" in tools and "read_file" in tools and tools == sorted({t.name for t in bot.list_tools()})
        assert bot.get_run(run.run_id).status == "running"  # `../end` did not end it
        entries = bot.audit(action="tool.call", session_id=run.session_id)
        assert [e["detail"]["outcome"] for e in entries if e["detail"]["tool"] == name] == ["unknown_tool"]
        assert {e["detail"]["tool"] for e in entries} == {"write_file", name}  # nothing else ran


def test_the_route_answers_an_unknown_tool_with_200_for_any_client(agent_data_dir) -> None:
    with serving(agent_data_dir) as (bot, service):
        run = new_run(bot)
        base = str(bot._http.base_url)
        raw = httpx.post(f"{base}/v1/runs/{run.run_id}/tools/nope", json={}, headers={"Authorization": f"Bearer {API_TOKEN}"})
        assert raw.status_code == 200 and raw.json()["ok"] is False and raw.json()["error"]["code"] == "unknown_tool"
        missing = httpx.post(f"{base}/v1/runs/no-such-run/tools/nope", json={}, headers={"Authorization": f"Bearer {API_TOKEN}"})
        assert missing.status_code == 404  # a bad run is still an HTTP error


def test_path_segments_are_quoted() -> None:
    assert sdk.segment("../end") == "..%2Fend"
    assert sdk.segment("read_file?x=1") == "read_file%3Fx%3D1"
    assert sdk.segment("..") == "%2E%2E" and sdk.segment(".") == "%2E"
    assert sdk.segment("a%2Fb") == "a%252Fb" and sdk.segment("oc 1/x") == "oc%201%2Fx"


FORGED = "c1\r\x1b[2Kaccess method=GET route=/v1/forged status=200\u2028access method=PUT\x85route=/x\x0bz\tq\x00"


def test_a_model_chosen_tool_call_id_cannot_forge_or_hide_log_lines(agent_data_dir, caplog: pytest.LogCaptureFixture) -> None:
    """The id is the model's (the bot relays it): a carriage return, an escape sequence, a
    Unicode line separator or NEL in it would, copied raw into the repeat's log line, let a
    terminal or a line splitter show a forged line. Every line stays one printable line and
    the id is still told apart (escaped, not dropped)."""
    caplog.set_level(logging.INFO)
    with serving(agent_data_dir) as (bot, _):
        run = new_run(bot)
        first = bot.call_tool(run.run_id, "shell", {"command": "echo a >> count.txt"}, tool_call_id=FORGED)
        again = bot.call_tool(run.run_id, "shell", {"command": "echo a >> count.txt"}, tool_call_id=FORGED)
        assert first.ok and again.ok and lines(run, "count.txt") == ["a"]
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("orchestrator")]
    repeats = [m for m in messages if m.startswith("tool call repeat")]
    assert len(repeats) == 1, messages
    assert "\\r\\x1b[2Kaccess" in repeats[0] and "\\u2028" in repeats[0] and "\\x85" in repeats[0], repeats
    assert [m for m in messages if not m.isprintable()] == []
