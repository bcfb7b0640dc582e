"""The API calls many tests make through a TestClient with the bot token: a group session of
owner 17, a run in it, a tool call (whose answer is always 200; `ok` says how it went)."""

from __future__ import annotations

from fastapi.testclient import TestClient

OWNER, MEMBER = 17, 67


def group_session(client: TestClient) -> str:
    body = {"owner_user_id": OWNER, "channel": "feishu_group", "group": {"channel": "feishu", "chat_id": "oc_team"}}
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def start_run(client: TestClient, sid: str, **body: object) -> dict:
    response = client.post(f"/v1/sessions/{sid}/runs", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def tool(client: TestClient, run_id: str, name: str, **arguments: object) -> dict:
    response = client.post(f"/v1/runs/{run_id}/tools/{name}", json={"arguments": arguments})
    assert response.status_code == 200, response.text
    return response.json()
