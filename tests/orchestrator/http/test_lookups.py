"""Lookups a bot needs: a group chat's sessions (and a create a bot may repeat per message), a
session's runs page by page, a user's sandbox status — with the visibility of the routes
beside them (orchestrator/http/routes_lookups.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from fastapi.testclient import TestClient

from tests.agent_env import agent_client, agent_data_dir, agent_service, traversable_tmp  # noqa: F401 - fixtures
from tests.api_calls import MEMBER, OWNER, group_session, start_run, tool

GROUP = {"channel": "feishu", "chat_id": "oc_team"}
STRANGER = {"X-Acting-User": "99"}


def _chat_session(client: TestClient, **extra: object):
    body = {"session_id": "feishu-oc_team", "owner_user_id": OWNER, "channel": "feishu_group", "group": GROUP,
            "if_exists": "return", **extra}
    return client.post("/v1/sessions", json=body)


def test_a_group_chat_session_is_found_by_its_chat_and_created_once(client: TestClient) -> None:
    assert client.get("/v1/sessions", params=GROUP).json()["sessions"] == []
    # Two messages of one chat at once: one creates the session, the other gets the same one.
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: _chat_session(client), range(2)))
    assert sorted(a.status_code for a in answers) == [200, 201], [a.text for a in answers]
    assert {a.json()["session_id"] for a in answers} == {"feishu-oc_team"}
    other = group_session(client)  # a second session of the same chat (without an id of its own)
    found = client.get("/v1/sessions", params=GROUP).json()
    assert found["owner_user_id"] is None
    assert {s["session_id"] for s in found["sessions"]} == {"feishu-oc_team", other}
    # The same id with other attributes, or without if_exists, stays a conflict.
    assert _chat_session(client, owner_user_id=MEMBER).status_code == 409
    assert _chat_session(client, if_exists="conflict").status_code == 409
    # A member sees the group's sessions; anyone else nothing; a half-given group is 422.
    start_run(client, other, trigger="group_message", speaker_user_id=MEMBER)  # MEMBER joins by speaking
    assert len(client.get("/v1/sessions", params=GROUP, headers={"X-Acting-User": str(MEMBER)}).json()["sessions"]) == 2
    assert client.get("/v1/sessions", params=GROUP, headers=STRANGER).json()["sessions"] == []
    assert client.get("/v1/sessions", params={"channel": "feishu"}).status_code == 422
    assert client.get("/v1/sessions", params={**GROUP, "chat_id": "../x"}).status_code == 422


def test_a_deleted_chat_session_is_not_returned_by_a_repeated_create(client: TestClient) -> None:
    assert _chat_session(client).status_code == 201
    assert client.delete("/v1/sessions/feishu-oc_team").status_code == 200
    assert _chat_session(client).status_code == 409  # a deleted id stays taken
    assert client.get("/v1/sessions", params=GROUP).json()["sessions"] == []


def test_a_sessions_runs_come_newest_first_page_by_page(client: TestClient) -> None:
    sid = group_session(client)
    started = []
    for _ in range(5):
        run = start_run(client, sid, trigger="group_message", speaker_user_id=OWNER)
        client.post(f"/v1/runs/{run['run_id']}/end", json={"status": "succeeded"})
        started.append(run["run_id"])
    seen, before = [], None
    while True:
        params = {"limit": 2, **({"before": before} if before else {})}
        page = client.get(f"/v1/sessions/{sid}/runs", params=params).json()
        seen += [r["run_id"] for r in page["runs"]]
        before = page["next_before"]
        if before is None:
            break
    assert seen == started[::-1]
    assert client.get(f"/v1/sessions/{sid}/runs", headers=STRANGER).status_code == 404
    assert client.get(f"/v1/sessions/{sid}/runs", params={"before": 2**63}).status_code == 422
    assert client.get("/v1/sessions/s-nope/runs").status_code == 404


def test_a_users_sandbox_status_follows_its_calls(agent_client: TestClient) -> None:
    sid = group_session(agent_client)
    before = agent_client.get(f"/v1/users/{OWNER}/sandbox").json()
    assert before == {"user_id": OWNER, "backend": "process", "state": "none", "since": None, "busy": 0, "last_call_at": None}
    run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=OWNER)
    assert tool(agent_client, run["run_id"], "shell", command="true")["ok"]
    after = agent_client.get(f"/v1/users/{OWNER}/sandbox").json()
    assert after["state"] == "running" and after["busy"] == 0
    assert datetime.fromisoformat(after["since"]) <= datetime.fromisoformat(after["last_call_at"])
    # Its own only, with the header; an unknown user is 404.
    assert agent_client.get(f"/v1/users/{OWNER}/sandbox", headers={"X-Acting-User": str(MEMBER)}).status_code == 403
    assert agent_client.get(f"/v1/users/{OWNER}/sandbox", headers={"X-Acting-User": str(OWNER)}).status_code == 200
    assert agent_client.get("/v1/users/4242/sandbox").status_code == 404
