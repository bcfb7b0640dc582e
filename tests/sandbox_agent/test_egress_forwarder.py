"""The in-sandbox egress forwarder (sandbox_agent/egress_forwarder.py) against a real Unix
listener standing in for the host's proxy: it hands each TCP connection over (SCM_RIGHTS), or,
where the sandbox's sockets are not the host's (gVisor), relays the connection's bytes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sandbox_agent.egress_forwarder import Forwarder
from sandbox_agent.relay import HANDOFF
from sandbox_agent.wire import EgressConfig


@pytest.mark.parametrize("hand_over", [True, False])
def test_a_connection_reaches_the_proxy_handed_over_or_relayed(tmp_path: Path, hand_over: bool) -> None:
    proxy_path = str(tmp_path / "egress.sock")
    proxy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    proxy.bind(proxy_path)
    proxy.listen(1)
    proxy.settimeout(10)
    forwarder = Forwarder(EgressConfig(socket_path=proxy_path, port=0, hand_over=hand_over))
    forwarder.start()
    client = socket.create_connection(("127.0.0.1", forwarder.port), timeout=10)
    try:
        client.sendall(b"GET http://example.test/ HTTP/1.1\r\n\r\n")
        conn, _ = proxy.accept()
        conn.settimeout(10)
        data, fds, _, _ = socket.recv_fds(conn, 4096, 1)
        if hand_over:
            assert data == HANDOFF and len(fds) == 1
            peer = socket.socket(fileno=fds[0])  # the client's own TCP connection
            assert peer.recv(4096).startswith(b"GET http://example.test/")
            peer.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
            peer.close()
        else:
            assert fds == [] and data.startswith(b"GET http://example.test/")
            conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
            conn.shutdown(socket.SHUT_WR)
        assert client.recv(4096) == b"HTTP/1.1 204 No Content\r\n\r\n"
        conn.close()
    finally:
        client.close()
        proxy.close()
