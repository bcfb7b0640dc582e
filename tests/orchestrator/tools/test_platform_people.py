"""A Slack-style bot names people by their platform ids only, and gets the same behaviour as a
bot that keeps its own integer ids: the group scenario runs both ways (real process agents)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mounts.layout import GroupRef
from orchestrator.service import OrchestratorService
from tests.api_calls import MEMBER, OWNER, tool

AS_ROOT = os.geteuid() == 0


class Integers:
    """People by our integer ids, a Feishu group channel."""

    channel, group = "feishu_group", GroupRef("feishu", "oc_team")

    def owner(self) -> dict:
        return {"owner_user_id": OWNER}

    def speaker(self) -> dict:
        return {"speaker_user_id": MEMBER}

    def ids(self, client: TestClient) -> tuple[int, int]:
        return OWNER, MEMBER


class Slack:
    """People by their Slack ids only, an open channel name."""

    channel, group = "slack", GroupRef("slack", "C0GROUP")

    def owner(self) -> dict:
        return {"owner": {"platform": "slack", "id": "U0OWNER"}}

    def speaker(self) -> dict:
        return {"speaker": {"platform": "slack", "id": "U0SPEAK"}}

    def ids(self, client: TestClient) -> tuple[int, int]:
        owner = client.get("/v1/identities/slack/U0OWNER").json()["user_id"]
        speaker = client.get("/v1/identities/slack/U0SPEAK").json()["user_id"]
        return owner, speaker


@pytest.mark.parametrize("naming", [Integers(), Slack()], ids=["integer-ids", "slack-ids"])
def test_the_group_scenario_is_the_same_whichever_way_people_are_named(
    agent_client: TestClient, agent_service: OrchestratorService, naming: Integers | Slack
) -> None:
    group = {"channel": naming.group.channel, "chat_id": naming.group.chat_id}
    created = agent_client.post("/v1/sessions", json={**naming.owner(), "channel": naming.channel, "group": group})
    assert created.status_code == 201, created.text
    session = created.json()
    member_run = agent_client.post(f"/v1/sessions/{session['session_id']}/runs", json={"trigger": "group_message", **naming.speaker()})
    assert member_run.status_code == 201, member_run.text
    run = member_run.json()
    owner_id, speaker_id = naming.ids(agent_client)
    assert session["owner_user_id"] == owner_id
    assert (run["owner_user_id"], run["execution_user_id"], run["runtime_user_id"]) == (owner_id, speaker_id, speaker_id)
    if isinstance(naming, Slack):
        assert session["owner_identity"] == {"platform": "slack", "id": "U0OWNER"}
        assert run["owner_identity"] == {"platform": "slack", "id": "U0OWNER"}
        assert run["speaker_identity"] == {"platform": "slack", "id": "U0SPEAK"}
    else:
        assert session["owner_identity"] is None and run["speaker_identity"] is None
    workspace = agent_service.layout.group_dir(naming.group)
    assert run["group_workspace"] == str(workspace)
    assert run["outputs_dir"] == f"{run['workdir']}/outputs" and Path(run["outputs_dir"]).is_dir()

    # The member's files are the member's; the owner's run is told so in words.
    written = tool(agent_client, run["run_id"], "write_file", path="report.md", content="by the speaker\n")
    assert written["ok"], written
    owner_run = agent_client.post(f"/v1/sessions/{session['session_id']}/runs", json={"trigger": "web"}).json()
    assert owner_run["runtime_user_id"] == owner_id
    denied = tool(agent_client, owner_run["run_id"], "read_file", path=f"{run['workdir']}/report.md")
    assert denied["error"]["code"] == "foreign_runtime_path", denied
    # Separate sandboxes, one per person.
    running = {s.user_id for s in agent_service.sandboxes.backends["process"].status()}
    assert {owner_id, speaker_id} <= running
    if AS_ROOT:
        uids = [tool(agent_client, r["run_id"], "shell", command="id -u")["result"]["stdout"].strip() for r in (run, owner_run)]
        assert uids[0] != uids[1]

    # The group's workspace and its uploads.
    shared = tool(agent_client, run["run_id"], "write_file", path=f"{workspace}/plan.md", content="for all\n")
    assert shared["ok"], shared
    assert tool(agent_client, owner_run["run_id"], "read_file", path=f"{workspace}/plan.md")["result"]["content"] == "for all\n"
    upload = agent_client.put(f"/v1/runs/{run['run_id']}/files/incoming/minutes.txt", content=b"minutes\n", params={"scope": "group"})
    assert upload.status_code == 201, upload.text
    assert upload.json()["path"].startswith(f"{workspace}/chat-files/")


def test_acting_user_by_platform_identity(agent_client: TestClient) -> None:
    created = agent_client.post("/v1/sessions", json={"owner": {"platform": "slack", "id": "U0ME"}, "channel": "slack"})
    assert created.status_code == 201, created.text
    me = agent_client.get("/v1/identities/slack/U0ME").json()["user_id"]
    mine = agent_client.get("/v1/sessions", headers={"X-Acting-User": "slack:U0ME"})
    assert [s["session_id"] for s in mine.json()["sessions"]] == [created.json()["session_id"]]
    other = agent_client.get(f"/v1/sessions/{created.json()['session_id']}", headers={"X-Acting-User": "slack:U0SOMEONE"})
    assert other.status_code == 404
    assert agent_client.get("/v1/users/slack:U0ME").json()["user_id"] == me
    assert agent_client.get("/v1/users/slack:U0ME").json()["identities"] == [{"platform": "slack", "id": "U0ME"}]
    assert agent_client.get("/v1/users/slack:U0NOBODY").status_code == 404
    bad = agent_client.get("/v1/sessions", headers={"X-Acting-User": "slack:a b"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "X-Acting-User"
