"""Container tools through the HTTP API, against real process-backend agents."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from orchestrator import audit
from orchestrator.service import OrchestratorService
from tests.api_calls import MEMBER, OWNER, group_session, start_run, tool
from tests.conftest import admin_headers



def test_group_scenario_member_writes_owner_cannot_read_member_cannot_read_owner_upload(
    agent_client: TestClient, agent_data_dir: Path
) -> None:
    sid = group_session(agent_client)
    member_run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    assert member_run["runtime_user_id"] == MEMBER
    written = tool(agent_client, member_run["run_id"], "write_file", path="report.md", content="by 67\n")
    assert written["ok"] is True
    member_file = f"{member_run['workdir']}/report.md"
    assert written["result"]["path"] == member_file
    assert Path(member_file).read_text() == "by 67\n"

    owner_run = start_run(agent_client, sid, trigger="web")
    assert owner_run["runtime_user_id"] == OWNER
    denied = tool(agent_client, owner_run["run_id"], "read_file", path=member_file)
    assert denied["ok"] is False
    assert denied["error"]["code"] == "foreign_runtime_path"
    assert "(current runtime identity 17)" in denied["error"]["message"]
    assert denied["error"]["path"] == member_file

    owner_upload = f"{owner_run['upload_dir']}/x.png"
    Path(owner_upload).write_bytes(b"\x89PNG")
    member_again = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    denied = tool(agent_client, member_again["run_id"], "read_file", path=owner_upload)
    assert denied["error"]["code"] == "foreign_upload_path"
    assert "(current runtime identity 67)" in denied["error"]["message"]
    assert "http" not in denied["error"]["message"]
    # the same refusal from every path tool
    for name, arguments in [
        ("read_bytes", {"path": owner_upload}),
        ("list_dir", {"path": owner_run["upload_dir"]}),
        ("grep_search", {"pattern": "x", "path": owner_run["upload_dir"]}),
        ("glob_search", {"pattern": "*", "path": owner_run["upload_dir"]}),
        ("write_file", {"path": owner_upload, "content": "overwrite"}),
        ("edit_file", {"path": owner_upload, "old": "PNG", "new": "GIF"}),
    ]:
        answer = tool(agent_client, member_again["run_id"], name, **arguments)
        assert answer["error"]["code"] == "foreign_upload_path", name
    assert Path(owner_upload).read_bytes() == b"\x89PNG"


def test_relative_paths_start_in_the_runs_workdir_and_the_group_workspace_is_shared(
    agent_client: TestClient, agent_data_dir: Path
) -> None:
    sid = group_session(agent_client)
    member_run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    owner_run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=OWNER)
    workspace = agent_data_dir / "groups/feishu/oc_team"
    assert tool(agent_client, member_run["run_id"], "write_file", path=f"{workspace}/plan.md", content="v1\n")["ok"]
    edited = tool(agent_client, owner_run["run_id"], "edit_file", path=f"{workspace}/plan.md", old="v1", new="v2")
    assert edited["ok"], edited
    assert (workspace / "plan.md").read_text() == "v2\n"
    listed = tool(agent_client, member_run["run_id"], "list_dir", path=".")
    assert listed["result"]["path"] == member_run["workdir"]


def test_tool_listing_has_every_container_tool_with_its_schema(agent_client: TestClient) -> None:
    tools = {t["name"]: t for t in agent_client.get("/v1/tools").json()["tools"]}
    for name, fields in {
        "read_file": {"path", "offset", "limit"},
        "write_file": {"path", "content"},
        "edit_file": {"path", "old", "new"},
        "list_dir": {"path"},
        "glob_search": {"pattern", "path"},
        "grep_search": {"pattern", "path", "glob"},
        "shell": {"command", "timeout_s"},
        "read_bytes": {"path"},
    }.items():
        assert tools[name]["place"] == "container"
        assert tools[name]["acts_as"] == "runtime"
        assert set(tools[name]["parameters"]["properties"]) == fields


def test_bad_arguments_are_a_tool_error_and_reach_no_sandbox(agent_client: TestClient, agent_service: OrchestratorService) -> None:
    sid = group_session(agent_client)
    run = start_run(agent_client, sid, trigger="web")
    answer = tool(agent_client, run["run_id"], "read_file", path="x", offset=0)
    assert answer["error"]["code"] == "invalid_arguments"
    answer = tool(agent_client, run["run_id"], "write_file", path="x")
    assert answer["error"]["code"] == "invalid_arguments"
    assert agent_service.sandboxes.backends["process"].status() == []


def test_every_tool_call_is_audited(agent_client: TestClient, agent_service: OrchestratorService) -> None:
    sid = group_session(agent_client)
    run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    tool(agent_client, run["run_id"], "write_file", path="a.txt", content="a")
    tool(agent_client, run["run_id"], "read_file", path="../../17/x")
    entries = audit.entries(agent_service.store, action="tool.call", session_id=sid)
    assert len(entries) == 2
    failed, ok = entries  # newest first
    for entry in entries:
        assert entry.owner_user_id == OWNER
        assert entry.runtime_user_id == MEMBER
        assert entry.detail["run_id"] == run["run_id"]
        assert entry.detail["duration_ms"] >= 0
    assert (ok.detail["tool"], ok.detail["outcome"]) == ("write_file", "ok")
    assert (failed.detail["tool"], failed.detail["outcome"]) == ("read_file", "foreign_runtime_path")
    via_api = agent_client.get("/v1/admin/audit", params={"action": "tool.call"}, headers=admin_headers()).json()
    assert len(via_api["entries"]) == 2


def test_owner_mode_routes_to_the_owners_sandbox(agent_client: TestClient, agent_service: OrchestratorService) -> None:
    assert agent_client.put("/v1/admin/runtime-identity", json={"mode": "owner"}, headers=admin_headers()).status_code == 200
    sid = group_session(agent_client)
    run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    assert run["runtime_user_id"] == OWNER
    answer = tool(agent_client, run["run_id"], "shell", command="id -u")
    base = agent_service.settings.sandbox_uid_base  # the block in force: a test run may give its own
    expected_uid = base + OWNER if __import__("os").geteuid() == 0 else __import__("os").geteuid()
    assert answer["result"]["stdout"].strip() == str(expected_uid)


def test_a_symlink_planted_in_the_users_runtime_dir_is_a_clear_409(agent_client: TestClient) -> None:
    sid = group_session(agent_client)
    run = start_run(agent_client, sid, trigger="web")
    planted = tool(agent_client, run["run_id"], "shell", command="rm -r skills && ln -s /etc skills")
    assert planted["result"]["exit_code"] == 0
    response = agent_client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web"})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "unsafe_directory"
    assert "skills" in response.json()["error"]["message"]
    assert Path("/etc").stat().st_uid == 0
