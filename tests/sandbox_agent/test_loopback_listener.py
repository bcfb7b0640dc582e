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


class KeptOpenForward:
    """Stands in for the API server's port-forward of a deleted pod: each connection the
    connector opens is relayed to the agent's port, and when the agent's side closes, the
    caller's side stays open (as a deleted pod's websocket does) until the caller writes."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.refuse = False  # the pod is gone: new forwards are refused (a 404)

    def __call__(self, timeout_s: float) -> socket.socket:
        if self.refuse:
            raise AgentUnavailable("pod x is not in namespace y (404)", delivered=False)
        ours, theirs = socket.socketpair()
        upstream = socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s)
        threading.Thread(target=self._relay, args=(theirs, upstream), daemon=True).start()
        return ours

    @staticmethod
    def _relay(caller: socket.socket, upstream: socket.socket) -> None:
        import select

        sockets = [caller, upstream]
        try:
            while True:
                readable, _, _ = select.select(sockets, [], [])
                if caller in readable:
                    data = caller.recv(65536)
                    if not data:
                        return
                    try:
                        upstream.sendall(data)
                    except OSError:
                        return  # the agent is gone: only now the caller sees its end close
                if upstream in readable:
                    data = upstream.recv(65536)
                    if not data:
                        sockets = [caller]  # the agent closed: keep the caller's side open
                        upstream.close()
                        continue
                    caller.sendall(data)
        except OSError:
            return
        finally:
            caller.close()
            upstream.close()


def test_a_call_after_the_agent_behind_a_kept_open_forward_died_was_not_delivered(tmp_path: Path) -> None:
    """A pod deleted between two calls: the pooled forward looks open, but nothing answers
    behind it. The next call is not sent into it (which could only be reported "may have run"):
    the connection is found dead first, and the new forward's refusal says nothing was sent,
    so the protocol recreates the sandbox and sends the call once more."""
    agent = start_agent(build_tree(tmp_path), listen_port=free_port())
    try:
        assert agent.config.listen_port is not None
        forward = KeptOpenForward(agent.config.listen_port)
        cwd = str(agent.tree.workdir)
        blocking = AgentClient("pod x", agent.token, connector=forward)

        async def first() -> AsyncAgentClient:
            calls = AsyncAgentClient("pod x", agent.token, connector=forward)
            assert (await calls.call("read_file", {"path": "hello.txt"}, cwd=cwd))["content"].startswith("hello")
            return calls

        loop = asyncio.new_event_loop()
        try:
            calls = loop.run_until_complete(first())
            assert blocking.call("read_file", {"path": "hello.txt"}, cwd=cwd)["content"].startswith("hello")
            stop_agent(agent)
            forward.refuse = True
            time.sleep(0.5)  # idle for longer than VERIFY_IDLE_S, within the pool's reuse window
            with pytest.raises(AgentUnavailable) as info:
                blocking.call("write_file", {"path": "x.txt", "content": "x"}, cwd=cwd)
            assert info.value.delivered is False, info.value.message
            with pytest.raises(AgentUnavailable) as async_info:
                loop.run_until_complete(calls.call("write_file", {"path": "x.txt", "content": "x"}, cwd=cwd))
            assert async_info.value.delivered is False, async_info.value.message
            calls.close()
        finally:
            loop.close()
            blocking.close()
    finally:
        stop_agent(agent)


def test_a_new_forward_with_nothing_behind_it_was_not_delivered() -> None:
    """A terminating pod: the API server still opens the forward, and only once bytes arrive
    reports that nothing listens (it closes the stream). The call was not delivered."""

    def forward_to_nothing(timeout_s: float) -> socket.socket:
        ours, theirs = socket.socketpair()

        def fail_on_first_bytes() -> None:
            with theirs:
                theirs.recv(65536)  # then the connect to the pod's port fails: the stream ends

        threading.Thread(target=fail_on_first_bytes, daemon=True).start()
        return ours

    with AgentClient("pod x", "t" * 43, connector=forward_to_nothing) as client:
        with pytest.raises(AgentUnavailable) as info:
            client.call("write_file", {"path": "x.txt", "content": "x"}, cwd="/")
        assert info.value.delivered is False, info.value.message

    async def once() -> None:
        calls = AsyncAgentClient("pod x", "t" * 43, connector=forward_to_nothing)
        try:
            await calls.call("write_file", {"path": "x.txt", "content": "x"}, cwd="/")
        finally:
            calls.close()

    with pytest.raises(AgentUnavailable) as async_info:
        asyncio.run(once())
    assert async_info.value.delivered is False, async_info.value.message
