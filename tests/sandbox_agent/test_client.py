"""The agent client against a real agent process: its keep-alive pool, what it says when the
agent is gone, and read_bytes' raw transfer (and the JSON form an earlier agent answers)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentToolError, AgentUnavailable
from sandbox_agent.wire import ReadBytesResult
from tests.sandbox_agent.conftest import LiveAgent, build_tree, start_agent, stop_agent

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveAgent]:
    agent = start_agent(build_tree(tmp_path))
    yield agent
    stop_agent(agent)


def restart_same_agent(live: LiveAgent) -> None:
    """Stop the agent and start it again from the same config and token (same socket path)."""
    live.proc.terminate()
    live.proc.wait(10)
    config_file = Path(live.config.socket_path).parent / "agent.json"
    live.proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox_agent", "--config", str(config_file)], stdin=subprocess.DEVNULL, cwd=REPO
    )
    deadline = time.monotonic() + 30
    with AgentClient(live.config.socket_path, live.token) as probe:
        while True:
            try:
                if probe.health(timeout_s=1).pid == live.proc.pid:
                    return
            except AgentUnavailable:
                pass
            assert time.monotonic() < deadline, "the agent did not come back"
            time.sleep(0.02)


def test_calls_reuse_one_connection(live: LiveAgent) -> None:
    cwd = str(live.tree.workdir)
    with AgentClient(live.config.socket_path, live.token) as client:
        assert client.call("read_file", {"path": "hello.txt"}, cwd=cwd)["content"].startswith("hello")
        [first] = client.transport.idle_connections()
        for _ in range(4):
            assert client.call("read_file", {"path": "hello.txt"}, cwd=cwd)["content"].startswith("hello")
        [last] = client.transport.idle_connections()
        assert last is first and not last.writer.is_closing()  # the same socket carried every call


def test_threads_share_one_client(live: LiveAgent) -> None:
    cwd = str(live.tree.workdir)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: live.client.call("read_file", {"path": "hello.txt"}, cwd=cwd), range(40)))
    assert all(answer["content"].startswith("hello") for answer in answers)
    assert 1 <= len(live.client.transport.idle_connections()) <= 4  # each connection went back once its answer was read


def test_a_pooled_connection_to_a_restarted_agent_is_not_used(live: LiveAgent) -> None:
    cwd = str(live.tree.workdir)
    client = live.client
    assert client.call("list_dir", {"path": "."}, cwd=cwd)["entries"]
    assert len(client.transport.idle_connections()) == 1  # kept alive, now pointing at the agent about to go
    restart_same_agent(live)
    # Not "failed mid-request (may have run)": the dead connection is dropped before sending.
    assert client.call("read_file", {"path": "hello.txt"}, cwd=cwd)["content"].startswith("hello")


def test_no_agent_means_not_delivered(tmp_path: Path) -> None:
    with AgentClient(tmp_path / "agent.sock", "t" * 32, connect_timeout_s=1) as client:
        with pytest.raises(AgentUnavailable) as info:
            client.call("read_file", {"path": "x"}, cwd="/")
    assert info.value.delivered is False


def test_an_agent_dying_during_a_call_may_have_run_it(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    with AgentClient(path, "t" * 32) as client:

        def accept_read_and_drop() -> None:
            conn, _ = server.accept()
            conn.recv(65536)  # the request arrived ...
            conn.close()  # ... and no answer ever comes

        thread = threading.Thread(target=accept_read_and_drop)
        thread.start()
        with pytest.raises(AgentUnavailable) as info:
            client.call("shell", {"command": "true"}, cwd="/")
        thread.join()
    server.close()
    assert info.value.delivered is True


def test_read_bytes_arrives_raw_and_whole(live: LiveAgent) -> None:
    cwd = live.tree.workdir
    data = os.urandom(1024 * 1024 + 7)
    (cwd / "big.bin").write_bytes(data)
    result = live.client.call("read_bytes", {"path": "big.bin"}, cwd=str(cwd))
    assert isinstance(result, ReadBytesResult)
    assert hashlib.sha256(result.data).digest() == hashlib.sha256(data).digest()
    assert (result.size, result.media_type, result.path) == (len(data), "application/octet-stream", str(cwd / "big.bin"))
    # A model sees the same bytes as base64 in JSON.
    dumped = result.model_dump(mode="json")
    assert set(dumped) == {"path", "size", "media_type", "content_base64"}


def test_read_bytes_of_a_file_whose_name_is_not_utf8(live: LiveAgent) -> None:
    name = b"caf\xe9.png"
    os.makedirs(live.tree.workdir, exist_ok=True)
    with open(os.path.join(os.fsencode(live.tree.workdir), name), "wb") as fh:
        fh.write(b"\x89PNG")
    for path in (os.fsdecode(name), "caf\\xe9.png"):  # surrogateescape, or as listed (escaped)
        result = live.client.call("read_bytes", {"path": path}, cwd=str(live.tree.workdir))
        # The answer names it escaped, which the host can show and send on.
        assert result.data == b"\x89PNG" and result.path.endswith("/caf\\xe9.png") and result.media_type == "image/png"


def test_read_bytes_refusals_stay_structured(live: LiveAgent) -> None:
    with pytest.raises(AgentToolError) as info:
        live.client.call("read_bytes", {"path": str(live.tree.p("outside/secret.txt"))}, cwd=str(live.tree.workdir))
    assert info.value.code != "agent_error" and info.value.path


def test_without_the_raw_accept_the_agent_answers_json_and_the_client_reads_that_too(live: LiveAgent) -> None:
    """What an agent of an earlier BUILD (still serving until idle) sends back."""
    (live.tree.workdir / "img.png").write_bytes(b"\x89PNG\x00\x01")
    conn = http.client.HTTPConnection("agent")
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.sock.connect(live.config.socket_path)
    body = json.dumps({"arguments": {"path": "img.png"}, "cwd": str(live.tree.workdir)})
    conn.request("POST", "/v1/tools/read_bytes", body=body, headers={"Authorization": f"Bearer {live.token}"})
    answer = conn.getresponse()
    assert answer.headers["Content-Type"] == "application/json"
    payload = json.loads(answer.read())
    conn.close()
    assert payload["ok"] is True and "content_base64" in payload["result"]
    parsed = ReadBytesResult.from_json_result(payload["result"])
    raw = live.client.call("read_bytes", {"path": "img.png"}, cwd=str(live.tree.workdir))
    assert parsed == raw


def test_a_raw_answer_that_disagrees_with_its_header_is_refused() -> None:
    header = json.dumps({"path": "/x", "size": 3, "media_type": "text/plain"})
    assert ReadBytesResult.from_raw(header, b"abc").data == b"abc"
    for bad_header, data in [(header, b"ab"), ("not json", b"abc"), (json.dumps({"path": "/x"}), b"abc")]:
        with pytest.raises(ValueError):
            ReadBytesResult.from_raw(bad_header, data)
