"""The agent's loopback listener (where a pod's port-forward reaches it), its exec probe, and
the clients' `Connector`: a real agent process, real TCP on 127.0.0.1, the real clients."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_agent.client import AgentClient, AsyncAgentClient
from sandbox_agent.errors import AgentUnavailable
from sandbox_agent.probe import probe
from tests.sandbox_agent.conftest import LiveAgent, build_tree, start_agent, stop_agent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveAgent]:
    agent = start_agent(build_tree(tmp_path_factory.mktemp("loopback")), listen_port=free_port())
    yield agent
    stop_agent(agent)


def config_file(live: LiveAgent) -> str:
    return str(Path(live.config.socket_path).parent / "agent.json")


def tcp_connector(port: int):  # type: ignore[no-untyped-def]
    def connect(timeout_s: float) -> socket.socket:
        return socket.create_connection(("127.0.0.1", port), timeout=timeout_s)

    return connect


def test_the_agent_answers_on_its_loopback_port_with_the_token(live: LiveAgent) -> None:
    port = live.config.listen_port
    assert port is not None
    connector = tcp_connector(port)
    cwd = str(live.tree.workdir)
    with AgentClient(f"127.0.0.1:{port}", live.token, connector=connector) as client:
        assert client.health().instance_id == live.config.instance_id
        assert client.call("read_file", {"path": "hello.txt"}, cwd=cwd)["content"] == "hello\nworld\n"
    with AgentClient(f"127.0.0.1:{port}", "x" * 43, connector=connector) as wrong:
        with pytest.raises(AgentUnavailable) as info:
            wrong.call("read_file", {"path": "hello.txt"}, cwd=cwd)
        assert info.value.delivered is False  # the token was refused before anything ran

    async def over_the_loop() -> str:
        calls = AsyncAgentClient(f"127.0.0.1:{port}", live.token, connector=connector)
        try:
            first = await calls.call("read_file", {"path": "hello.txt"}, cwd=cwd)
            second = await calls.call("read_file", {"path": "hello.txt"}, cwd=cwd)  # a pooled connection
            assert first == second
            return first["content"]
        finally:
            calls.close()

    assert asyncio.run(over_the_loop()) == "hello\nworld\n"


def test_the_probe_says_whether_this_users_agent_answers(live: LiveAgent, tmp_path: Path) -> None:
    assert probe(config_file(live)) is True
    config = json.loads(Path(config_file(live)).read_text())
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**config, "user_id": 18}))
    assert probe(str(other)) is False  # the agent there answers for user 17
    nobody = tmp_path / "nobody.json"
    nobody.write_text(json.dumps({**config, "listen_port": free_port()}))
    assert probe(str(nobody)) is False
    unix = tmp_path / "unix.json"
    unix.write_text(json.dumps({**config, "listen_port": None}))
    assert probe(str(unix)) is True  # without a port: the agent's Unix socket
    assert probe(str(tmp_path / "missing.json")) is False


def test_a_connector_that_fails_means_nothing_was_sent() -> None:
    def refused(timeout_s: float) -> socket.socket:
        raise ConnectionRefusedError("nothing listens")

    def refusing_api(timeout_s: float) -> socket.socket:
        raise AgentUnavailable("the API refused the port-forward (403)", delivered=False)

    for connector in (refused, refusing_api):
        with AgentClient("pod x", "t" * 43, connector=connector) as client:
            with pytest.raises(AgentUnavailable) as info:
                client.health()
            assert info.value.delivered is False

        async def once() -> None:
            calls = AsyncAgentClient("pod x", "t" * 43, connector=connector)
            try:
                await calls.health()
            finally:
                calls.close()

        with pytest.raises(AgentUnavailable) as async_info:
            asyncio.run(once())
        assert async_info.value.delivered is False


def test_a_connection_that_comes_after_the_deadline_is_closed_not_leaked() -> None:
    """A stalled API server: the connector answers long after the client gave up. The call fails
    at its connect deadline; the socket that arrives later is closed."""
    late: list[socket.socket] = []
    released = threading.Event()

    def slow(timeout_s: float) -> socket.socket:
        time.sleep(timeout_s + 1.5)
        ours, theirs = socket.socketpair()
        late.append(theirs)
        released.set()
        return ours

    waited: list[float] = []

    async def once() -> None:
        calls = AsyncAgentClient("pod slow", "t" * 43, connector=slow, connect_timeout_s=0.2)
        started = time.monotonic()
        try:
            await calls.health()
        finally:
            waited.append(time.monotonic() - started)
            calls.close()

    with pytest.raises(AgentUnavailable) as info:
        asyncio.run(once())
    assert info.value.delivered is False
    assert waited[0] < 1.5  # the connect deadline plus the connector's own grace, not its 1.7 s
    assert released.wait(10)
    late[0].settimeout(5)
    assert late[0].recv(1) == b""  # our end was closed
    late[0].close()
