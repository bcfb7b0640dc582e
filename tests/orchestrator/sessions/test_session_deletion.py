"""Deletion: tombstone first, then cleanup; 503 while unfinished; a repeated DELETE
continues it; a process killed mid-cleanup leaves the session hidden; ids are never reused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import audit
from orchestrator.service import OrchestratorService
from orchestrator.sessions.cleanup import CleanupPhase, SessionCleanup
from tests.conftest import make_settings
from tests.orchestrator.sessions.conftest import GROUP, SessionsApi

REPO = Path(__file__).resolve().parents[3]
CHILD = Path(__file__).with_name("cleanup_child.py")
STRANGER = {"X-Acting-User": "99"}


def group_session_with_two_runtime_users(api: SessionsApi, tmp_path: Path) -> dict:
    """Session G of owner 17 in p1, with runs of 17 and of member 67, records, files, skill links."""
    api.create("G", 17, project="p1", group=GROUP)
    owner_run = api.run("G", "web")
    member_run = api.run("G", "group_message", speaker=67)
    assert api.say("G", "plan the release", "release notes draft").status_code == 200
    layout = api.service.layout
    (layout.runtime_dir(17, "G") / "notes.md").write_text("owner's work")
    (layout.runtime_dir(67, "G") / "shell-output" / "out.txt").write_text("member's output")
    view = tmp_path / "skill-view"
    view.mkdir()
    (view / "SKILL.md").write_text("shared skill")
    (layout.runtime_dir(67, "G") / "skills" / "web").symlink_to(view, target_is_directory=True)
    other = layout.runtime_dir(67, "other-session")
    other.mkdir(parents=True)
    (other / "keep.txt").write_text("another session's file")
    return {"owner_run": owner_run, "member_run": member_run, "view": view, "other": other}


def assert_hidden(api: SessionsApi, sid: str, *, owner_status: int) -> None:
    owner = api.client.get(f"/v1/sessions/{sid}")
    assert owner.status_code == owner_status, owner.text
    stranger = api.client.get(f"/v1/sessions/{sid}", headers=STRANGER)
    assert stranger.status_code == 404 and stranger.json()["error"]["message"] == f"session {sid} not found"
    listing = api.client.get("/v1/sessions", params={"owner_user_id": 17, "project_id": "p1"}).json()
    assert sid not in [s["session_id"] for s in listing["sessions"]]
    assert api.say(sid, "late write").status_code == owner_status
    again = api.client.post("/v1/sessions", json={"session_id": sid, "owner_user_id": 17, "channel": "web"})
    assert again.status_code == 409


def test_delete_removes_records_runtime_dirs_and_links_and_stops_runs(
    api: SessionsApi, service: OrchestratorService, tmp_path: Path
) -> None:
    world = group_session_with_two_runtime_users(api, tmp_path)
    response = api.delete("G")
    assert response.status_code == 200
    assert response.json() == {"session_id": "G", "deleted": True, "cleanup_done": True}
    assert sorted(os.listdir(api.chat_dir("G"))) == ["deleted.json", "owner.json"]
    assert not service.layout.runtime_dir(17, "G").exists()
    assert not service.layout.runtime_dir(67, "G").exists()
    assert (world["view"] / "SKILL.md").read_text() == "shared skill"  # the link went, not its target
    assert (world["other"] / "keep.txt").exists()
    for run in (world["owner_run"], world["member_run"]):
        assert api.client.get(f"/v1/runs/{run['run_id']}").json()["status"] == "cancelled"
        assert api.client.post(f"/v1/runs/{run['run_id']}/tools/list_conversations", json={}).status_code == 409
    assert_hidden(api, "G", owner_status=404)
    assert api.delete("G").status_code == 404
    assert api.client.post("/v1/sessions/G/runs", json={"trigger": "web"}).status_code == 404
    (done,) = audit.entries(service.store, action="session.cleanup_done")
    assert done.detail["runtime_user_ids"] == [17, 67]
    assert len(audit.entries(service.store, action="session.delete")) == 1


def test_an_unfinished_cleanup_is_503_and_the_next_delete_continues_it(
    api: SessionsApi, service: OrchestratorService, tmp_path: Path
) -> None:
    group_session_with_two_runtime_users(api, tmp_path)
    calls = []

    def flaky_mailbox(deleted) -> None:
        calls.append(deleted.session_id)
        if len(calls) == 1:
            raise RuntimeError("mailbox busy")

    service.sessions.register_cleanup_step("mailbox", flaky_mailbox)
    first = api.delete("G")
    assert first.status_code == 503
    error = first.json()["error"]
    assert error["code"] == "session_cleanup_pending" and error["step"] == "mailbox"
    assert "repeat DELETE" in error["message"]
    assert_hidden(api, "G", owner_status=503)
    assert api.client.get("/v1/sessions/G", headers={"X-Acting-User": "17"}).status_code == 503
    assert api.delete("G", acting=99).status_code == 404  # a stranger cannot continue it
    assert api.delete("G", acting=67).status_code == 404  # nor a group member
    second = api.delete("G")
    assert second.status_code == 200 and second.json()["cleanup_done"] is True
    assert calls == ["G", "G"]
    assert_hidden(api, "G", owner_status=404)


def test_cleanup_steps_run_stop_phase_first_and_names_are_unique() -> None:
    cleanup = SessionCleanup()
    cleanup.register("mailbox", lambda d: None)
    cleanup.register("runs", lambda d: None, phase=CleanupPhase.STOP)
    cleanup.register("links", lambda d: None)
    assert [s.name for s in cleanup.steps()] == ["runs", "mailbox", "links"]
    with pytest.raises(ValueError):
        cleanup.register("links", lambda d: None)


def start_child(data_dir: Path, sid: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(data_dir), sid, *extra], env=env, stdout=subprocess.PIPE, text=True
    )


def wait_for(condition, what: str, timeout: float = 60.0, interval: float = 0.001) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def test_kill_9_during_cleanup_keeps_the_session_hidden_and_the_next_delete_finishes(
    api: SessionsApi, service: OrchestratorService, data_dir: Path, tmp_path: Path
) -> None:
    world = group_session_with_two_runtime_users(api, tmp_path)
    marker = tmp_path / "reached"
    child = start_child(data_dir, "G", str(marker))
    try:
        wait_for(marker.exists, "the child to reach its blocking cleanup step")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    record = service.session_repo.get_any("G")
    assert record is not None and record.deleted and record.cleanup_done_at is None
    assert_hidden(api, "G", owner_status=503)
    api.create("A", 17, project="p1")
    api.gate("p1", True)
    reader = api.run("A")
    names = [c["conversation_id"] for c in api.tool(reader, "list_conversations")["result"]["conversations"]]
    assert "G" not in names
    assert api.tool(reader, "read_conversation", conversation_id="G")["error"]["code"] == "not_found"
    assert "(no matches)" in api.tool(reader, "session_search", query="release")["result"]
    finished = api.delete("G")
    assert finished.status_code == 200 and finished.json()["cleanup_done"] is True
    assert sorted(os.listdir(api.chat_dir("G"))) == ["deleted.json", "owner.json"]
    assert not service.layout.runtime_dir(67, "G").exists()
    assert (world["view"] / "SKILL.md").exists()
    assert_hidden(api, "G", owner_status=404)


@pytest.mark.slow
def test_kill_9_in_the_middle_of_removing_runtime_files_then_start_up_finishes_it(
    api: SessionsApi, service: OrchestratorService, data_dir: Path
) -> None:
    api.create("S", 17, project="p1")
    api.run("S", "web")
    big = service.layout.runtime_dir(17, "S") / "big"
    for d in range(200):
        (big / f"d{d:03}").mkdir(parents=True)
        for f in range(100):
            (big / f"d{d:03}" / f"f{f:02}").write_bytes(b"")
    child = start_child(data_dir, "S")
    try:
        wait_for(lambda: len(os.listdir(big)) < 200, "the child to start removing runtime files")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    left = sum(len(files) for _, _, files in os.walk(big))
    print(f"runtime files left after the kill: {left}")
    assert 0 < left < 20_000, "the kill must land in the middle of the removal"
    record = service.session_repo.get_any("S")
    assert record is not None and record.cleanup_done_at is None
    assert_hidden(api, "S", owner_status=503)
    # a restarted orchestrator continues unfinished cleanups by itself
    restarted = OrchestratorService(make_settings(data_dir))
    try:
        restarted.start()
    finally:
        restarted.close()  # waits for the start-up cleanup pass
    assert not big.exists() and not service.layout.runtime_dir(17, "S").exists()
    assert service.session_repo.get_any("S").cleanup_done_at is not None
    assert_hidden(api, "S", owner_status=404)


def test_a_planted_symlink_makes_the_cleanup_pending_and_is_never_followed(
    api: SessionsApi, service: OrchestratorService, tmp_path: Path
) -> None:
    api.create("T", 17)
    api.say("T", "hello")
    chat = api.chat_dir("T")
    victim = tmp_path / "victim"
    chat.rename(victim)
    chat.symlink_to(victim, target_is_directory=True)
    response = api.delete("T")
    assert response.status_code == 503 and response.json()["error"]["step"] == "tombstone_file"
    assert sorted(os.listdir(victim)) == ["messages.json", "owner.json", "transcript.json"]
    assert_hidden(api, "T", owner_status=503)
    chat.unlink()
    victim.rename(chat)
    assert api.delete("T").status_code == 200
    assert sorted(os.listdir(chat)) == ["deleted.json", "owner.json"]


def test_a_runtime_dir_swapped_for_a_symlink_loses_only_the_link(
    api: SessionsApi, service: OrchestratorService, tmp_path: Path
) -> None:
    api.create("G", 17, group=GROUP)
    api.run("G", "group_message", speaker=67)
    workdir = service.layout.runtime_dir(67, "G")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    workdir.rename(tmp_path / "moved")
    workdir.symlink_to(victim, target_is_directory=True)  # what a sandbox could do in its own mount
    assert api.delete("G").status_code == 200
    assert not workdir.is_symlink() and not workdir.exists()
    assert (victim / "precious").read_text() == "keep"


def test_archived_sessions_keep_everything(api: SessionsApi, service: OrchestratorService) -> None:
    api.create("old", 17, project="p1")
    api.run("old", "web")
    api.say("old", "history worth keeping")
    (service.layout.runtime_dir(17, "old") / "work.txt").write_text("kept")
    assert api.patch("old", archived=True).json()["archived"] is True
    assert sorted(os.listdir(api.chat_dir("old"))) == ["messages.json", "owner.json", "transcript.json"]
    assert (service.layout.runtime_dir(17, "old") / "work.txt").read_text() == "kept"
    messages = api.client.get("/v1/sessions/old/messages").json()["messages"]
    assert [m["content"] for m in messages] == ["history worth keeping"]
    listing = api.client.get("/v1/sessions", params={"owner_user_id": 17, "project_id": "p1"}).json()["sessions"]
    assert [(s["session_id"], s["archived"]) for s in listing] == [("old", True)]
