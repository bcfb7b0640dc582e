"""orchestrator/sessions/chat_store.py: layout, modes, refusals, serialized writes, the start-up check."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mounts.layout import DataLayout
from orchestrator.sessions.chat_records import NewMessage, Role
from orchestrator.sessions.chat_store import ChatKey, ChatStorageRefused, ChatStore
from orchestrator.errors import NotFound
from orchestrator.service import OrchestratorService
from tests.conftest import make_settings

REPO = Path(__file__).resolve().parents[3]
KEY = ChatKey("s-1", 17, "p1")
AT = "2026-01-01T00:00:00+00:00"


@pytest.fixture
def store(data_dir: Path) -> ChatStore:
    return ChatStore(DataLayout(data_dir), transcript_turns=3)


def user(text: str) -> NewMessage:
    return NewMessage(Role.USER, text)


def test_the_chat_directory_follows_the_spec_layout_with_exact_modes(store: ChatStore, data_dir: Path) -> None:
    store.init(KEY)
    store.append(KEY, [user("hi"), NewMessage(Role.ASSISTANT, "hello")], at=AT)
    chat = Path(store.chat_dir(KEY))
    import hashlib

    digest = hashlib.sha256(b"s-1").hexdigest()
    assert chat == data_dir / "sessions" / "actor-17" / "project-p1" / f"session-{digest}" / "chat"
    for directory in [chat, *chat.parents][:5]:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert sorted(os.listdir(chat)) == ["messages.json", "owner.json", "transcript.json"]
    for name in os.listdir(chat):
        assert stat.S_IMODE((chat / name).stat().st_mode) == 0o600, name
    assert json.loads((chat / "owner.json").read_text()) == {"session_id": "s-1", "owner_user_id": 17, "project_id": "p1"}
    personal = ChatKey("s-2", 17, None)
    assert "/actor-17/personal/session-" in store.chat_dir(personal)


@pytest.mark.parametrize("component", ["actor-17", "project-p1", "session", "chat"])
def test_a_symlink_planted_on_the_chat_path_is_refused_not_followed(
    store: ChatStore, data_dir: Path, tmp_path: Path, component: str
) -> None:
    store.init(KEY)
    store.append(KEY, [user("mine")], at=AT)
    chat = Path(store.chat_dir(KEY))
    target = {"actor-17": chat.parents[2], "project-p1": chat.parents[1], "session": chat.parent, "chat": chat}[component]
    victim = tmp_path / "victim"
    target.rename(victim)  # the attacker's copy: a symlink now points at real-looking records
    target.symlink_to(victim, target_is_directory=True)
    before = sorted(p.name for p in victim.rglob("*"))
    with pytest.raises(ChatStorageRefused):
        store.append(KEY, [user("late")], at=AT)
    with pytest.raises(ChatStorageRefused):
        store.messages(KEY)
    with pytest.raises(ChatStorageRefused):
        store.init(KEY)
    assert sorted(p.name for p in victim.rglob("*")) == before
    assert b"late" not in b"".join(p.read_bytes() for p in victim.rglob("*.json"))


@pytest.mark.parametrize("name", ["owner.json", "messages.json", "transcript.json"])
def test_a_symlink_among_the_files_is_refused(store: ChatStore, tmp_path: Path, name: str) -> None:
    store.init(KEY)
    store.append(KEY, [user("mine")], at=AT)
    chat = Path(store.chat_dir(KEY))
    secret = tmp_path / "secret.json"
    secret.write_bytes((chat / name).read_bytes())
    (chat / name).unlink()
    (chat / name).symlink_to(secret)
    with pytest.raises(ChatStorageRefused):
        store.append(KEY, [user("late")], at=AT)
    reader = store.transcript if name == "transcript.json" else store.messages
    with pytest.raises(ChatStorageRefused):
        reader(KEY)
    assert b"late" not in secret.read_bytes()


def test_an_owner_record_naming_another_session_is_refused(store: ChatStore) -> None:
    store.init(KEY)
    chat = Path(store.chat_dir(KEY))
    (chat / "owner.json").write_text(json.dumps({"session_id": "other", "owner_user_id": 17, "project_id": "p1"}))
    with pytest.raises(ChatStorageRefused):
        store.messages(KEY)


def test_the_transcript_keeps_the_configured_turns(store: ChatStore) -> None:
    store.init(KEY)
    for i in range(5):
        result = store.append(KEY, [user(f"q{i}"), NewMessage(Role.ASSISTANT, f"a{i}")], at=AT)
    assert (result.message_count, result.last_seq, result.transcript_turns) == (10, 10, 3)
    assert [t.number for t in store.transcript(KEY)] == [3, 4, 5]
    assert [m.content for m in store.messages(KEY)][:2] == ["q0", "a0"]


def test_concurrent_appends_in_threads_lose_nothing(store: ChatStore) -> None:
    store.init(KEY)

    def writer(n: int) -> None:
        for i in range(25):
            store.append(KEY, [user(f"{n}-{i}"), NewMessage(Role.ASSISTANT, "ok")], at=AT)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    messages = store.messages(KEY)
    assert [m.seq for m in messages] == list(range(1, 401))
    assert len({m.content for m in messages if m.role is Role.USER}) == 200
    # each append's two messages stay together: the lock covers read-modify-write
    assert all(messages[i].role is Role.USER and messages[i + 1].role is Role.ASSISTANT for i in range(0, 400, 2))


APPENDER = """
import sys
sys.path.insert(0, sys.argv[1])
from mounts.layout import DataLayout
from orchestrator.sessions.chat_records import NewMessage, Role
from orchestrator.sessions.chat_store import ChatKey, ChatStore
store = ChatStore(DataLayout(sys.argv[2]), transcript_turns=3)
for i in range(40):
    store.append(ChatKey("s-1", 17, "p1"), [NewMessage(Role.USER, f"{sys.argv[3]}-{i}")], at="t")
