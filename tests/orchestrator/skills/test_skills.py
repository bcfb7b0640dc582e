"""Skills in the run context (a failed skill is left out), hot updates through the real watcher and
the periodic GC of a running service."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fastapi.testclient import TestClient

from mounts.skillstore.scan import scan_skill
from orchestrator.service import OrchestratorService
from tests.conftest import make_settings
from tests.mounts.skillstore.conftest import write_skill

GROUP = {"channel": "feishu_group", "chat_id": "oc_skills"}


def start_run(client: TestClient, session_id: str, trigger: str, speaker: int | None = None) -> dict:
    body: dict = {"trigger": trigger}
    if speaker is not None:
        body["speaker_user_id"] = speaker
    response = client.post(f"/v1/sessions/{session_id}/runs", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def group_session(client: TestClient, session_id: str, owner: int) -> None:
    response = client.post(
        "/v1/sessions",
        json={"session_id": session_id, "owner_user_id": owner, "channel": "feishu_group", "group": GROUP},
    )
    assert response.status_code == 201, response.text


def test_each_speaker_gets_system_and_own_personal_skills_never_the_owners(
    client: TestClient, service: OrchestratorService
) -> None:
    layout = service.layout
    write_skill(layout.skill_source("pdf"), {"SKILL.md": "# pdf\nfill forms\n"})
    broken = write_skill(layout.skill_source("broken"), {})
    os.symlink("/etc/passwd", broken / "passwd")
    write_skill(layout.userskill_source(17, "alice-private"), {"SKILL.md": "alice's secret skill\n"})
    write_skill(layout.userskill_source(67, "qin-notes"), {})
    group_session(client, "g-sk", owner=17)

    b = start_run(client, "g-sk", "group_message", speaker=67)
    assert b["runtime_user_id"] == 67
    assert b["skills"]["available"] == ["pdf", "qin-notes"]
    assert b["skills"]["failed"] == ["broken"]
    catalog = {e["name"]: e for e in b["skills"]["catalog"]}
    assert catalog["pdf"]["kind"] == "system" and catalog["qin-notes"]["kind"] == "personal"
    skills_dir = layout.session_skills_dir(67, "g-sk")
    for entry in catalog.values():
        assert Path(entry["path"]).parent == skills_dir  # runtime/{runtime}/{sid}/skills/{name}
    assert (Path(catalog["pdf"]["path"]) / "SKILL.md").read_text() == "# pdf\nfill forms\n"
    assert sorted(os.listdir(skills_dir)) == ["pdf", "qin-notes"]  # no link for broken
    assert not any("alice" in name for name in os.listdir(skills_dir))

    a = start_run(client, "g-sk", "scheduled")  # the owner's identity
    assert a["runtime_user_id"] == 17
    assert a["skills"]["available"] == ["alice-private", "pdf"]
    # the owner's run never touched the member's links, and vice versa
    assert sorted(os.listdir(skills_dir)) == ["pdf", "qin-notes"]
    b_again = start_run(client, "g-sk", "group_message", speaker=67)
    assert b_again["runtime_user_id"] == 67 and b_again["skills"] == b["skills"]
    # the skills dir belongs to the sandbox user, like the rest of its runtime dir
    if os.geteuid() == 0:
        assert skills_dir.stat().st_uid == service.settings.sandbox_uid_base + 67


def test_a_skill_edit_reaches_the_next_run_through_the_watcher(client: TestClient, service: OrchestratorService) -> None:
    layout = service.layout
    source = write_skill(layout.skill_source("pdf"), {"SKILL.md": "v1\n"})
    client.post("/v1/sessions", json={"session_id": "w-1", "owner_user_id": 5, "channel": "web"})
    first = start_run(client, "w-1", "web")
    link = Path(first["skills"]["catalog"][0]["path"])
    assert (link / "SKILL.md").read_text() == "v1\n"
    fp1 = service.skills.views.current(5, "pdf")
    assert service.skills_watcher is not None and service.skills_watcher.wait_ready()

    (source / "SKILL.md").write_text("v2\n")
    deadline = time.monotonic() + 15
    while (link / "SKILL.md").read_text() != "v2\n":
        assert time.monotonic() < deadline, "the edit never reached a run"
        time.sleep(0.1)
        start_run(client, "w-1", "web")
    fp2 = service.skills.views.current(5, "pdf")
    assert fp2 is not None and fp2 != fp1 and fp2 == scan_skill(source).fingerprint

    # a new personal skill shows up too
    write_skill(layout.userskill_source(5, "mine"), {})
    deadline = time.monotonic() + 15
    while "mine" not in start_run(client, "w-1", "web")["skills"]["available"]:
        assert time.monotonic() < deadline, "the new personal skill never showed up"
        time.sleep(0.1)


def test_the_running_service_collects_garbage_periodically(data_dir: Path) -> None:
    service = OrchestratorService(make_settings(data_dir, skill_gc_interval_s=0.2, skill_gc_days=1))
    try:
        orphan = write_skill(service.layout.skill_source("orphan"), {})
        fp = scan_skill(orphan).fingerprint
        entry = service.skills.store.ensure_entry(fp, "orphan", orphan)
        long_ago = time.time() - 3 * 86400
        os.utime(entry, (long_ago, long_ago))
        service.start()
        deadline = time.monotonic() + 10
        while service.layout.content_fp_dir(fp).exists():
            assert time.monotonic() < deadline, "the periodic GC never ran"
            time.sleep(0.05)
    finally:
        service.close()


def test_personal_skill_dirs_get_their_policy_at_start(data_dir: Path) -> None:
    write_skill(data_dir / "userskills" / "17" / "mine", {})
    os.chmod(data_dir / "userskills" / "17", 0o755)
    service = OrchestratorService(make_settings(data_dir))
    try:
        service.start()
        st = (data_dir / "userskills" / "17").stat()
        if os.geteuid() == 0:  # without root everything simply stays the current user's
            base = service.settings.sandbox_uid_base
            assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, base + 17, 0o750)
            assert (data_dir / "userskills").stat().st_mode & 0o777 == 0o711
    finally:
        service.close()
