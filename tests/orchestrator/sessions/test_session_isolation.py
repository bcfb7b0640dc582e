"""Every session endpoint checks the acting user and scope before reading anything:
anything not theirs is 404 exactly like an unknown id, and no chat file is opened."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mounts.plan import plan_mounts
from orchestrator import audit
from orchestrator.service import OrchestratorService
from tests.orchestrator.sessions.conftest import GROUP, SessionsApi, trapped

ENDPOINTS = [
    ("GET", "/v1/sessions/{sid}", None),
    ("PATCH", "/v1/sessions/{sid}", {"title": "taken over", "cross_private": False}),
    ("DELETE", "/v1/sessions/{sid}", None),
    ("POST", "/v1/sessions/{sid}/messages", {"messages": [{"role": "user", "content": "injected"}]}),
    ("GET", "/v1/sessions/{sid}/messages", None),
    ("POST", "/v1/sessions/{sid}/runs", {"trigger": "web"}),
]
STRANGER = 99


def call(api: SessionsApi, method: str, path: str, body: dict | None, sid: str, acting: int | None):
    headers = {} if acting is None else {"X-Acting-User": str(acting)}
    return api.client.request(method, path.format(sid=sid), json=body, headers=headers)


def assert_like_unknown(api: SessionsApi, method: str, path: str, body: dict | None, sid: str, acting: int) -> None:
    response = call(api, method, path, body, sid, acting)
    unknown = call(api, method, path, body, "no-such-session", acting)
    assert unknown.status_code == 404
    assert response.status_code == 404, (method, path, response.text)
    assert response.json() == {"error": {**unknown.json()["error"], "message": f"session {sid} not found"}}


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS])
def test_another_users_session_is_404_and_nothing_is_read(
    api: SessionsApi, service: OrchestratorService, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    method: str, path: str, body: dict | None,
) -> None:
    api.create("mine", 17, project="p1", title="private plans")
    assert api.say("mine", "my secret").status_code == 200
    bait = tmp_path / "bait"
    caplog.set_level(logging.WARNING)
    with trapped(api.chat_dir("mine"), bait):
        assert_like_unknown(api, method, path, body, "mine", STRANGER)
        # the trap works: opening the chat records now does surface an error
        control = api.client.get("/v1/sessions/mine/messages", headers={"X-Acting-User": "17"})
        assert control.status_code == 500 and control.json()["error"]["code"] == "chat_storage_refused"
        assert list(bait.iterdir()) == []
    refusals = [r for r in caplog.records if "chat storage refused" in r.getMessage()]
    assert len(refusals) == 1  # the control's, and nothing from the stranger's call
    # and nothing changed
    assert api.client.get("/v1/sessions/mine").json()["title"] == "private plans"
    assert [m["content"] for m in api.client.get("/v1/sessions/mine/messages").json()["messages"]] == ["my secret"]
    assert audit.entries(service.store, action="run.start") == []
    assert audit.entries(service.store, action="session.delete") == []


def test_group_members_read_and_write_messages_but_only_the_owner_changes_or_deletes(api: SessionsApi) -> None:
    api.create("G", 17, group=GROUP)
    api.run("G", "group_message", speaker=67)  # 67 speaks, so joins
    member = {"X-Acting-User": "67"}
    assert api.client.get("/v1/sessions/G", headers=member).status_code == 200
    assert api.say("G", "from 67", acting=67, speaker_user_id=67).status_code == 200
    messages = api.client.get("/v1/sessions/G/messages", headers=member).json()["messages"]
    assert messages[-1]["content"] == "from 67" and messages[-1]["speaker_user_id"] == 67
    for method, path, body in ENDPOINTS:
        if method in ("PATCH", "DELETE"):
            assert_like_unknown(api, method, path, body, "G", 67)
        assert_like_unknown(api, method, path, body, "G", STRANGER)
    assert api.patch("G", acting=17, pinned=True).status_code == 200


def test_a_newcomer_joins_by_speaking_only_through_the_trusted_bot(api: SessionsApi) -> None:
    """Issue 12 item 11: with X-Acting-User a person cannot join a group whose session it
    cannot see; the bot without the header still adds a speaker (docs/decisions.md)."""
    api.create("G", 17, group=GROUP)
    speak = {"trigger": "group_message", "speaker_user_id": 68}
    assert_like_unknown(api, "POST", "/v1/sessions/{sid}/runs", speak, "G", 68)
    response = api.client.post("/v1/sessions/G/runs", json=speak)
    assert response.status_code == 201 and response.json()["runtime_user_id"] == 68
    again = api.client.post("/v1/sessions/G/runs", json=speak, headers={"X-Acting-User": "68"})
    assert again.status_code == 201, again.text
    # naming someone else as the speaker is refused before any session is looked at
    api.create("solo", 17)
    for sid in ("solo", "no-such"):
        other = {"trigger": "group_message", "speaker_user_id": 17}
        refused = api.client.post(f"/v1/sessions/{sid}/runs", json=other, headers={"X-Acting-User": "68"})
        assert refused.status_code == 403 and refused.json()["error"]["field"] == "speaker_user_id"


def test_listing_shows_only_the_acting_users_sessions_in_one_scope(api: SessionsApi) -> None:
    api.create("a1", 17, project="p1")
    api.create("a2", 17, project="p1")
    api.create("a3", 17)
    api.create("b1", 18, project="p1")
    listing = api.client.get("/v1/sessions", params={"project_id": "p1"}, headers={"X-Acting-User": "17"}).json()
    assert sorted(s["session_id"] for s in listing["sessions"]) == ["a1", "a2"]
    personal = api.client.get("/v1/sessions", params={"owner_user_id": 17}).json()
    assert [s["session_id"] for s in personal["sessions"]] == ["a3"]
    foreign = api.client.get(
        "/v1/sessions", params={"owner_user_id": 17, "project_id": "p1"}, headers={"X-Acting-User": "18"}
    )
    assert foreign.status_code == 200 and foreign.json()["sessions"] == []
    assert api.client.get("/v1/sessions").status_code == 422
    assert api.client.get("/v1/sessions", params={"owner_user_id": 17, "project_id": "../x"}).status_code == 422


def test_bad_acting_user_and_bad_ids_are_422(api: SessionsApi) -> None:
    api.create("mine", 17)
    assert api.client.get("/v1/sessions/mine", headers={"X-Acting-User": "abc"}).status_code == 422
    assert api.client.get("/v1/sessions/mine", headers={"X-Acting-User": "0"}).status_code == 422
    # an encoded slash is decoded before routing: no route has a session id with a slash in it
    assert api.client.post("/v1/sessions/a%2F..%2Fb/messages", json={"messages": []}).status_code == 404
    bad = api.client.post("/v1/sessions/mine/messages", json={"messages": [{"role": "system", "content": "x"}]})
    assert bad.status_code == 422 and bad.json()["error"]["field"].startswith("messages.0.role")
    assert api.client.post("/v1/sessions/mine/messages", json={"messages": []}).status_code == 422
    unknown_field = api.client.post("/v1/sessions/mine/messages", json={"messages": [{"role": "user", "content": "x", "x": 1}]})
    assert unknown_field.status_code == 422
    assert api.client.get("/v1/sessions/mine/messages").json()["total"] == 0  # nothing was appended


def test_sandboxes_never_see_sessions_or_state(service: OrchestratorService) -> None:
    layout = service.layout
    from mounts.layout import GroupRef

    for user_id in (1, 17, 67):
        plan = plan_mounts(layout, user_id, [GroupRef("feishu", "oc_team")])
        for mount in plan.mounts:
            for host_only in (layout.sessions_root, layout.state_dir):
                assert not mount.host_path.is_relative_to(host_only), mount
                assert not host_only.is_relative_to(mount.host_path), mount
        for root in plan.allowed_roots(in_sandbox=False):
            assert not layout.sessions_root.is_relative_to(root.path)
            assert not layout.state_dir.is_relative_to(root.path)


def test_creating_for_someone_else_or_under_an_invisible_parent_is_refused(api: SessionsApi) -> None:
    api.create("theirs", 18)
    mine = {"X-Acting-User": "17"}
    other_owner = api.client.post("/v1/sessions", json={"owner_user_id": 18, "channel": "web"}, headers=mine)
    assert other_owner.status_code == 403 and other_owner.json()["error"]["field"] == "owner_user_id"
    body = {"session_id": "child", "owner_user_id": 17, "channel": "web"}
    hidden = api.client.post("/v1/sessions", json={**body, "parent_session_id": "theirs"}, headers=mine)
    missing = api.client.post("/v1/sessions", json={**body, "parent_session_id": "nobody"}, headers=mine)
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["message"].replace("theirs", "X") == missing.json()["error"]["message"].replace("nobody", "X")
    assert api.client.get("/v1/sessions/child").status_code == 404
    api.create("own-parent", 17)
    ok = api.client.post("/v1/sessions", json={**body, "parent_session_id": "own-parent"}, headers=mine)
    assert ok.status_code == 201


def test_a_session_whose_chat_dir_cannot_be_made_does_not_come_into_existence(
    api: SessionsApi, service: OrchestratorService, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    service.layout.sessions_root.mkdir(exist_ok=True)
    (service.layout.sessions_root / "actor-17").symlink_to(victim, target_is_directory=True)
    response = api.client.post("/v1/sessions", json={"session_id": "x", "owner_user_id": 17, "channel": "web"})
    assert response.status_code == 500 and response.json()["error"]["code"] == "chat_storage_refused"
    assert list(victim.iterdir()) == []
    assert service.session_repo.get_any("x") is None
    (service.layout.sessions_root / "actor-17").unlink()
    assert api.client.post("/v1/sessions", json={"session_id": "x", "owner_user_id": 17, "channel": "web"}).status_code == 201
