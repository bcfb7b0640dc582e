"""Purging a user (DELETE /v1/admin/users/{uid}, the console's purge button): the tombstone
first (from its commit on the id is refused, `410 user_purged`, and never handed out again),
then everything of the user is ended and removed: its sandbox on every backend, its previews,
its sessions, its disk image, its files and personal skills, its identities, memberships,
overrides, and whatever other parts registered a step (`PurgeSteps`). Repeating the DELETE
runs every (idempotent) step again, so a purge cut short is finished by the next one."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mounts.fs.tree_removal import remove_tree
from mounts.layout import DataLayout
from orchestrator import audit
from orchestrator.errors import InvalidInput
from orchestrator.log import kv
from orchestrator.quotas import loopfs
from orchestrator.state_store import StateStore, Transaction
from orchestrator.users.tombstones import PurgedUsers

log = logging.getLogger(__name__)

# A step run for the purged user (e.g. its credentials, previews, sessions): (user_id, actor).
PurgeStep = Callable[[int, str], object]


def check_confirmation(user_id: int, confirm_user_id: int | None) -> None:
    """Pure: a purge is done only when the body names the same user again."""
    if confirm_user_id != user_id:
        raise InvalidInput(
            f"a purge needs {{\"confirm_user_id\": {user_id}}}: the same user id again, to confirm", field="confirm_user_id"
        )


def user_paths(layout: DataLayout, user_id: int) -> list[Path]:
    """Pure: every directory that belongs to one user alone (data layout, mounts/layout.py)."""
    return [
        layout.home_dir(user_id),
        layout.deps_dir(user_id),
        layout.tmp_dir(user_id),
        layout.runtime_user_dir(user_id),
        layout.uploads_dir(user_id),
        layout.userskills_dir(user_id),
        layout.user_views_dir(user_id),
        layout.socket_dir(user_id),
    ]


@dataclass(frozen=True)
class PurgeReport:
    user_id: int
    already_purged: bool
    sessions_deleted: list[str]
    volume_removed: bool
    entries_removed: int
    steps: list[str] = field(default_factory=list)


class UserPurge:
    def __init__(
        self,
        *,
        store: StateStore,
        purged: PurgedUsers,
        layout: DataLayout,
        stop_sandbox: Callable[[int], None],
        remove_volume: Callable[[int], bool],
        delete_session: Callable[[str, str], object],
        steps: Mapping[str, PurgeStep] | None = None,
        tombstone_steps: Sequence[Callable[[Transaction, int], None]] = (),
    ) -> None:
        """`steps`: other parts' steps by name (previews, credentials, ...), run after the
        sandbox stopped; `tombstone_steps`: other parts' deletions of what names the person or
        gives it something (published uploads, egress rules), in the tombstone's transaction."""
        self._store = store
        self._purged = purged
        self._layout = layout
        self._stop_sandbox = stop_sandbox
        self._remove_volume = remove_volume
        self._delete_session = delete_session
        self.steps: dict[str, PurgeStep] = dict(steps or {})
        self._tombstone_steps = tuple(tombstone_steps)

    def purge(self, user_id: int, *, confirm_user_id: int | None, actor: str) -> PurgeReport:
        check_confirmation(user_id, confirm_user_id)
        with self._store.write() as tx:
            first = self._purged.mark_in(tx, user_id, actor=actor)
            # What names the person, or gives it something, goes with the tombstone.
            tx.execute("DELETE FROM identities WHERE user_id = ?", (user_id,))
            tx.execute("DELETE FROM group_members WHERE user_id = ?", (user_id,))
            tx.execute("DELETE FROM user_resources WHERE user_id = ?", (user_id,))
            for forget in self._tombstone_steps:  # other parts' rows, by their owners
                forget(tx, user_id)
            # The row stays (ids are allocated past existing rows: never reused), emptied.
            tx.execute("UPDATE users SET display_name = NULL, backend = NULL WHERE user_id = ?", (user_id,))
            sessions = [
                row["session_id"]
                for row in tx.all(
                    "SELECT session_id FROM sessions WHERE owner_user_id = ? AND cleanup_done_at IS NULL", (user_id,)
                )
            ]
            if first:
                audit.record(tx, actor=actor, action="user.purge", runtime_user_id=user_id, sessions=len(sessions))
        self._stop_sandbox(user_id)  # nothing of the user runs while its files go
        done: list[str] = []
        for name, step in self.steps.items():
            step(user_id, actor)
            done.append(name)
        for session_id in sessions:
            self._delete_session(session_id, actor)
        volume_removed = self._remove_volume(user_id)
        removed = sum(_remove_user_dir(path) for path in user_paths(self._layout, user_id))
        with self._store.write() as tx:
            audit.record(
                tx, actor=actor, action="user.purge_done", runtime_user_id=user_id,
                sessions=sessions, volume_removed=volume_removed, entries_removed=removed, steps=done,
            )  # fmt: skip
        log.info("user purged %s", kv(user=user_id, sessions=len(sessions), entries=removed, actor=actor))
        return PurgeReport(user_id, not first, sessions, volume_removed, removed, done)


def _remove_user_dir(path: Path) -> int:
    # A leftover mount there (the socket tmpfs; a bind of an image already gone) comes off first.
    if os.path.ismount(path):
        loopfs.unmount(path)
    return remove_tree(path)
