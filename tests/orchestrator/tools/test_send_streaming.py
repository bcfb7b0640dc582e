"""send_file of a sandbox file streams into the outbox: the bytes arrive in pieces into a
spool file (never whole in the orchestrator's memory), the delivery has exactly the file's
bytes and hash, and no spool file is left behind, also when the send is refused."""

from __future__ import annotations

import hashlib
import io
import json
import os

import pytest

from fastapi.testclient import TestClient

from orchestrator.deliveries.outbox import DeliverySpool
from orchestrator.service import OrchestratorService
from sandbox_agent import client as agent_client_module
from tests.agent_env import agent_client, agent_data_dir, agent_service, traversable_tmp  # noqa: F401 - fixtures
from tests.api_calls import group_session, start_run, tool
from tests.sandbox_agent.lying_agent import answer_once


def _outbox_names(service: OrchestratorService) -> set[str]:
    root = service.layout.outbox_root
    return set(os.listdir(root)) if root.exists() else set()


def test_a_sandbox_file_streams_into_its_delivery(agent_client: TestClient, agent_service: OrchestratorService, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    run = start_run(agent_client, group_session(agent_client), trigger="web")["run_id"]
    made = tool(agent_client, run, "shell", command="head -c 3000001 /dev/urandom > big.bin && sha256sum big.bin")
    expected = made["result"]["stdout"].split()[0]
    pieces: list[int] = []
    write = DeliverySpool.write
    monkeypatch.setattr(DeliverySpool, "write", lambda self, data: pieces.append(len(data)) or write(self, data))
    sent = tool(agent_client, run, "send_file", path_or_url="big.bin")
    assert sent["ok"], sent
    assert sent["result"]["size"] == 3000001 and sent["result"]["sha256"] == expected
    assert max(pieces) <= agent_client_module.SPOOL_CHUNK and sum(pieces) == 3000001  # in pieces, never whole
    fetched = agent_client.get(f"/v1/deliveries/{sent['result']['delivery_id']}")
    assert hashlib.sha256(fetched.content).hexdigest() == expected
    assert _outbox_names(agent_service) == {sent["result"]["delivery_id"]}  # no spool left


def test_a_refused_send_leaves_no_spool(agent_client: TestClient, agent_service: OrchestratorService) -> None:
    run = start_run(agent_client, group_session(agent_client), trigger="web")["run_id"]
    tool(agent_client, run, "shell", command="printf 'not a picture' > x.png && : > empty.txt")
    before = _outbox_names(agent_service)
    assert tool(agent_client, run, "send_image", path_or_url="x.png")["error"]["code"] == "not_an_image"
    assert tool(agent_client, run, "send_file", path_or_url="empty.txt")["error"]["code"] == "empty_file"
    assert tool(agent_client, run, "send_file", path_or_url="missing.txt")["error"]["code"] == "not_found"
    assert _outbox_names(agent_service) == before


@pytest.mark.parametrize(
    ("announced", "length", "body"),
    [
        (100, 100, b"x" * 50),  # Content-Length 100, 50 bytes, then it hangs up
        (10, 20, b"y" * 20),  # the result header's size disagrees with the body
    ],
)
def test_a_lying_agents_raw_answer_is_refused_not_spooled_as_done(traversable_tmp, announced: int, length: int, body: bytes) -> None:  # type: ignore[no-untyped-def]
    from sandbox_agent.client import AgentClient
    from sandbox_agent.errors import AgentToolError, AgentUnavailable

    path = str(traversable_tmp / "agent.sock")
    header = json.dumps({"path": "/x", "size": announced, "media_type": "text/plain"})
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {length}\r\n"
        f"X-Tool-Result: {header}\r\n\r\n"
    ).encode()
    thread = answer_once(path, head + body)
    sink = io.BytesIO()
    with pytest.raises((AgentToolError, AgentUnavailable)) as refused:
        AgentClient(path, "t" * 43).call("read_bytes", {"path": "x"}, cwd="/", sink=sink, timeout_s=5)
    thread.join(5)
    assert "bytes arrived" in str(refused.value) or "failed mid-request" in str(refused.value)
