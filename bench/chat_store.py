"""Session storage figures: appends, reads, search, deletion, the start-up check.

usage: .venv/bin/python bench/chat_store.py
Prints `name: value unit` lines. Medians of repeated runs on a fresh temporary data dir.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.sessions.chat_records import NewMessage, Role, decode_messages  # noqa: E402
from orchestrator.sessions.chat_store import ChatKey  # noqa: E402
from orchestrator.identity import Trigger  # noqa: E402
from orchestrator.runs.service import StartRun  # noqa: E402
from orchestrator.service import OrchestratorService  # noqa: E402
from orchestrator.sessions.records import Channel  # noqa: E402
from orchestrator.sessions.service import NewSession  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402

TEXT = "a typical chat message of a few dozen words about deploying the billing service " * 3


def timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def exchange(i: int) -> list[NewMessage]:
    return [NewMessage(Role.USER, f"question {i} {TEXT}"), NewMessage(Role.ASSISTANT, f"answer {i} {TEXT}")]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        service = OrchestratorService(Settings(data_dir=data, backend="process"))
        sessions = service.sessions
        try:
            def new(sid: str, project: str | None = "p1") -> None:
                sessions.create(NewSession(owner_user_id=17, channel=Channel.WEB, session_id=sid, project_id=project), actor="bench")

            # appends at growing history sizes (every append rewrites messages.json and the transcript)
            for existing in (0, 1_000, 5_000):
                sid = f"append-{existing}"
                new(sid)
                if existing:
                    sessions.append_messages(sid, [m for i in range(existing // 2) for m in exchange(i)])
                seconds = timed(lambda: sessions.append_messages(sid, exchange(0)), 30)
                print(f"append_2_messages_at_{existing}_ms: {seconds * 1000:.2f} ms")

            # reading the records: the fd walk without following links vs a plain open of the path
            key = ChatKey.of(service.session_repo.get("append-1000"))
            path = Path(service.chat.chat_dir(key)) / "messages.json"
            walk = timed(lambda: service.chat.messages(key), 50)
            plain = timed(lambda: decode_messages(path.read_bytes()), 50)
            print(f"read_1000_messages_nofollow_ms: {walk * 1000:.2f} ms")
            print(f"read_1000_messages_plain_open_ms: {plain * 1000:.2f} ms")
            print(f"read_nofollow_over_plain_ratio: {walk / plain:.2f} x")

            # read_conversation through the dispatcher, project gate open
            service.projects.update("p1", cross_session_read=True)
            new("reader")
            run = service.runs.start("reader", StartRun(trigger=Trigger.WEB), actor="bench").run
            seconds = timed(
                lambda: service.dispatcher.dispatch(
                    run.run_id, "read_conversation", {"conversation_id": "append-5000", "limit": 200},
                    tool_call_id=None, actor="bench",
                ),
                30,
            )
            print(f"read_conversation_limit_200_of_5000_ms: {seconds * 1000:.2f} ms")

            # session_search across 100 sessions with 200 turns each
            for s in range(100):
                sid = f"search-{s:03}"
                new(sid)
                sessions.append_messages(sid, [m for i in range(200) for m in exchange(i)])
            seconds = timed(
                lambda: service.dispatcher.dispatch(
                    run.run_id, "session_search", {"query": "billing question 7"}, tool_call_id=None, actor="bench"
                ),
                5,
            )
            print(f"session_search_104_sessions_200_turns_ms: {seconds * 1000:.1f} ms")

            # deletion of a session whose runtime dir holds 10,000 files
            new("doomed")
            service.runs.start("doomed", StartRun(trigger=Trigger.WEB), actor="bench")
            workdir = service.layout.runtime_dir(17, "doomed")
            for d in range(100):
                (workdir / f"d{d}").mkdir()
                for f in range(100):
                    (workdir / f"d{d}" / f"f{f}").write_bytes(b"x")
            start = time.perf_counter()
            sessions.delete("doomed", actor="bench")
            print(f"delete_with_10000_runtime_files_ms: {(time.perf_counter() - start) * 1000:.1f} ms")

            # the start-up storage check over ~1,100 sessions
            for s in range(1_000):
                new(f"idle-{s:04}", project=None)
            count = len(os.listdir(service.layout.sessions_root / "actor-17" / "personal")) + len(
                os.listdir(service.layout.sessions_root / "actor-17" / "project-p1")
            )
            seconds = timed(service.chat.check, 3)
            print(f"storage_check_{count}_sessions_ms: {seconds * 1000:.1f} ms")
        finally:
            service.close()


if __name__ == "__main__":
    main()
