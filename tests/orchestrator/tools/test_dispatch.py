"""The dispatcher's per-call checks stay live after the latency work: the run and
its session are read on every call, and a sandbox's plan follows memberships at once."""

from __future__ import annotations

from fastapi.testclient import TestClient

from mounts.layout import GroupRef
from orchestrator import audit
from orchestrator.service import OrchestratorService

OWNER, MEMBER = 17, 67
TEAM = GroupRef("feishu", "oc_team")


def new_run(client: TestClient, owner: int, **session: object) -> dict:
    sid = client.post("/v1/sessions", json={"owner_user_id": owner, "channel": "web", **session}).json()["session_id"]
    response = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web"})
    assert response.status_code == 201, response.text
    return response.json()


def call(client: TestClient, run_id: str, name: str, **arguments: object):
    return client.post(f"/v1/runs/{run_id}/tools/{name}", json={"arguments": arguments})


def test_a_run_ended_between_two_calls_refuses_the_second_at_once(
    agent_client: TestClient, agent_service: OrchestratorService
) -> None:
    run = new_run(agent_client, OWNER)
    assert call(agent_client, run["run_id"], "write_file", path="a.txt", content="a").json()["ok"] is True
    assert agent_client.post(f"/v1/runs/{run['run_id']}/end", json={}).status_code == 200
    refused = call(agent_client, run["run_id"], "read_file", path="a.txt")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "run_ended"
    # Only the call that ran is audited.
    assert [e.detail["tool"] for e in audit.entries(agent_service.store, action="tool.call")] == ["write_file"]


def test_a_run_of_a_deleted_session_refuses_even_if_the_run_was_never_ended(
    agent_client: TestClient, agent_service: OrchestratorService
) -> None:
    run = new_run(agent_client, OWNER)
    assert call(agent_client, run["run_id"], "list_dir").json()["ok"] is True
    # A delete interrupted before its cleanup ended the runs: the session row says deleted,
    # the run row still says running.
    with agent_service.store.write() as tx:
        tx.execute("UPDATE sessions SET deleted_at = '2030-01-01T00:00:00Z' WHERE session_id = ?", (run["session_id"],))
    refused = call(agent_client, run["run_id"], "list_dir")
    assert refused.status_code == 404 and run["session_id"] in refused.json()["error"]["message"]


def test_joining_a_group_changes_the_very_next_calls_sandbox(
    agent_client: TestClient, agent_service: OrchestratorService
) -> None:
    own = new_run(agent_client, MEMBER)
    workspace = str(agent_service.layout.group_dir(TEAM))
    before = call(agent_client, own["run_id"], "list_dir", path=workspace).json()
    assert before["ok"] is False  # not a member: not one of the sandbox's roots
    plan_before = agent_service.sandboxes.sandbox_user(MEMBER).plan

    group = {"channel": "feishu_group", "group": {"channel": TEAM.channel, "chat_id": TEAM.chat_id}}
    sid = agent_client.post("/v1/sessions", json={"owner_user_id": OWNER, **group}).json()["session_id"]
    joined = agent_client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": MEMBER})
    assert joined.status_code == 201, joined.text

    after = call(agent_client, own["run_id"], "list_dir", path=workspace).json()  # the older run, same user
    assert after["ok"] is True, after
    plan_after = agent_service.sandboxes.sandbox_user(MEMBER).plan
    assert plan_after.plan_hash != plan_before.plan_hash
    assert any(m.purpose == "group:feishu/oc_team" for m in plan_after.mounts)
    assert agent_service.sandboxes.sandbox_user(MEMBER).plan is plan_after  # memoized while unchanged
