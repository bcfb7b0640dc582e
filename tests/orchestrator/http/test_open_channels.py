"""Any chat platform: open channel names, a group channel's session names its group, platform
identities through the API, and a bot can offer a subset of the tools."""

from __future__ import annotations

from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.conftest import admin_headers


def test_any_platform_name_is_a_channel(client: TestClient) -> None:
    for channel in ("slack", "discord", "teams", "telegram", "acme-chat", "feishu_group"):
        body: dict = {"owner_user_id": 17, "channel": channel}
        if channel.endswith("_group"):
            body["group"] = {"channel": "feishu", "chat_id": "oc_x"}
        answer = client.post("/v1/sessions", json=body)
        assert answer.status_code == 201 and answer.json()["channel"] == channel, answer.text
    for bad in ("Slack", "1chat", "x" * 33, "sl ack", ""):
        answer = client.post("/v1/sessions", json={"owner_user_id": 17, "channel": bad})
        assert answer.status_code == 422, (bad, answer.text)


def test_a_group_channel_session_without_a_group_is_refused_at_creation(client: TestClient) -> None:
    answer = client.post("/v1/sessions", json={"owner_user_id": 17, "channel": "dingtalk_group"})
    assert answer.status_code == 422 and answer.json()["error"]["field"] == "group", answer.text
    assert "group" in answer.json()["error"]["message"]
    assert client.get("/v1/sessions", params={"owner_user_id": 17}).json()["sessions"] == []


def test_owner_by_id_and_by_identity_are_exclusive(client: TestClient) -> None:
    both = {"owner_user_id": 17, "owner": {"platform": "slack", "id": "U1"}, "channel": "slack"}
    assert client.post("/v1/sessions", json=both).status_code == 422
    assert client.post("/v1/sessions", json={"channel": "slack"}).status_code == 422
    bad = client.post("/v1/sessions", json={"owner": {"platform": "slack", "id": "a/b"}, "channel": "slack"})
    assert bad.status_code == 422


def test_the_identity_routes_give_the_same_user_id_on_every_repeat(client: TestClient, service: OrchestratorService) -> None:
    first = client.put("/v1/identities/slack/U024BE7LH", json={"display_name": "Ada"})
    assert first.status_code == 200, first.text
    again = client.put("/v1/identities/slack/U024BE7LH")
    assert again.json()["user_id"] == first.json()["user_id"]
    assert first.json() == {"user_id": first.json()["user_id"], "platform": "slack", "external_id": "U024BE7LH", "display_name": "Ada"}
    assert client.get("/v1/identities/slack/U024BE7LH").json() == first.json()
    assert client.get("/v1/identities/slack/UNKNOWN").status_code == 404
    assert client.put("/v1/identities/Slack/U1").status_code == 422
    assert client.put("/v1/identities/slack/" + "x" * 200).status_code == 422
    assert service.users.get(first.json()["user_id"]).display_name == "Ada"  # type: ignore[union-attr]


def test_admins_link_and_list_identities(client: TestClient) -> None:
    alice = client.put("/v1/identities/slack/U0ALICE").json()["user_id"]
    linked = client.put("/v1/admin/identities/feishu/ou_alice", json={"user_id": alice}, headers=admin_headers())
    assert linked.status_code == 201, linked.text
    again = client.put("/v1/admin/identities/feishu/ou_alice", json={"user_id": alice}, headers=admin_headers())
    assert again.status_code == 200
    bob = client.put("/v1/identities/slack/U0BOB").json()["user_id"]
    moved = client.put("/v1/admin/identities/feishu/ou_alice", json={"user_id": bob}, headers=admin_headers())
    assert moved.status_code == 409, moved.text
    assert client.put("/v1/admin/identities/feishu/ou_x", json={"user_id": alice}).status_code == 403  # the bot token
    listed = client.get("/v1/admin/identities", params={"user_id": alice}, headers=admin_headers()).json()
    assert sorted((i["platform"], i["external_id"]) for i in listed["identities"]) == [("feishu", "ou_alice"), ("slack", "U0ALICE")]
    page = client.get("/v1/admin/identities", params={"limit": 1}, headers=admin_headers()).json()
    assert len(page["identities"]) == 1 and page["next_after"] is not None
    rest = client.get("/v1/admin/identities", params={"after": page["next_after"]}, headers=admin_headers()).json()
    assert len(rest["identities"]) == 2 and rest["next_after"] is None
    # A session of the person on Feishu shows the Feishu identity; on Slack, the Slack one.
    feishu = client.post(
        "/v1/sessions", json={"owner": {"platform": "feishu", "id": "ou_alice"}, "channel": "feishu_private"}
    ).json()
    assert feishu["owner_user_id"] == alice and feishu["owner_identity"] == {"platform": "feishu", "id": "ou_alice"}
    slack = client.post("/v1/sessions", json={"owner_user_id": alice, "channel": "slack"}).json()
    assert slack["owner_identity"] == {"platform": "slack", "id": "U0ALICE"}


def test_a_bot_can_list_a_subset_of_the_tools(client: TestClient) -> None:
    everything = client.get("/v1/tools").json()["tools"]
    some = client.get("/v1/tools", params={"names": "read_file,shell"}).json()["tools"]
    assert [t["name"] for t in some] == ["read_file", "shell"]
    assert some == [t for t in everything if t["name"] in ("read_file", "shell")]
    assert len(str(some)) < len(str(everything)) / 4
    unknown = client.get("/v1/tools", params={"names": "read_file,rm_rf,nope"})
    assert unknown.status_code == 422 and "'nope'" in unknown.text and "'rm_rf'" in unknown.text
