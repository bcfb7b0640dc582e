"""The admin's users, runs and sandboxes through the API (docs/admin-console.md): lists with
filters and pages, a sandbox stopped / paused / resumed / restarted, CPU and memory within the
operator's maxima, and a purge after which the id answers 410 and is never used again."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient

from orchestrator import audit
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 (fixtures)
from tests.api_calls import start_run, tool
from tests.conftest import API_TOKEN, admin_headers, make_settings

ADMIN = admin_headers()


@pytest.fixture
def api(agent_data_dir) -> Iterator[tuple[TestClient, OrchestratorService]]:
    data = agent_data_dir
    service = OrchestratorService(
        make_settings(data, user_max_cpus=2.0, user_max_memory_mb=2048, credentials_key=Fernet.generate_key().decode())
    )
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield client, service
    finally:
        service.close()


def session_of(client: TestClient, owner: int, group: dict | None = None) -> str:
    body: dict = {"owner_user_id": owner, "channel": "web"}
    if group is not None:
        body = {"owner_user_id": owner, "channel": "feishu_group", "group": group}
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def test_users_are_listed_in_pages_with_their_identities_and_filtered(api) -> None:
    client, _ = api
    for platform, external in (("slack", "U1"), ("slack", "U2"), ("feishu", "ou_3")):
        assert client.put(f"/v1/identities/{platform}/{external}", json={"display_name": external}).status_code in (200, 201)
    client.put("/v1/users/5", json={"display_name": "plain"})
    first = client.get("/v1/admin/users", params={"limit": 2}, headers=ADMIN)
    assert first.status_code == 200, first.text
    page = first.json()
    assert len(page["users"]) == 2 and page["next_cursor"] is not None
    rest = client.get("/v1/admin/users", params={"limit": 2, "cursor": page["next_cursor"]}, headers=ADMIN).json()
    everyone = page["users"] + rest["users"]
    assert rest["next_cursor"] is None and len(everyone) == 4
    assert [u["user_id"] for u in everyone] == sorted(u["user_id"] for u in everyone)
    assert all(u["state"] == "stopped" and u["backend"] == "process" for u in everyone)
    slack = client.get("/v1/admin/users", params={"platform": "slack"}, headers=ADMIN).json()["users"]
    assert sorted(u["identities"][0]["id"] for u in slack) == ["U1", "U2"]
    assert client.get("/v1/admin/users", params={"backend": "docker"}, headers=ADMIN).json()["users"] == []
    bad = client.get("/v1/admin/users", params={"cursor": "-1"}, headers=ADMIN)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "cursor"


def test_runs_are_listed_active_or_recent_by_user_session_and_group(api) -> None:
    client, _ = api
    group = {"channel": "feishu", "chat_id": "oc_ops"}
    solo, shared = session_of(client, 21), session_of(client, 22, group)
    ended = start_run(client, solo, trigger="web")["run_id"]
    assert client.post(f"/v1/runs/{ended}/end", json={"status": "succeeded"}).status_code == 200
    running = start_run(client, shared, trigger="group_message", speaker_user_id=23)["run_id"]
    active = client.get("/v1/admin/runs", params={"state": "active"}, headers=ADMIN).json()["runs"]
    assert [r["run_id"] for r in active] == [running]
    assert active[0]["group"] == group and active[0]["runtime_user_id"] == 23
    recent = client.get("/v1/admin/runs", params={"state": "recent"}, headers=ADMIN).json()["runs"]
    assert {r["run_id"] for r in recent} == {ended, running}
    by_user = client.get("/v1/admin/runs", params={"user_id": 23}, headers=ADMIN).json()["runs"]
    assert [r["run_id"] for r in by_user] == [running]
    by_session = client.get("/v1/admin/runs", params={"session_id": solo}, headers=ADMIN).json()["runs"]
    assert [r["run_id"] for r in by_session] == [ended]
    by_group = client.get("/v1/admin/runs", params=group, headers=ADMIN).json()["runs"]
    assert [r["run_id"] for r in by_group] == [running]
    half = client.get("/v1/admin/runs", params={"channel": "feishu"}, headers=ADMIN)
    assert half.status_code == 422 and half.json()["error"]["field"] == "chat_id"


def agent_pid(client: TestClient, run_id: str) -> int:
    answer = tool(client, run_id, "shell", command="echo $PPID")
    assert answer["ok"], answer
    return int(answer["result"]["stdout"].strip())


def state_of(client: TestClient, user_id: int) -> str:
    users = client.get("/v1/admin/users", headers=ADMIN).json()["users"]
    return next(u["state"] for u in users if u["user_id"] == user_id)


def test_the_admin_stops_pauses_resumes_and_restarts_one_users_sandbox(api) -> None:
    client, service = api
    run_id = start_run(client, session_of(client, 31), trigger="web")["run_id"]
    assert tool(client, run_id, "write_file", path="kept.txt", content="x")["ok"]
    first = service.sandboxes.status()[0].since
    assert state_of(client, 31) == "running"

    paused = client.post("/v1/admin/users/31/sandbox/pause", headers=ADMIN)
    assert paused.json() == {"user_id": 31, "state": "paused"}, paused.text
    assert state_of(client, 31) == "paused"
    again = client.post("/v1/admin/users/31/sandbox/pause", headers=ADMIN)
    assert again.status_code == 409
    resumed = client.post("/v1/admin/users/31/sandbox/resume", headers=ADMIN)
    assert resumed.json() == {"user_id": 31, "state": "running"}, resumed.text

    stopped = client.post("/v1/admin/users/31/sandbox/stop", headers=ADMIN)
    assert stopped.json() == {"user_id": 31, "state": "stopped"}
    assert state_of(client, 31) == "stopped"
    assert client.post("/v1/admin/users/31/sandbox/resume", headers=ADMIN).status_code == 409
    # The next tool call starts a new sandbox, with the user's files.
    assert tool(client, run_id, "read_file", path="kept.txt")["ok"]
    assert service.sandboxes.status()[0].since != first

    restarted = client.post("/v1/admin/users/31/sandbox/restart", headers=ADMIN)
    assert restarted.json() == {"user_id": 31, "state": "running"}
    assert client.post("/v1/admin/users/31/sandbox/explode", headers=ADMIN).status_code == 422
    actions = [e.action for e in audit.entries(service.store, limit=50) if e.action.startswith("sandbox.")]
    assert actions == ["sandbox.restart", "sandbox.stop", "sandbox.resume", "sandbox.pause"]


def test_cpu_and_memory_are_set_within_the_operators_maxima(api) -> None:
    client, service = api
    shown = client.get("/v1/admin/users/41/resources", headers=ADMIN).json()
    assert shown == {"user_id": 41, "cpus": 1.0, "memory_mb": 1024, "override": False, "max_cpus": 2.0, "max_memory_mb": 2048}
    over = client.put("/v1/admin/users/41/resources", json={"cpus": 3, "memory_mb": 512}, headers=ADMIN)
    assert over.status_code == 422 and over.json()["error"]["field"] == "cpus"
    assert client.get("/v1/admin/users/41/resources", headers=ADMIN).json()["override"] is False
    put = client.put("/v1/admin/users/41/resources", json={"cpus": 1.5, "memory_mb": 512}, headers=ADMIN)
    assert put.status_code == 200 and put.json()["cpus"] == 1.5 and put.json()["memory_mb"] == 512
    assert service.sandboxes.sandbox_user(41).cpus == 1.5
    listed = client.get("/v1/admin/users", headers=ADMIN).json()["users"]
    assert next(u for u in listed if u["user_id"] == 41)["memory_mb"] == 512
    # A restart applies them: the sandbox's cgroup carries the user's own memory limit.
    run_id = start_run(client, session_of(client, 41), trigger="web")["run_id"]
    assert tool(client, run_id, "shell", command="true")["ok"]
    assert client.post("/v1/admin/users/41/sandbox/restart", headers=ADMIN).status_code == 200
    cgroup = service.sandboxes.backends["process"].driver._agents[41].cgroup
    assert cgroup is not None or os.geteuid() != 0  # as root the sandbox has its cgroup
    if cgroup is not None and cgroup.limited_by != "none":
        memory = [value for path, value in cgroup.writes if path.name in ("memory.max", "memory.limit_in_bytes")]
        assert memory == [str(512 * 1024 * 1024)], cgroup.writes
        assert all(open(path).read().strip() == value for path, value in cgroup.writes if path.name == "memory.max")
    back = client.put("/v1/admin/users/41/resources", json={"cpus": None, "memory_mb": None}, headers=ADMIN).json()
    assert back["override"] is False and back["cpus"] == 1.0
    assert [e.detail for e in audit.entries(service.store, action="user.resources_set")][-1] == {"cpus": 1.5, "memory_mb": 512}


def test_a_purge_removes_the_users_things_and_its_id_answers_410_for_ever(api) -> None:
    client, service = api
    created = client.put("/v1/identities/slack/UPURGE", json={"display_name": "doomed"})
    uid = created.json()["user_id"]
    sid = session_of(client, uid)
    run_id = start_run(client, sid, trigger="web")["run_id"]
    assert tool(client, run_id, "write_file", path="secret.txt", content="mine")["ok"]
    assert tool(client, run_id, "shell", command="echo mine > $HOME/secret.txt")["ok"]
    home, workdir = service.layout.home_dir(uid), service.layout.runtime_dir(uid, sid)
    assert (home / "secret.txt").exists() and (workdir / "secret.txt").exists()
    stored = client.put(
        f"/v1/users/{uid}/credentials/github",
        json={"secret": "s3cret", "hosts": ["api.example.com"], "header": "Authorization", "template": "Bearer {secret}"},
        headers=ADMIN,
    )
    assert stored.status_code == 200, stored.text

    refused = client.request("DELETE", f"/v1/admin/users/{uid}", json={"confirm_user_id": uid + 1}, headers=ADMIN)
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "confirm_user_id"
    assert client.request("DELETE", f"/v1/admin/users/{uid}", json={"confirm_user_id": uid}).status_code == 403
    assert (home / "secret.txt").exists()

    purged = client.request("DELETE", f"/v1/admin/users/{uid}", json={"confirm_user_id": uid}, headers=ADMIN)
    assert purged.status_code == 200, purged.text
    assert purged.json()["sessions_deleted"] == [sid] and purged.json()["already_purged"] is False
    assert not home.exists() and not service.layout.runtime_user_dir(uid).exists()
    assert [s.user_id for s in service.sandboxes.status() if s.state == "running"] == []
    assert service.credentials is not None and service.credentials.list_metadata(uid) == []

    for response in (
        client.get(f"/v1/users/{uid}"),
        client.put(f"/v1/users/{uid}", json={"display_name": "back"}),
        client.post("/v1/sessions", json={"owner_user_id": uid, "channel": "web"}),
        client.get("/v1/sessions", headers={"X-Acting-User": str(uid)}),
        client.post(f"/v1/admin/users/{uid}/sandbox/restart", headers=ADMIN),
    ):
        assert response.status_code == 410 and response.json()["error"]["code"] == "user_purged", response.text
    # The same person seen again is a new user: the purged id is never handed out again.
    again = client.put("/v1/identities/slack/UPURGE", json={"display_name": "new"})
    assert again.json()["user_id"] != uid
    assert all(u["user_id"] != uid for u in client.get("/v1/admin/users", headers=ADMIN).json()["users"])
    repeat = client.request("DELETE", f"/v1/admin/users/{uid}", json={"confirm_user_id": uid}, headers=ADMIN)
    assert repeat.status_code == 200 and repeat.json()["already_purged"] is True
    actions = [e.action for e in audit.entries(service.store, limit=100) if e.action.startswith("user.purge")]
    assert actions == ["user.purge_done", "user.purge_done", "user.purge"]


def test_a_tool_call_racing_the_purge_starts_no_sandbox(api) -> None:
    client, service = api
    run_id = start_run(client, session_of(client, 51), trigger="web")["run_id"]
    with service.store.write() as tx:  # the tombstone committed, the purge's cleanup not yet run
        service.users.purged.mark_in(tx, 51, actor="admin")
    answer = tool(client, run_id, "shell", command="true")
    assert not answer["ok"] and answer["error"]["code"] in ("user_purged", "gone"), answer
    assert service.sandboxes.status() == []


def test_the_bot_token_is_refused_on_every_admin_user_route(api) -> None:
    client, _ = api
    for method, path, body in (
        ("GET", "/v1/admin/users", None),
        ("GET", "/v1/admin/runs", None),
        ("POST", "/v1/admin/users/7/sandbox/stop", None),
        ("GET", "/v1/admin/users/7/resources", None),
        ("PUT", "/v1/admin/users/7/resources", {"cpus": 1, "memory_mb": 100}),
        ("DELETE", "/v1/admin/users/7", {"confirm_user_id": 7}),
    ):
        response = client.request(method, path, json=body)
        assert response.status_code == 403, (path, response.text)
