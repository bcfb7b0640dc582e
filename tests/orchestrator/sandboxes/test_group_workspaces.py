"""Group workspaces are kept apart by the operating system, not only by the PathSandbox: each
workspace has its own gid, and only its members' sandboxes carry it. Through the HTTP API, so
the gids come from where production gets them (the router and the state DB).

The scenario functions take the client and the service; the docker tests run them again with
containers (`tests/orchestrator/sandboxes/docker/test_group_workspaces.py`)."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mounts.layout import GroupRef
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.api_calls import tool
from tests.conftest import API_TOKEN, make_settings

ALICE, BOB, CAROL = 17, 67, 91  # Alice and Bob are in the team chat, Carol in another one
TEAM = GroupRef("feishu", "oc_team")
OTHER = GroupRef("feishu", "oc_other")
AS_ROOT = os.geteuid() == 0
# A non-member meets a directory it may not enter (process backend) or no directory at all
# (its container does not mount the workspace).
REFUSED = ("Permission denied", "No such file or directory")

pytestmark = pytest.mark.skipif(not AS_ROOT, reason="sandbox uids and gids need a root orchestrator")


def group_session(client: TestClient, owner: int, group: GroupRef | None) -> str:
    body: dict[str, object] = {"owner_user_id": owner, "channel": "feishu_group" if group else "web"}
    if group is not None:
        body["group"] = {"channel": group.channel, "chat_id": group.chat_id}
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def speak(client: TestClient, sid: str, speaker: int) -> str:
    response = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": speaker})
    assert response.status_code == 201, response.text
    assert response.json()["runtime_user_id"] == speaker
    return response.json()["run_id"]


def shell(client: TestClient, run_id: str, command: str) -> dict:
    answer = tool(client, run_id, "shell", command=command)
    assert answer["ok"], answer
    return answer["result"]


def supplementary_gids(client: TestClient, run_id: str) -> set[int]:
    return {int(g) for g in shell(client, run_id, "id -G")["stdout"].split()}


def members_share_and_strangers_are_refused(
    client: TestClient, service: OrchestratorService, *, gids_visible: bool = True
) -> None:
    """`gids_visible`: whether `id -G` in the sandbox shows host gids (not in a user namespace,
    where unmapped groups read as the overflow gid but still grant access)."""
    team_sid = group_session(client, ALICE, TEAM)
    other_sid = group_session(client, CAROL, OTHER)
    alice, bob, carol = speak(client, team_sid, ALICE), speak(client, team_sid, BOB), speak(client, other_sid, CAROL)
    team_dir = service.layout.group_dir(TEAM)

    # Members edit each other's files, with the shell and with the file tools.
    assert shell(client, alice, f"echo 'by alice' > {team_dir}/notes.md")["exit_code"] == 0
    edited = shell(client, bob, f"echo 'and bob' >> {team_dir}/notes.md && mkdir {team_dir}/drafts && echo b > {team_dir}/drafts/b.md")
    assert edited["exit_code"] == 0, edited
    assert shell(client, alice, f"echo 'and alice' >> {team_dir}/drafts/b.md")["exit_code"] == 0
    assert tool(client, bob, "edit_file", path=f"{team_dir}/notes.md", old="by alice", new="by Alice")["ok"]
    assert (team_dir / "notes.md").read_text() == "by Alice\nand bob\n"
    assert (team_dir / "drafts" / "b.md").read_text() == "b\nand alice\n"

    # Carol's shell can neither list, read, write nor enter the team's workspace.
    for command in (
        f"ls {team_dir}",
        f"cat {team_dir}/notes.md",
        f"echo carol > {team_dir}/carol.md",
        f"echo carol >> {team_dir}/notes.md",
        f"cd {team_dir}/drafts",
    ):
        result = shell(client, carol, command)
        assert result["exit_code"] != 0, command
        assert any(marker in result["stderr"] for marker in REFUSED), (command, result)
        assert "alice" not in result["stdout"]
    assert not (team_dir / "carol.md").exists()
    assert (team_dir / "notes.md").read_text() == "by Alice\nand bob\n"
    team_gid = service.group_gids.gid_of(TEAM)
    other_gid = service.group_gids.gid_of(OTHER)
    shared_gid = service.directories.shared_gid
    assert len({team_gid, other_gid, shared_gid}) == 3
    st = team_dir.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, team_gid, 0o3770)
    assert (team_dir / "drafts").stat().st_gid == team_gid  # setgid: new dirs inherit the group
    assert service.layout.share_dir.stat().st_gid == shared_gid  # share/ stays common

    if gids_visible:
        assert {team_gid, shared_gid} <= supplementary_gids(client, alice)
        assert other_gid not in supplementary_gids(client, alice)
        carols = supplementary_gids(client, carol)
        assert team_gid not in carols and {other_gid, shared_gid} <= carols

    # ... and everybody still shares share/
    assert shell(client, carol, f"echo hi > {service.layout.share_dir}/from-carol")["exit_code"] == 0
    assert shell(client, bob, f"cat {service.layout.share_dir}/from-carol")["stdout"] == "hi\n"


def joining_gives_the_sandbox_the_new_gid(client: TestClient, service: OrchestratorService) -> None:
    team_sid = group_session(client, ALICE, TEAM)
    alice = speak(client, team_sid, ALICE)
    team_dir = service.layout.group_dir(TEAM)
    assert shell(client, alice, f"echo plan > {team_dir}/plan.md")["exit_code"] == 0
    team_gid = service.group_gids.gid_of(TEAM)

    own_sid = group_session(client, CAROL, None)
    carol_alone = tool(client, speak_web(client, own_sid), "shell", command=f"id -G; cat {team_dir}/plan.md")
    assert carol_alone["ok"] and carol_alone["result"]["exit_code"] != 0
    assert str(team_gid) not in carol_alone["result"]["stdout"].split()
    before = service.sandboxes.sandbox_user(CAROL).plan.plan_hash

    carol = speak(client, team_sid, CAROL)  # Carol speaks in the team chat: she joins it
    assert service.sandboxes.sandbox_user(CAROL).plan.plan_hash != before
    joined = shell(client, carol, f"cat {team_dir}/plan.md && echo carol >> {team_dir}/plan.md")
    assert joined["exit_code"] == 0, joined
    assert joined["stdout"] == "plan\n"
    assert team_gid in supplementary_gids(client, carol)
    assert (team_dir / "plan.md").read_text() == "plan\ncarol\n"


def revoking_takes_the_workspace_away_even_while_busy(client: TestClient, service: OrchestratorService) -> None:
    """Issue 12 item 11: a revoked member's next call runs without the workspace and its gid,
    even while an earlier call still keeps its sandbox busy."""
    team_sid = group_session(client, ALICE, TEAM)
    bob = speak(client, team_sid, BOB)
    team_dir = service.layout.group_dir(TEAM)
    team_gid = service.group_gids.gid_of(TEAM)
    assert shell(client, bob, f"echo bob > {team_dir}/bob.md")["exit_code"] == 0
    busy_call: dict[str, object] = {}
    sleeper = threading.Thread(
        target=lambda: busy_call.update(tool(client, bob, "shell", command="sleep 20", timeout_s=30)), daemon=True
    )
    sleeper.start()
    deadline = time.monotonic() + 10
    while not any(s.user_id == BOB and s.busy for s in service.sandboxes.status()):
        assert time.monotonic() < deadline, "the sleep never kept the sandbox busy"
        time.sleep(0.05)
    response = client.delete(f"/v1/groups/{TEAM.channel}/{TEAM.chat_id}/members/{BOB}")
    assert response.status_code == 200 and response.json()["removed"] is True, response.text
    started = time.monotonic()
    after = tool(client, bob, "shell", command=f"id -G; cat {team_dir}/bob.md; echo again >> {team_dir}/bob.md")
    assert after["ok"], after
    assert time.monotonic() - started < 15, "the call waited for the busy sandbox"
    assert after["result"]["exit_code"] != 0, after
    assert str(team_gid) not in after["result"]["stdout"].split()
    assert "bob" not in after["result"]["stdout"]
    assert (team_dir / "bob.md").read_text() == "bob\n"
    sleeper.join(timeout=40)
    assert busy_call.get("ok") is not True  # the old sandbox went away with its call


def test_item11_revoked_member_loses_the_workspace_on_the_next_call(
    agent_client: TestClient, agent_service: OrchestratorService
) -> None:
    revoking_takes_the_workspace_away_even_while_busy(agent_client, agent_service)


def speak_web(client: TestClient, sid: str) -> str:
    response = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web"})
    assert response.status_code == 201, response.text
    return response.json()["run_id"]


def test_members_share_and_strangers_are_refused(agent_client: TestClient, agent_service: OrchestratorService) -> None:
    members_share_and_strangers_are_refused(agent_client, agent_service)


def test_joining_restarts_the_idle_agent_with_the_groups_gid(
    agent_client: TestClient, agent_service: OrchestratorService
) -> None:
    joining_gives_the_sandbox_the_new_gid(agent_client, agent_service)


@pytest.fixture
def bwrap_client(agent_data_dir: Path) -> Iterator[tuple[TestClient, OrchestratorService]]:
    from tests.orchestrator.sandboxes.test_bwrap import bwrap_problem

    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(problem)
    service = OrchestratorService(make_settings(agent_data_dir, process_sandbox="bwrap"))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield client, service
    finally:
        service.close()


def test_the_gids_carry_into_the_bwrap_namespace(bwrap_client: tuple[TestClient, OrchestratorService]) -> None:
    members_share_and_strangers_are_refused(*bwrap_client, gids_visible=False)
