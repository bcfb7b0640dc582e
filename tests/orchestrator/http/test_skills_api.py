"""The skills API: system skills (admin token) and personal skills (bot token) installed,
replaced, listed and removed through HTTP, seen by the very next run."""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import API_TOKEN, admin_headers, make_settings

BOT = {"Authorization": f"Bearer {API_TOKEN}"}
ADMIN = admin_headers()
PDF = {"files": {"SKILL.md": "# pdf\nv1\n", "scripts/run.sh": {"text": "#!/bin/sh\necho hi\n", "executable": True}}}


def skill_audit(service: OrchestratorService) -> list[tuple[str, str, dict]]:
    with service.store.read() as tx:
        rows = tx.all("SELECT actor, action, detail FROM audit_log WHERE action LIKE 'skill_%' ORDER BY id")
    return [(r["actor"], r["action"], json.loads(r["detail"])) for r in rows]


@pytest.fixture
def quiet_client(service: OrchestratorService) -> Iterator[TestClient]:
    """No lifespan: the skills watcher is not running, so only the API's own invalidation
    can make a change visible."""
    yield TestClient(create_app(service), headers=BOT)


def group_session(client: TestClient, owner: int = 17) -> str:
    body = {"owner_user_id": owner, "channel": "feishu_group", "group": {"channel": "feishu", "chat_id": "oc_1"}}
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def start_run(client: TestClient, sid: str, speaker: int) -> dict:
    run = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": speaker})
    assert run.status_code == 201, run.text
    client.post(f"/v1/runs/{run.json()['run_id']}/end", json={"status": "succeeded"})
    return run.json()


