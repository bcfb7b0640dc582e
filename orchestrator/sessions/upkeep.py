"""Start-up upkeep of session storage: report chat storage with wrong modes, and
finish the cleanups of sessions deleted by a process that died before it was done."""

from __future__ import annotations

import logging
import threading

from orchestrator.sessions.chat_store import ChatStore, StorageProblem
from orchestrator.log import kv
from orchestrator.sessions.service import SessionService

log = logging.getLogger(__name__)

# The log names this many problems one by one, then only counts the rest.
LOGGED_PROBLEMS = 20


def check_chat_storage(chat: ChatStore) -> list[StorageProblem]:
    """Run the chat storage check and log what it found (it changes nothing)."""
    problems = chat.check()
    for problem in problems[:LOGGED_PROBLEMS]:
        log.warning("chat storage problem %s", kv(path=problem.path, problem=problem.problem))
    if len(problems) > LOGGED_PROBLEMS:
        log.warning("more chat storage problems %s", kv(not_listed=len(problems) - LOGGED_PROBLEMS))
    return problems


class SessionUpkeep:
    def __init__(self, sessions: SessionService, chat: ChatStore) -> None:
        self._sessions = sessions
        self._chat = chat
        self._thread: threading.Thread | None = None
        self.storage_problems: list[StorageProblem] = []

    def start(self) -> None:
        self.storage_problems = check_chat_storage(self._chat)
        # In the background: a large runtime directory must not hold up serving requests.
        self._thread = threading.Thread(target=self._finish_cleanups, name="session-cleanup", daemon=True)
        self._thread.start()

    def _finish_cleanups(self) -> None:
        finished, pending = self._sessions.finish_pending_cleanups(actor="startup")
        if finished or pending:
            log.info(
                "unfinished session cleanups continued %s",
                kv(finished=",".join(finished) or None, still_pending=",".join(pending) or None),
            )

    def stop(self) -> None:
        """Wait for the cleanup pass (an interrupted one would be continued next time anyway,
        but the state store must stay open while it runs)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
