"""A real agent process on a real Unix socket, driven by the real client."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandbox_agent.build import own_build_id
from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentToolError, AgentUnavailable
from tests.sandbox_agent.conftest import LiveAgent, build_tree, start_agent, stop_agent, write_agent_config


@pytest.fixture(params=["openat2", "walk"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveAgent]:
    agent = start_agent(build_tree(tmp_path), resolver=request.param)
    yield agent
    stop_agent(agent)


def test_health_needs_no_token_and_reports_build_uptime_busy(live: LiveAgent) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(uds=live.config.socket_path), base_url="http://a") as raw:
        body = raw.get("/health").json()
    assert body["build"] == own_build_id()
    assert body["busy"] == 0
    assert body["uptime_s"] >= 0
    assert body["instance_id"] == live.config.instance_id
    assert body["pid"] == live.proc.pid


def test_tool_calls_need_the_token(live: LiveAgent) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(uds=live.config.socket_path), base_url="http://a") as raw:
        request = {"arguments": {"path": "hello.txt"}, "cwd": str(live.tree.workdir)}
        assert raw.post("/v1/tools/read_file", json=request).status_code == 401
        wrong = {"Authorization": "Bearer " + "x" * 43}
        assert raw.post("/v1/tools/read_file", json=request, headers=wrong).status_code == 401
        ok = raw.post("/v1/tools/read_file", json=request, headers={"Authorization": f"Bearer {live.token}"})
        assert ok.status_code == 200 and ok.json()["ok"] is True
    with AgentClient(live.config.socket_path, "not-the-token") as bad:
        with pytest.raises(AgentUnavailable) as info:
            bad.call("read_file", {"path": "hello.txt"}, cwd=str(live.tree.workdir))
        assert info.value.delivered is False


def test_socket_is_private(live: LiveAgent) -> None:
    assert stat.S_IMODE(os.stat(live.config.socket_path).st_mode) == 0o600


def test_read_write_list_through_the_socket(live: LiveAgent) -> None:
    cwd = str(live.tree.workdir)
    client = live.client
    assert client.call("read_file", {"path": "hello.txt"}, cwd=cwd)["content"] == "hello\nworld\n"
    written = client.call("write_file", {"path": "notes/a.md", "content": "# A\n"}, cwd=cwd)
    assert written == {"path": f"{cwd}/notes/a.md", "bytes_written": 4, "created": True}
    names = [e["name"] for e in client.call("list_dir", {"path": "notes"}, cwd=cwd)["entries"]]
    assert names == ["a.md"]
    skills = client.call("list_dir", {"path": "skills"}, cwd=cwd)["entries"]
    assert skills == [{"name": "foo", "type": "symlink", "target": str(live.tree.p("skill-views/17/foo"))}]
    assert client.call("read_file", {"path": "skills/foo/SKILL.md"}, cwd=cwd)["content"] == "# foo skill\n"


def test_structured_errors_cross_the_wire(live: LiveAgent) -> None:
    cwd = str(live.tree.workdir)
    with pytest.raises(AgentToolError) as info:
        live.client.call("read_file", {"path": "../../18/s9/secret.txt"}, cwd=cwd)
    assert info.value.code == "foreign_runtime_path"
    assert info.value.path == str(live.tree.p("runtime/18/s9/secret.txt"))
    with pytest.raises(AgentToolError) as info:
        live.client.call("write_file", {"path": "skills/foo/SKILL.md", "content": "x"}, cwd=cwd)
    assert info.value.code == "read_only"
    with pytest.raises(AgentToolError) as info:
        live.client.call("read_file", {"path": "hello.txt", "bogus": 1}, cwd=cwd)
    assert info.value.code == "invalid_arguments"
    with pytest.raises(AgentToolError) as info:
        live.client.call("no_such_tool", {}, cwd=cwd)
    assert info.value.code == "unknown_tool"


def test_busy_counts_calls_in_flight(live: LiveAgent) -> None:
    import threading

    cwd = str(live.tree.workdir)
    thread = threading.Thread(target=live.client.call, args=("shell", {"command": "sleep 1"}), kwargs={"cwd": cwd})
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while live.client.health().busy != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        thread.join()
    assert live.client.health().busy == 0


def test_agent_exits_when_its_parent_is_gone(tmp_path: Path) -> None:
    """A process-backend agent must not outlive the orchestrator (config.parent_pid)."""
    tree = build_tree(tmp_path)
    sockets = tree.p("sockets/17")
    sockets.mkdir(parents=True)
    (sockets / "token").write_text("t" * 43)  # of a token's form
    config = {
        "socket_path": str(sockets / "agent.sock"), "token_file": str(sockets / "token"), "user_id": 17,
        "data_root": str(tree.data), "home": str(tree.p("users/17")), "tmp_dir": "/tmp", "roots": [],
    }
    launcher = (
        "import json, os, subprocess, sys\n"
        "cfg = json.loads(sys.argv[1]); cfg['parent_pid'] = os.getpid()\n"
        "open(sys.argv[2], 'w').write(json.dumps(cfg))\n"
        "p = subprocess.Popen([sys.executable, '-m', 'sandbox_agent', '--config', sys.argv[2]], start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", launcher, json.dumps(config), str(sockets / "agent.json")],
        capture_output=True, text=True, check=True, cwd=str(Path(__file__).resolve().parents[2]),
    )
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 15
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the orphaned agent kept running"
        time.sleep(0.1)


def test_names_that_are_not_utf8_survive_the_wire(live: LiveAgent) -> None:
    cwd = str(live.tree.workdir)
    raw = os.fsencode(cwd) + b"/odd-\xff.txt"
    with open(raw, "wb") as fh:
        fh.write(b"bytes name")
    with open(os.fsencode(cwd) + b"/back\\slash-\xfe", "wb") as fh:
        fh.write(b"backslash")
    entries = {e["name"]: e for e in live.client.call("list_dir", {"path": "."}, cwd=cwd)["entries"]}
    # Escaped (`\xNN`, a backslash doubled) and flagged; plain names are left alone.
    assert entries["odd-\\xff.txt"]["name_encoding"] == "escaped"
    assert entries["back\\\\slash-\\xfe"]["name_encoding"] == "escaped"
    assert "name_encoding" not in entries["hello.txt"]
    for name, content in (("odd-\\xff.txt", "bytes name"), ("back\\\\slash-\\xfe", "backslash")):
        read = live.client.call("read_file", {"path": name}, cwd=cwd)
        assert read["content"] == content and read["path"].endswith(name) and read["path_encoding"] == "escaped"
    # The surrogateescape form still works too (the wire of earlier builds).
    assert live.client.call("read_file", {"path": "odd-\udcff.txt"}, cwd=cwd)["content"] == "bytes name"
    with pytest.raises(AgentToolError) as refused:
        live.client.call("read_file", {"path": "odd-\\xfe.txt"}, cwd=cwd)
    assert refused.value.code == "not_found" and refused.value.path.endswith("odd-\\xfe.txt")
    (live.tree.workdir / "中文.txt").write_text("文字")
    assert live.client.call("read_file", {"path": "中文.txt"}, cwd=cwd)["content"] == "文字"


@pytest.mark.parametrize("content", ["t" * 32, "ORCH_ADMIN_TOKEN=admin-token-for-tests\n", "a" * 44, ""])
def test_the_agent_accepts_only_a_token_of_the_form_the_host_writes(tmp_path: Path, content: str) -> None:
    from sandbox_agent.server import load_token

    token_file = tmp_path / "token"
    token_file.write_text(content)
    with pytest.raises(SystemExit, match="no usable token"):
        load_token(str(token_file))
    token_file.unlink()
    token_file.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):  # never read through a link
        load_token(str(token_file))
    token_file.unlink()
    token_file.write_text("A-_z" + "0" * 39 + "\n")
    assert load_token(str(token_file)) == "A-_z" + "0" * 39


@pytest.mark.parametrize("planted", ["socket_dir", "empty_token"])
def test_an_agent_that_cannot_start_says_why_and_exits_with_a_failure(tmp_path: Path, planted: str) -> None:
    # Its stop on SIGTERM exits at once (os._exit, an int code); a refusal to start is a message
    # and must stay a failure with its reason: exit 0 would read as a clean stop to the backends.
    config, config_file = write_agent_config(build_tree(tmp_path))
    if planted == "socket_dir":
        os.mkdir(config.socket_path)
        reason = "is a directory"
    else:
        Path(config.token_file).write_text("")
        reason = "holds no usable token"
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_agent", "--config", str(config_file)],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
        cwd=str(Path(__file__).resolve().parents[2]),
    )  # fmt: skip
    assert done.returncode == 1, done
    assert reason in done.stderr.decode(), done.stderr