"""


def test_appends_from_several_processes_are_serialized(store: ChatStore, data_dir: Path) -> None:
    store.init(KEY)
    procs = [
        subprocess.Popen([sys.executable, "-c", APPENDER, str(REPO), str(data_dir), f"p{n}"]) for n in range(3)
    ]
    for i in range(40):
        store.append(KEY, [user(f"main-{i}")], at=AT)
    assert [proc.wait(timeout=120) for proc in procs] == [0, 0, 0]
    messages = store.messages(KEY)
    assert [m.seq for m in messages] == list(range(1, 161))
    assert len({m.content for m in messages}) == 160


def test_after_the_tombstone_writes_are_refused_and_records_can_go(store: ChatStore) -> None:
    store.init(KEY)
    store.append(KEY, [user("before")], at=AT)
    with pytest.raises(ChatStorageRefused):
        store.remove_records(KEY)  # never before the tombstone
    store.mark_deleted(KEY, deleted_at=AT, actor="bot")
    store.mark_deleted(KEY, deleted_at="later", actor="bot")  # idempotent: the first one stays
    with pytest.raises(NotFound):
        store.append(KEY, [user("late")], at=AT)
    assert store.messages(KEY) == [] and store.transcript(KEY) == []
    assert store.remove_records(KEY) == 2
    assert store.remove_records(KEY) == 0
    chat = Path(store.chat_dir(KEY))
    assert sorted(os.listdir(chat)) == ["deleted.json", "owner.json"]
    assert json.loads((chat / "deleted.json").read_text())["deleted_at"] == AT


def test_a_temp_file_left_by_a_crash_is_dropped_by_the_next_write(store: ChatStore) -> None:
    store.init(KEY)
    chat = Path(store.chat_dir(KEY))
    (chat / ".messages.json.abc123.tmp").write_text("half")
    store.append(KEY, [user("x")], at=AT)
    assert sorted(os.listdir(chat)) == ["messages.json", "owner.json", "transcript.json"]


def test_the_storage_check_reports_wrong_modes_links_and_owners(store: ChatStore, tmp_path: Path) -> None:
    store.init(KEY)
    store.append(KEY, [user("x")], at=AT)
    assert store.check() == []
    chat = Path(store.chat_dir(KEY))
    os.chmod(chat, 0o755)
    os.chmod(chat / "messages.json", 0o644)
    (chat.parent.parent / "session-planted").symlink_to(tmp_path)
    os.mkfifo(chat / "pipe")
    (chat / ".transcript.json.1.tmp").write_text("")
    os.chmod(chat / ".transcript.json.1.tmp", 0o600)
    if os.geteuid() == 0:
        os.chown(chat / "transcript.json", 4242, 4242)
    found = {(p.path.rsplit("/", 1)[-1], p.problem.split(",")[0]) for p in store.check()}
    assert ("chat", "has mode 0755") in found
    assert ("messages.json", "has mode 0644") in found
    assert ("session-planted", "is a symlink (it would be refused") in found
    assert ("pipe", "is a special file (FIFO") in found
    assert (".transcript.json.1.tmp", "is a temporary file left by an interrupted write") in found
    if os.geteuid() == 0:
        assert ("transcript.json", "is owned by uid 4242") in found


def test_the_service_reports_wrong_modes_at_start(data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    OrchestratorService(make_settings(data_dir)).close()  # its state DB: chats without one are refused
    store = ChatStore(DataLayout(data_dir), transcript_turns=3)
    store.init(KEY)
    os.chmod(Path(store.chat_dir(KEY)) / "owner.json", 0o640)
    caplog.set_level(logging.WARNING)
    service = OrchestratorService(make_settings(data_dir))
    try:
        service.start()
        problems = service.session_upkeep.storage_problems
        assert [p.problem for p in problems] == ["has mode 0640, expected 0600"]
        assert any("chat storage problem" in r.getMessage() and "owner.json" in r.getMessage() for r in caplog.records)
    finally:
        service.close()


def test_a_corrupt_record_is_refused_not_guessed_at(store: ChatStore) -> None:
    store.init(KEY)
    store.append(KEY, [user("x")], at=AT)
    chat = Path(store.chat_dir(KEY))
    (chat / "messages.json").write_text('{"messages": [{"seq": "x"')
    with pytest.raises(ChatStorageRefused):
        store.messages(KEY)
    with pytest.raises(ChatStorageRefused):
        store.append(KEY, [user("y")], at=AT)
    assert (chat / "messages.json").read_text() == '{"messages": [{"seq": "x"'