def test_auth_admin_token_for_system_skills_bot_token_for_personal_ones(client: TestClient) -> None:
    assert client.get("/v1/admin/skills", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/v1/admin/skills").status_code == 403  # the bot token
    assert client.put("/v1/admin/skills/pdf", json=PDF).status_code == 403
    assert client.delete("/v1/admin/skills/pdf").status_code == 403
    assert client.get("/v1/admin/skills", headers=ADMIN).status_code == 200
    assert client.get("/v1/users/7/skills", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.put("/v1/users/7/skills/mine", json=PDF).status_code == 201
    assert client.get("/v1/users/7/skills", headers=ADMIN).json()["skills"][0]["name"] == "mine"


def test_install_replace_list_and_remove_a_system_skill(client: TestClient, service: OrchestratorService) -> None:
    created = client.put("/v1/admin/skills/pdf", json=PDF, headers=ADMIN)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["created"] and body["changed"] and body["valid"] and body["kind"] == "system"
    assert body["files"] == 2 and body["path"] == str(service.layout.skill_source("pdf"))
    fingerprint = body["fingerprint"]

    listing = client.get("/v1/admin/skills", headers=ADMIN).json()
    assert [(s["name"], s["fingerprint"], s["valid"]) for s in listing["skills"]] == [("pdf", fingerprint, True)]
    detail = client.get("/v1/admin/skills/pdf", headers=ADMIN).json()
    entries = {e["path"]: e for e in detail["entries"]}
    assert entries["scripts"]["kind"] == "dir" and entries["scripts/run.sh"]["executable"]
    assert entries["SKILL.md"]["size"] == len("# pdf\nv1\n")

    same = client.put("/v1/admin/skills/pdf", json=PDF, headers=ADMIN)
    assert same.status_code == 200 and not same.json()["changed"] and same.json()["fingerprint"] == fingerprint

    binary = {"files": {"SKILL.md": "# pdf\nv2\n", "data/blob.bin": {"base64": base64.b64encode(b"\x00\xff\x10").decode()}}}
    replaced = client.put("/v1/admin/skills/pdf", json=binary, headers=ADMIN)
    assert replaced.status_code == 200 and replaced.json()["changed"]
    assert replaced.json()["previous_fingerprint"] == fingerprint
    source = service.layout.skill_source("pdf")
    assert (source / "data" / "blob.bin").read_bytes() == b"\x00\xff\x10"
    assert not (source / "scripts").exists()

    removed = client.delete("/v1/admin/skills/pdf", headers=ADMIN)
    assert removed.status_code == 200 and removed.json()["previous_fingerprint"] == replaced.json()["fingerprint"]
    assert client.get("/v1/admin/skills", headers=ADMIN).json()["skills"] == []
    assert not source.exists()
    assert [(actor, action) for actor, action, _ in skill_audit(service)] == [
        ("admin", "skill_installed"),
        ("admin", "skill_installed"),
        ("admin", "skill_installed"),
        ("admin", "skill_removed"),
    ]
    detail_of_first = skill_audit(service)[0][2]
    assert detail_of_first["skill"] == "pdf" and detail_of_first["fingerprint"] == fingerprint
    assert detail_of_first["created"] is True and detail_of_first["previous_fingerprint"] is None


def test_unknown_skills_are_404(client: TestClient) -> None:
    for method, path, headers in [
        ("GET", "/v1/admin/skills/nope", ADMIN),
        ("DELETE", "/v1/admin/skills/nope", ADMIN),
        ("GET", "/v1/users/7/skills/nope", BOT),
        ("DELETE", "/v1/users/7/skills/nope", BOT),
    ]:
        response = client.request(method, path, headers=headers)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "name,body,field",
    [
        ("pdf", {"files": {"../evil": "x", "SKILL.md": "x"}}, "files.../evil"),
        ("pdf", {"files": {"/etc/cron.d/x": "x", "SKILL.md": "x"}}, "files./etc/cron.d/x"),
        ("pdf", {"files": {"a\u0000b": "x", "SKILL.md": "x"}}, "files.a\u0000b"),
        ("pdf", {"files": {"a//b": "x", "SKILL.md": "x"}}, "files.a//b"),
        ("pdf", {"files": {"README.md": "x"}}, "files"),
        ("pdf", {"files": {}}, "files"),
        ("pdf", {}, "files"),
        ("pdf", {"files": {"SKILL.md": {"base64": "not base64!"}}}, "files.SKILL.md.base64"),
        ("pdf", {"files": {"SKILL.md": {"text": "a", "base64": "YQ=="}}}, "files.SKILL.md"),
        ("pdf", {"files": {"SKILL.md": {}}}, "files.SKILL.md"),
        ("pdf", {"files": {"SKILL.md": {"text": "a", "executable": "yes"}}}, "files.SKILL.md.executable"),
        ("pdf", {"files": {"SKILL.md": {"text": "a", "mode": 4095}}}, "files.SKILL.md.mode"),
        ("pdf", {"files": {"SKILL.md": 17}}, "files.SKILL.md"),
        ("pdf", {"files": {"SKILL.md": "x", "SKILL.md/inner": "y"}}, "files.SKILL.md"),
        ("pdf", {"files": {"SKILL.md": "x"}, "extra": 1}, "extra"),
        (".hidden", {"files": {"SKILL.md": "x"}}, "name"),
        ("-rf", {"files": {"SKILL.md": "x"}}, "name"),
        ("a..b" * 20, {"files": {"SKILL.md": "x"}}, "name"),
    ],
)
def test_bad_skills_are_422_naming_the_field_and_change_nothing(
    client: TestClient, service: OrchestratorService, name: str, body: dict, field: str
) -> None:
    for path, headers in ((f"/v1/admin/skills/{name}", ADMIN), (f"/v1/users/7/skills/{name}", BOT)):
        response = client.put(path, json=body, headers=headers)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["field"] == field, response.json()
    skills_root = service.layout.skills_root
    assert not skills_root.exists() or os.listdir(skills_root) == []
    assert skill_audit(service) == []


def test_caps_come_from_the_settings(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    service = OrchestratorService(
        make_settings(data, skill_upload_max_files=3, skill_upload_max_file_bytes=10, skill_upload_max_bytes=15)
    )
    try:
        client = TestClient(create_app(service), headers=ADMIN)
        too_many = {"files": {"SKILL.md": "x", "a": "", "b": "", "c": ""}}
        assert client.put("/v1/admin/skills/s", json=too_many).json()["error"]["field"] == "files"
        too_big = {"files": {"SKILL.md": "x", "big": "y" * 11}}
        assert client.put("/v1/admin/skills/s", json=too_big).json()["error"]["field"] == "files.big"
        too_much = {"files": {"SKILL.md": "x" * 10, "more": "y" * 10}}
        response = client.put("/v1/admin/skills/s", json=too_much)
        assert response.status_code == 422 and "in total" in response.json()["error"]["message"]
        assert client.put("/v1/admin/skills/s", json={"files": {"SKILL.md": "x" * 10, "m": "y" * 5}}).status_code == 201
    finally:
        service.close()


def test_the_listing_says_what_the_skill_code_thinks(client: TestClient, service: OrchestratorService) -> None:
    root = service.layout.skills_root
    broken = root / "broken"
    broken.mkdir(parents=True)
    (broken / "SKILL.md").write_text("# broken\n")
    (broken / "escape").symlink_to("/etc/passwd")
    misnamed = root / "not a name"
    misnamed.mkdir()
    (misnamed / "SKILL.md").write_text("x")
    client.put("/v1/admin/skills/good", json=PDF, headers=ADMIN)
    listing = client.get("/v1/admin/skills", headers=ADMIN).json()
    by_name = {s["name"]: s for s in listing["skills"]}
    assert by_name["good"]["valid"] and by_name["good"]["problem"] is None
    assert not by_name["broken"]["valid"] and by_name["broken"]["fingerprint"] is None
    assert "absolute" in by_name["broken"]["problem"]
    assert [(i["name"], "valid skill name" in i["reason"]) for i in listing["ignored"]] == [("not a name", True)]
    # An admin repairs the broken skill by replacing it as a whole.
    fixed = client.put("/v1/admin/skills/broken", json=PDF, headers=ADMIN)
    assert fixed.status_code == 200 and fixed.json()["valid"] and fixed.json()["previous_fingerprint"] is None
    assert not (broken / "escape").is_symlink()


def test_a_change_reaches_the_next_run_without_the_file_watcher(quiet_client: TestClient, service: OrchestratorService) -> None:
    client = quiet_client
    assert service.skills_watcher is None  # no lifespan: nothing watches the sources
    sid = group_session(client)
    assert start_run(client, sid, 17)["skills"]["available"] == []

    assert client.put("/v1/admin/skills/pdf", json=PDF, headers=ADMIN).status_code == 201
    run = start_run(client, sid, 17)
    assert run["skills"]["available"] == ["pdf"]
    (entry,) = run["skills"]["catalog"]
    assert Path(entry["path"], "SKILL.md").read_text() == "# pdf\nv1\n"

    v2 = {"files": {"SKILL.md": "# pdf\nv2\n"}}
    assert client.put("/v1/admin/skills/pdf", json=v2, headers=ADMIN).status_code == 200
    run = start_run(client, sid, 17)
    assert run["skills"]["catalog"][0]["path"] == entry["path"]
    assert Path(entry["path"], "SKILL.md").read_text() == "# pdf\nv2\n"
    assert not Path(entry["path"], "scripts").exists()

    assert client.delete("/v1/admin/skills/pdf", headers=ADMIN).status_code == 200
    run = start_run(client, sid, 17)
    assert run["skills"]["available"] == [] and run["skills"]["failed"] == []
    assert not os.path.lexists(entry["path"])


def test_personal_skills_are_the_users_alone(quiet_client: TestClient, service: OrchestratorService) -> None:
    client = quiet_client
    response = client.put("/v1/users/67/skills/notes", json={"files": {"SKILL.md": "# B's notes\n"}})
    assert response.status_code == 201 and response.json()["kind"] == "personal" and response.json()["user_id"] == 67
    assert client.get("/v1/users/67", headers=BOT).status_code == 200  # the user exists now
    sid = group_session(client, owner=17)
    member_run = start_run(client, sid, 67)
    owner_run = start_run(client, sid, 17)
    assert [(e["name"], e["kind"]) for e in member_run["skills"]["catalog"]] == [("notes", "personal")]
    assert owner_run["skills"]["available"] == []
    assert [s["name"] for s in client.get("/v1/users/67/skills").json()["skills"]] == ["notes"]
    assert client.get("/v1/users/17/skills").json()["skills"] == []
    userskills = service.layout.userskills_dir(67)
    if os.geteuid() == 0:  # the user's read-only policy: root-owned, the user's gid, 0750
        st = os.stat(userskills)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, service.directories.sandbox_uid(67), 0o750)
    assert client.delete("/v1/users/67/skills/notes").status_code == 200
    assert start_run(client, sid, 67)["skills"]["available"] == []
    actions = [(actor, action, detail["kind"]) for actor, action, detail in skill_audit(service)]
    assert actions == [("bot", "skill_installed", "personal"), ("bot", "skill_removed", "personal")]
