"""Cleaning up after a session's tombstone: ordered, idempotent steps.

Deletion marks the session deleted first (index row and `chat/deleted.json`), so it is gone
from lists, reads and search at once; these steps then remove what it left behind. A step
that fails (or a process killed halfway) leaves the cleanup pending: the next DELETE runs
every step again, which is why each step must be idempotent (removing what is already gone
is a no-op).

Phases run in order: STOP ends activity that could write again (running runs, then every
call in flight for the session, whole process trees, in every sandbox that may run one), REMOVE
deletes data (chat records, then every runtime user's `runtime/{uid}/{sid}/` with its skill
links, then registered steps such as the collaboration mailbox).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from mounts.layout import DataLayout, GroupRef
from orchestrator.sessions.chat_store import ChatKey, ChatStore
from mounts.fs.nofollow import closing_fd, open_below
from mounts.fs.tree_removal import remove_tree_at


class CleanupPhase(str, Enum):
    STOP = "stop"
    REMOVE = "remove"


@dataclass(frozen=True)
class DeletedSession:
    """What a cleanup step may know about the session it cleans up after."""

    session_id: str
    owner_user_id: int
    project_id: str | None
    group: GroupRef | None
    deleted_at: str
    runtime_user_ids: tuple[int, ...]  # every runtime user that ever ran in it, and the owner

    @property
    def chat_key(self) -> ChatKey:
        return ChatKey(self.session_id, self.owner_user_id, self.project_id)


CleanupAction = Callable[[DeletedSession], None]


@dataclass(frozen=True)
class CleanupStep:
    name: str
    phase: CleanupPhase
    action: CleanupAction


class CleanupFailed(Exception):
    def __init__(self, step: str, cause: BaseException) -> None:
        super().__init__(f"{step}: {cause}")
        self.step = step
        self.cause = cause


class SessionCleanup:
    """The ordered list of cleanup steps; other parts register theirs with `register`."""

    def __init__(self, builtin: Sequence[CleanupStep] = ()) -> None:
        self._steps: list[CleanupStep] = []
        for step in builtin:
            self.register(step.name, step.action, phase=step.phase)

    def register(self, name: str, action: CleanupAction, *, phase: CleanupPhase = CleanupPhase.REMOVE) -> None:
        """Add a step; it runs after the steps already registered in the same phase.

        `action(deleted)` must be idempotent and must tolerate a session whose data is
        already partly or wholly gone; raising leaves the cleanup pending (HTTP 503
        `session_cleanup_pending`) until a repeated DELETE runs every step again.
        """
        if any(step.name == name for step in self._steps):
            raise ValueError(f"cleanup step {name} registered twice")
        self._steps.append(CleanupStep(name, phase, action))

    def steps(self) -> list[CleanupStep]:
        order = list(CleanupPhase)
        return sorted(self._steps, key=lambda step: order.index(step.phase))  # stable within a phase

    def run(self, deleted: DeletedSession) -> None:
        for step in self.steps():
            try:
                step.action(deleted)
            except Exception as exc:
                raise CleanupFailed(step.name, exc) from exc


def stop_calls(cancel: Callable[[int, str], object]) -> CleanupAction:
    """Kill the session's calls in flight in each of its runtime users' sandboxes before any
    file is removed: `cancel(user_id, session_id)` returns once they ended (and refuses later
    ones), so none can write into a directory after it was removed."""

    def stop(deleted: DeletedSession) -> None:
        for user_id in deleted.runtime_user_ids:
            cancel(user_id, deleted.session_id)

    return stop


def chat_records_step(chat: ChatStore) -> CleanupStep:
    return CleanupStep("chat_records", CleanupPhase.REMOVE, lambda deleted: chat.remove_records(deleted.chat_key))


def remove_runtime_dirs(layout: DataLayout, deleted: DeletedSession) -> int:
    """`runtime/{uid}/{sid}/` of every runtime user, skill links included; never follows a link."""
    removed = 0
    for user_id in deleted.runtime_user_ids:
        parts = layout.runtime_dir(user_id, deleted.session_id).relative_to(layout.root).parts
        parent = open_below(layout.root, parts[:-1])
        if parent is None:
            continue
        with closing_fd(parent):
            removed += remove_tree_at(parent, parts[-1])
    return removed


def runtime_dirs_step(layout: DataLayout) -> CleanupStep:
    return CleanupStep("runtime_dirs", CleanupPhase.REMOVE, lambda deleted: remove_runtime_dirs(layout, deleted))
