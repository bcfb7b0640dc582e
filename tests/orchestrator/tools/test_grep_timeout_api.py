"""ORCH_GREP_TIMEOUT_S end to end: the setting reaches the agent, the agent that sandbox uids
run has the `regex` engine deployed, and the model gets a `timeout` tool error while the same
sandbox keeps serving. The docker twin is in tests/orchestrator/sandboxes/docker/."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import API_TOKEN, make_settings

EVIL = r"(a|aa)+$"


def run_in_group_session(client: TestClient) -> dict:
    body = {"owner_user_id": 17, "channel": "feishu_group", "group": {"channel": "feishu", "chat_id": "oc_grep"}}
    sid = client.post("/v1/sessions", json=body).json()["session_id"]
    response = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": 67})
    assert response.status_code == 201, response.text
    return response.json()


def a_backtracking_grep_times_out_while_the_sandbox_serves(client: TestClient) -> None:
    run = run_in_group_session(client)

    def call(name: str, **arguments: object) -> dict:
        response = client.post(f"/v1/runs/{run['run_id']}/tools/{name}", json={"arguments": arguments})
        assert response.status_code == 200, response.text
        return response.json()

    assert call("write_file", path="evil.txt", content="a" * 60 + "!\n")["ok"]
    answers: list[dict] = []
    worker = threading.Thread(target=lambda: answers.append(call("grep_search", pattern=EVIL)))
    worker.start()
    time.sleep(0.5)
    asked = time.monotonic()
    assert call("read_file", path="evil.txt")["ok"]
    assert time.monotonic() - asked < 1.5  # not queued behind the grep
    worker.join(30)
    (answer,) = answers
    assert answer["ok"] is False
    assert answer["error"]["code"] == "timeout"
    assert answer["error"]["path"] == f"{run['workdir']}/evil.txt"
    assert "backtracking" in answer["error"]["message"]
    found = call("grep_search", pattern=r"a{60}!")
    assert found["ok"] and [m["line"] for m in found["result"]["matches"]] == [1]


@pytest.fixture
def grep_client(agent_data_dir: Path) -> Iterator[TestClient]:
    service = OrchestratorService(make_settings(agent_data_dir, grep_timeout_s=2))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield client
    finally:
        service.close()


def test_a_backtracking_grep_times_out_in_the_process_backend(grep_client: TestClient) -> None:
    a_backtracking_grep_times_out_while_the_sandbox_serves(grep_client)
