"""Bad input gets a 422 naming the field and changes nothing; auth is 401/403."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.conftest import admin_headers


def _sessions_in_db(service: OrchestratorService) -> int:
    with service.store.read() as tx:
        return tx.one("SELECT count(*) FROM sessions")[0]


@pytest.mark.parametrize(
    "body,field",
    [
        ({"owner_user_id": 0, "channel": "web"}, "owner_user_id"),
        ({"owner_user_id": -3, "channel": "web"}, "owner_user_id"),
        ({"owner_user_id": "17", "channel": "web"}, "owner_user_id"),
        ({"owner_user_id": True, "channel": "web"}, "owner_user_id"),
        ({"owner_user_id": 17, "channel": "Telegram"}, "channel"),
        ({"owner_user_id": 17, "channel": "web", "session_id": "../etc"}, "session_id"),
        ({"owner_user_id": 17, "channel": "web", "session_id": ".."}, "session_id"),
        ({"owner_user_id": 17, "channel": "web", "session_id": "a/b"}, "session_id"),
        ({"owner_user_id": 17, "channel": "web", "session_id": "x" * 129}, "session_id"),
        ({"owner_user_id": 17, "channel": "web", "session_id": ""}, "session_id"),
        ({"owner_user_id": 17, "channel": "web", "project_id": "p/q"}, "project_id"),
        ({"owner_user_id": 17, "channel": "web", "group": {"channel": "..", "chat_id": "c"}}, "group.channel"),
        ({"owner_user_id": 17, "channel": "web", "group": {"channel": "f", "chat_id": "a/b"}}, "group.chat_id"),
        ({"owner_user_id": 17, "channel": "web", "unknown": 1}, "unknown"),
        ({"channel": "web"}, "owner_user_id"),
    ],
)
def test_bad_session_bodies_are_422_and_change_nothing(client: TestClient, service: OrchestratorService, body, field) -> None:
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert _sessions_in_db(service) == 0


@pytest.mark.parametrize("session_id", ["a$b", "a b", "x" * 129, "ä", "a;b"])
def test_bad_session_ids_in_paths_are_422(client: TestClient, session_id: str) -> None:
    response = client.get(f"/v1/sessions/{session_id}")
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "session_id"


def test_bad_run_bodies(client: TestClient, service: OrchestratorService) -> None:
    client.post("/v1/sessions", json={"session_id": "s1", "owner_user_id": 17, "channel": "web"})
    cases = [
        ({"trigger": "nonsense"}, "trigger"),
        ({"trigger": "group_message"}, "speaker_user_id"),
        ({"trigger": "group_message", "speaker_user_id": 0}, "speaker_user_id"),
        ({"trigger": "group_message", "speaker_user_id": "67"}, "speaker_user_id"),
        ({"trigger": "web", "agent_id": "../x"}, "agent_id"),
        ({"trigger": "subagent"}, "trigger"),
        ({"trigger": "web", "extra": True}, "extra"),
    ]
    for body, field in cases:
        response = client.post("/v1/sessions/s1/runs", json=body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["field"] == field, body
    with service.store.read() as tx:
        assert tx.one("SELECT count(*) FROM runs")[0] == 0
        assert tx.one("SELECT last_runtime_user_id FROM sessions")[0] is None


def test_unknown_ids_are_404(client: TestClient) -> None:
    assert client.get("/v1/sessions/nope").status_code == 404
    assert client.post("/v1/sessions/nope/runs", json={"trigger": "web"}).status_code == 404
    assert client.patch("/v1/sessions/nope", json={"title": "x"}).status_code == 404
    assert client.delete("/v1/sessions/nope").status_code == 404
    assert client.get("/v1/runs/r-nope").status_code == 404
    parent = client.post("/v1/sessions", json={"owner_user_id": 1, "channel": "web", "parent_session_id": "nope"})
    assert parent.status_code == 404 and parent.json()["error"]["field"] == "parent_session_id"


def test_duplicate_and_deleted_ids_are_409(client: TestClient) -> None:
    body = {"session_id": "dup", "owner_user_id": 17, "channel": "web"}
    assert client.post("/v1/sessions", json=body).status_code == 201
    assert client.post("/v1/sessions", json=body).status_code == 409
    assert client.delete("/v1/sessions/dup").status_code == 200
    assert client.get("/v1/sessions/dup").status_code == 404
    assert client.post("/v1/sessions", json=body).status_code == 409


def test_patch_flags(client: TestClient) -> None:
    client.post("/v1/sessions", json={"session_id": "s1", "owner_user_id": 17, "channel": "web"})
    response = client.patch("/v1/sessions/s1", json={"title": "T", "archived": True, "cross_private": True})
    assert response.status_code == 200
    body = response.json()
    assert (body["title"], body["archived"], body["cross_private"], body["pinned"]) == ("T", True, True, False)
    assert client.patch("/v1/sessions/s1", json={"archived": "yes"}).status_code == 422
    assert client.patch("/v1/sessions/s1", json={"owner_user_id": 3}).status_code == 422


def test_acting_user_sees_only_their_sessions(client: TestClient) -> None:
    client.post("/v1/sessions", json={"session_id": "s1", "owner_user_id": 17, "channel": "web"})
    assert client.get("/v1/sessions/s1", headers={"X-Acting-User": "17"}).status_code == 200
    other = client.get("/v1/sessions/s1", headers={"X-Acting-User": "18"})
    assert other.status_code == 404
    assert other.json() == client.get("/v1/sessions/none", headers={"X-Acting-User": "18"}).json() | {
        "error": other.json()["error"]
    }
    assert client.get("/v1/sessions/s1", headers={"X-Acting-User": "x"}).status_code == 422
    assert client.delete("/v1/sessions/s1", headers={"X-Acting-User": "18"}).status_code == 404
    assert client.get("/v1/sessions/s1").status_code == 200


def test_auth(client: TestClient) -> None:
    bare = {"Authorization": ""}
    assert client.get("/v1/tools", headers=bare).status_code == 401
    assert client.get("/v1/tools", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/tools").status_code == 200
    assert client.get("/v1/tools", headers=admin_headers()).status_code == 200
    assert client.get("/v1/admin/runtime-identity").status_code == 403
    assert client.get("/v1/admin/runtime-identity", headers=bare).status_code == 401
    assert client.get("/v1/admin/runtime-identity", headers=admin_headers()).status_code == 200
    assert client.get("/healthz", headers=bare).status_code == 200
    assert client.put("/v1/admin/runtime-identity", json={"mode": "bogus"}, headers=admin_headers()).status_code == 422


def test_openapi_is_served(client: TestClient) -> None:
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/sessions/{session_id}/runs" in paths
