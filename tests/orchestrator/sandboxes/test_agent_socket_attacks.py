"""Issue 12 item 1 on the process backend as root: a user's shell points its `agent.sock` at
a socket only root can reach (a host service, like /run/docker.sock). The host must not
connect to it as root and speak the user's call to it: the agent's peer must be the user's
own sandbox uid."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.api_calls import MEMBER, group_session, start_run, tool

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids need root")


def root_only_listener(directory: Path) -> tuple[Path, list[bytes], socket.socket]:
    """A Unix socket in a 0700 root directory that records what it receives."""
    directory.mkdir(mode=0o700)
    path = directory / "service.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    received: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    received.append(conn.recv(65536))
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return path, received, server


def test_item1_a_socket_link_to_a_root_only_service_is_never_spoken_to(
    agent_client: TestClient, agent_service: OrchestratorService, traversable_tmp: Path
) -> None:
    service_sock, received, server = root_only_listener(traversable_tmp / "root-only")
    try:
        sid = group_session(agent_client)
        run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)["run_id"]
        mine = agent_service.layout.socket_path(MEMBER)
        # 67's own shell plants the link and keeps its (pooled) connection busy, so the next
        # call must open a new connection by path.
        background = threading.Thread(
            target=tool, args=(agent_client, run, "shell"), kwargs={"command": f"ln -sfn {service_sock} {mine}; sleep 2"}
        )
        background.start()
        deadline = time.monotonic() + 10
        while not mine.is_symlink():
            assert time.monotonic() < deadline, "the link was not planted"
            time.sleep(0.02)
        answer = tool(agent_client, run, "write_file", path="note.txt", content="67's words")
        background.join()
        assert b"".join(received) == b"", received  # root sent nothing to a socket the user chose
        assert answer["ok"] is False and answer["error"]["code"] == "sandbox_unavailable", answer
        # the next call gets a fresh agent of 67's own
        assert tool(agent_client, run, "write_file", path="note.txt", content="67's words")["ok"] is True
    finally:
        server.close()
