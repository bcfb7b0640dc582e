"""Background processes and streamed shell through the real API (issue 15), with real agents
on both backends: one live server per backend for the whole module (a real loopback socket,
so SSE timing is what a bot sees)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from orchestrator import audit
from orchestrator.client import AsyncOrchestratorClient, OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.api_calls import MEMBER, OWNER
from tests.conftest import API_TOKEN, TEST_ROOT, make_settings
from tests.live_api import LiveApi as Api
from tests.live_server import live_server
from tests.orchestrator.sandboxes.docker.conftest import TEST_BASE, docker_settings, remove_containers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids need root")

# Two servers run at once here (one per backend, and one with tight limits): each its own
# half of the uid block this test run was given.
_BASE = int(os.environ.get("ORCH_SANDBOX_UID_BASE") or 1_160_000_000)
UIDS = {"sandbox_uid_base": _BASE, "max_user_id": 20_000}
TIGHT_UIDS = {"sandbox_uid_base": _BASE + 25_000, "max_user_id": 20_000}


def _serve(data: Path, settings_of) -> Iterator[Api]:  # type: ignore[no-untyped-def]
    service = OrchestratorService(settings_of(data))
    try:
        with live_server(create_app(service)) as url:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=120) as http:
                yield Api(url, service, http, service.settings.backend, "oc_procs")
    finally:
        service.close()


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    if request.param == "docker":
        from tests.sandbox_image import ensure_sandbox_image, recipe_tag

        image = recipe_tag(ensure_sandbox_image())
        TEST_BASE.mkdir(mode=0o711, parents=True, exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="t-", dir=TEST_BASE))
    else:
        image = ""
        base = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="orch-procs-"))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    try:
        if request.param == "docker":
            yield from _serve(data, lambda d: docker_settings(d, image, process_spool_bytes=256 * 1024, **UIDS))
        else:
            yield from _serve(data, lambda d: make_settings(d, process_spool_bytes=256 * 1024, **UIDS))
    finally:
        if request.param == "docker":
            remove_containers(data)
        shutil.rmtree(base, ignore_errors=True)


def _follow(api: Api, run_id: str, process_id: str, *, until_s: float = 20.0) -> tuple[list[dict], dict]:
    """Every answer of a long poll until the process is complete; (chunks, last answer)."""
    since, chunks = 0, []
    deadline = time.monotonic() + until_s
    while time.monotonic() < deadline:
        answer = api.ok(run_id, "process_output", process_id=process_id, since=since, wait_s=5)
        for chunk in answer["chunks"]:
            assert chunk["cursor"] >= since
        chunks += answer["chunks"]
        assert answer["next"] >= since
        since = answer["next"]
        if answer["complete"]:
            return chunks, answer
    raise AssertionError("the process did not end in time")


def test_lines_arrive_as_they_come_with_exact_cursors_and_the_exit_code(api: Api) -> None:
    run_id = api.run(api.session())
    started = api.ok(run_id, "process_start", command="for i in $(seq 1 15); do echo line$i; echo err$i >&2; sleep 0.1; done; exit 3")
    assert started["process_id"].startswith("p-") and started["pid"] > 0
    first = api.ok(run_id, "process_output", process_id=started["process_id"], wait_s=5)
    assert first["running"] and first["chunks"], first  # the first line, long before the end
    chunks, last = _follow(api, run_id, started["process_id"])
    chunks = first["chunks"] + [c for c in chunks if c["cursor"] >= first["next"]]
    # Cursors never repeat or skip: each chunk starts where the previous ended.
    position = 0
    for chunk in chunks:
        assert chunk["cursor"] == position, (chunk, position)
        position += len(chunk["text"].encode())
    assert position == last["total_bytes"] == last["next"]
    out = "".join(c["text"] for c in chunks if c["stream"] == "stdout")
    err = "".join(c["text"] for c in chunks if c["stream"] == "stderr")
    assert out == "".join(f"line{i}\n" for i in range(1, 16)) and err == "".join(f"err{i}\n" for i in range(1, 16))
    assert last["running"] is False and last["exit_code"] == 3 and last["dropped_bytes"] == 0


def test_stdin_and_a_terminal(api: Api) -> None:
    run_id = api.run(api.session())
    reader = api.ok(run_id, "process_start", command="read -r name; echo hello $name")
    api.ok(run_id, "process_write", process_id=reader["process_id"], data="world\n")
    chunks, last = _follow(api, run_id, reader["process_id"])
    assert "".join(c["text"] for c in chunks) == "hello world\n" and last["exit_code"] == 0

    term = api.ok(run_id, "process_start", command="tty; stty size; read -r x; stty size", pty=True, cols=100, rows=30)
    deadline = time.monotonic() + 10
    text, since = "", 0
    while "30 100" not in text and time.monotonic() < deadline:
        answer = api.ok(run_id, "process_output", process_id=term["process_id"], since=since, wait_s=2)
        text += "".join(c["text"] for c in answer["chunks"])
        since = answer["next"]
    assert "/dev/pts/" in text and "30 100" in text, text
    api.ok(run_id, "process_resize", process_id=term["process_id"], cols=132, rows=43)
    api.ok(run_id, "process_write", process_id=term["process_id"], data="go\r")
    chunks, last = _follow(api, run_id, term["process_id"])
    assert "".join(c["text"] for c in chunks).endswith("43 132\r\n") and last["exit_code"] == 0
    assert {c["stream"] for c in chunks} == {"pty"}


# The names of the live processes in process group `pid`, read from /proc in the sandbox.
_GROUP = (
    "import os, sys\n"
    "for p in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try: stat = open(f'/proc/{p}/stat').read()\n"
    "    except OSError: continue\n"
    "    name, rest = stat[stat.index('(') + 1 : stat.rindex(')')], stat[stat.rindex(')') + 2 :].split()\n"
    "    if rest[2] == sys.argv[1] and rest[0] != 'Z': print(name)\n"
)


def _pids_of_group(api: Api, run_id: str, pid: int) -> str:
    api.ok(run_id, "write_file", path="group.py", content=_GROUP)
    return api.ok(run_id, "shell", command=f"python3 group.py {pid}")["stdout"]


def test_a_kill_reaches_the_whole_group(api: Api) -> None:
    run_id = api.run(api.session())
    started = api.ok(run_id, "process_start", command="sleep 1000 & sleep 1000")
    time.sleep(0.3)
    assert _pids_of_group(api, run_id, started["pid"]).count("sleep") == 2  # a shell call spares them
    killed = api.ok(run_id, "process_signal", process_id=started["process_id"], signal="KILL")
    assert killed["delivered"] and killed["running"] is False
    assert _pids_of_group(api, run_id, started["pid"]).strip() == ""
    listed = api.ok(run_id, "process_list")["processes"]
    assert [p["state"] for p in listed if p["process_id"] == started["process_id"]] == ["exited"]
    rows = audit.entries(api.service.store, session_id=None, limit=500)
    mine = [r for r in rows if r.detail.get("process_id") == started["process_id"]]
    assert {r.action for r in mine} == {"process.start", "process.signal", "process.exit"}, mine
    assert all(r.runtime_user_id == MEMBER and r.owner_user_id == OWNER and r.session_id for r in mine)


def _sandbox_since(api: Api, user_id: int) -> str | None:
    return next((s.since for s in api.service.sandboxes.status() if s.user_id == user_id and s.state == "running"), None)


def test_another_session_or_user_sees_nothing_and_deleting_the_session_kills(api: Api) -> None:
    session = api.session("oc_procs_a")
    run_id = api.run(session)
    # A command line of its own, found by name: a pid number could be reused meanwhile.
    started = api.ok(run_id, "process_start", command="exec sleep 987.654")
    # Another session of the same runtime user (a personal one: no new group, so no plan
    # change that would replace the sandbox), and another user: not_found, and not listed.
    personal = api.http.post("/v1/sessions", json={"owner_user_id": MEMBER, "channel": "web"}).json()["session_id"]
    other_run = api.http.post(f"/v1/sessions/{personal}/runs", json={"trigger": "web"}).json()["run_id"]
    stranger_run = api.run(api.session("oc_procs_c"), speaker=OWNER + 1000)
    for run in (other_run, stranger_run):
        for name, extra in (("process_output", {}), ("process_signal", {"signal": "KILL"}), ("process_write", {"data": "x"})):
            body = api.tool(run, name, process_id=started["process_id"], **extra)
            assert not body["ok"] and body["error"]["code"] == "not_found", body
        assert api.ok(run, "process_list")["processes"] == []
    assert api.ok(run_id, "process_output", process_id=started["process_id"])["running"] is True
    since = _sandbox_since(api, MEMBER)
    probe = "grep -l '987[.]654' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"  # matches not itself
    assert api.ok(other_run, "shell", command=probe)["stdout"].strip() != "0"
    response = api.http.delete(f"/v1/sessions/{session}")
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 20  # the deletion's cleanup may finish after its answer
    while api.ok(other_run, "shell", command=probe)["stdout"].strip() != "0":
        assert time.monotonic() < deadline, f"the deleted session's process still runs: {response.text}"
        time.sleep(0.2)
    assert _sandbox_since(api, MEMBER) == since  # killed by the deletion, not by a new sandbox


def test_a_flood_keeps_the_spool_at_its_cap_and_the_agent_responsive(api: Api) -> None:
    session_id = api.session()
    run_id = api.run(session_id)
    api.ok(run_id, "write_file", path="small.txt", content="x\n")
    # The agent itself, over its socket: what the flood could slow down (an API call adds the
    # orchestrator's own work, which other tests on this machine compete with).
    live = api.service.sandboxes.backend_for(MEMBER).warm(api.service.sandboxes.sandbox_user(MEMBER))
    assert live is not None
    cwd = str(api.service.layout.runtime_dir(MEMBER, session_id))
    started = api.ok(run_id, "process_start", command="head -c 1073741824 /dev/zero | tr '\\0' a")
    spool = Path(started["spool_file"])
    times, through_api = [], []
    while True:
        began = time.perf_counter()
        assert live.blocking.call("read_file", {"path": "small.txt"}, cwd=cwd)["content"] == "x\n"
        times.append(time.perf_counter() - began)
        began = time.perf_counter()
        api.ok(run_id, "read_file", path="small.txt")
        through_api.append(time.perf_counter() - began)
        state = api.ok(run_id, "process_output", process_id=started["process_id"], since=0, max_bytes=16)
        assert spool.stat().st_size <= 256 * 1024
        if not state["running"]:
            break
        time.sleep(0.02)
    assert state["total_bytes"] == 1 << 30 and state["dropped_bytes"] == (1 << 30) - 256 * 1024
    # Nine in ten under 50 ms (typically 1-5 ms straight, 3-10 ms through the API) on a
    # shared 2-core machine: one scheduling hiccup is not a stall.
    times.sort()
    through_api.sort()
    assert len(times) >= 5 and times[int(len(times) * 0.9)] < 0.05, times
    assert through_api[len(through_api) // 2] < 0.05, through_api


def test_sse_shell_streams_before_the_command_ends_and_ends_with_the_json_result(api: Api) -> None:
    run_id = api.run(api.session())
    arguments = {"command": "echo first; sleep 2; echo second"}
    began = time.monotonic()
    events = []
    with api.http.stream(
        "POST", f"/v1/runs/{run_id}/tools/shell", json={"arguments": arguments}, headers={"Accept": "text/event-stream"}
    ) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                events.append((event, time.monotonic() - began, line[6:]))
    import json

    first_output = next(t for e, t, _ in events if e == "output")
    assert first_output < 1.5, events  # before the sleep ends
    assert [e for e, _, _ in events][-1] == "result" and sum(e == "result" for e, _, _ in events) == 1
    result = json.loads(events[-1][2])
    assert result["ok"] and result["result"]["stdout"] == "first\nsecond\n"
    assert "".join(json.loads(d)["text"] for e, _, d in events if e == "output") == "first\nsecond\n"
    plain = api.tool(run_id, "shell", **arguments)
    assert set(plain["result"]) == set(result["result"]) and plain["result"]["stdout"] == result["result"]["stdout"]


def test_the_sdk_iterators(api: Api) -> None:
    run_id = api.run(api.session())
    with OrchestratorClient(api.url, API_TOKEN) as bot:
        pieces = list(bot.stream_shell(run_id, "echo a; sleep 0.3; echo b"))
        assert "".join(p.text for p in pieces if p.kind == "output") == "a\nb\n"
        assert pieces[-1].kind == "result" and pieces[-1].result is not None and pieces[-1].result.ok
        started = bot.call_tool(run_id, "process_start", {"command": "for i in 1 2 3; do echo $i; sleep 0.2; done"})
        text = "".join(c.text for c in bot.process_output(run_id, started.result["process_id"], follow=True))
        assert text == "1\n2\n3\n"

    async def the_async_client() -> tuple[str, str, bool]:
        async with AsyncOrchestratorClient(api.url, API_TOKEN) as bot:
            events = [event async for event in bot.stream_shell(run_id, "echo c; sleep 0.3; echo d")]
            started = await bot.call_tool(run_id, "process_start", {"command": "echo e; sleep 0.3; echo f"})
            chunks = [c async for c in bot.process_output(run_id, started.result["process_id"], follow=True)]
            result = events[-1].result
            shown = "".join(e.text for e in events if e.kind == "output")
            return shown, "".join(c.text for c in chunks), result is not None and result.ok

    assert anyio.run(the_async_client) == ("c\nd\n", "e\nf\n", True)


def test_stopping_the_sandbox_kills_its_processes(api: Api) -> None:
    run_id = api.run(api.session())
    started = api.ok(run_id, "process_start", command="sleep 1000")
    api.service.sandboxes.backend_for(MEMBER).stop(MEMBER)
    assert api.ok(run_id, "process_list")["processes"] == []  # a new agent, which owns none
    if api.backend == "process":  # a host pid: gone (docker: its container is gone with it)
        assert not Path(f"/proc/{started['pid']}").exists()


@pytest.fixture(scope="module")
def tight() -> Iterator[Api]:
    base = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="orch-procs-tight-"))
    os.chmod(base, 0o711)
    (base / "data").mkdir()
    limits = {"process_max_runtime_s": 2.0, "process_max_per_user": 2, "idle_timeout_s": 0.5, **TIGHT_UIDS}
    try:
        yield from _serve(base / "data", lambda d: make_settings(d, **limits))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_runtime_limit_kills_and_the_count_limit_refuses(tight: Api) -> None:
    run_id = tight.run(tight.session())
    began = time.monotonic()
    first = tight.ok(run_id, "process_start", command="sleep 30")
    tight.ok(run_id, "process_start", command="sleep 30")
    third = tight.tool(run_id, "process_start", command="sleep 30")
    assert not third["ok"] and third["error"]["code"] == "too_many_processes", third
    _, last = _follow(tight, run_id, first["process_id"])
    assert last["end_reason"] == "max_runtime" and last["exit_code"] == 137 and 2.0 <= time.monotonic() - began < 6


def _agent_running(api: Api) -> bool:
    return any(s.user_id == MEMBER and s.state == "running" for s in api.service.sandboxes.status())


def test_a_sandbox_with_a_running_process_is_not_idle(tight: Api) -> None:
    run_id = tight.run(tight.session())
    started = tight.ok(run_id, "process_start", command="sleep 1.8")
    time.sleep(1.2)  # more than twice the idle timeout without a call
    assert _agent_running(tight)
    assert tight.ok(run_id, "process_output", process_id=started["process_id"])["running"] is True
    deadline = time.monotonic() + 8
    while _agent_running(tight) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _agent_running(tight)  # once it ended, the sandbox is idle like any other


def test_shell_keeps_its_timeout_and_a_child_holding_the_pipe_does_not_hold_the_call(api: Api) -> None:
    run_id = api.run(api.session())
    began = time.monotonic()
    # A child that escapes its group, session and environment marker, still holding stdout.
    left = api.ok(run_id, "shell", command="setsid env -i /bin/sleep 30 & echo started", timeout_s=20)
    assert left["exit_code"] == 0 and left["stdout"] == "started\n" and time.monotonic() - began < 5, left
    began = time.monotonic()
    timed = api.ok(run_id, "shell", command="echo partial; setsid env -i /bin/sleep 30 & sleep 30", timeout_s=1)
    assert timed["exit_code"] == 124 and timed["timed_out"] and timed["stdout"] == "partial\n", timed
    assert time.monotonic() - began < 5


def test_sse_of_a_silent_command_opens_at_once_and_a_refusal_is_an_http_error(api: Api) -> None:
    run_id = api.run(api.session())
    began = time.monotonic()
    headers = {"Accept": "text/event-stream"}
    body = {"arguments": {"command": "sleep 2; echo late"}}
    with api.http.stream("POST", f"/v1/runs/{run_id}/tools/shell", json=body, headers=headers) as response:
        assert response.status_code == 200 and time.monotonic() - began < 1.5  # before any output
        lines = list(response.iter_lines())
    assert "event: result" in lines and time.monotonic() - began >= 2
    missing = api.http.post("/v1/runs/r-000000000000000000000000/tools/shell", json=body, headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
