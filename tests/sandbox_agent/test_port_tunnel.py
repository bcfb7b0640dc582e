"""The agent's CONNECT tunnel (sandbox_agent/port_tunnel.py) on a real agent: a tunnel needs
the token, reaches a loopback port and relays both ways; the agent's own HTTP API still works
on the same socket."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from sandbox_agent.client import AsyncAgentClient
from sandbox_agent.errors import AgentToolError, AgentUnavailable
from tests.sandbox_agent.conftest import LiveAgent


def echo_once() -> tuple[socket.socket, int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    return listener, listener.getsockname()[1]


def test_a_tunnel_needs_the_token_and_relays_to_a_loopback_port(live_agent: LiveAgent, tmp_path: Path) -> None:
    listener, port = echo_once()

    async def scenario() -> bytes:
        wrong = AsyncAgentClient(live_agent.config.socket_path, "x" * 43)
        with pytest.raises(AgentUnavailable, match="rejected the token"):
            await wrong.open_port(port, timeout_s=5)
        right = AsyncAgentClient(live_agent.config.socket_path, live_agent.token)
        sock, already = await right.open_port(port, timeout_s=5)
        loop = asyncio.get_running_loop()
        conn, _ = await loop.sock_accept(listener)
        await loop.sock_sendall(sock, b"ping")
        got = await loop.sock_recv(conn, 4)
        await loop.sock_sendall(conn, b"pong")
        back = already + await loop.sock_recv(sock, 4)
        sock.close()
        conn.close()
        listener.close()
        with pytest.raises(AgentToolError) as closed:
            await right.open_port(port, timeout_s=5)
        assert closed.value.code == "port_not_listening"
        health = await right.health()
        assert health.user_id == live_agent.config.user_id
        return got + back

    listener.setblocking(False)
    assert asyncio.run(scenario()) == b"pingpong"
