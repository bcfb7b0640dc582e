"""Each group workspace's own gid (docs/sandbox-agent.md, "Uids, groups and directory modes").

A group workspace is `root:<its gid>` 2770 and only its members' sandboxes carry that gid, so
the operating system keeps other sandbox uids out of it, not only the PathSandbox. The gid of
a group (channel, chat_id) is allocated once in the state DB, from a configured range that
cannot overlap the sandbox uids (`ORCH_GROUP_GID_BASE`, `ORCH_GROUP_GID_COUNT`), and never
changes or goes to another group: the files in the workspace carry it.

Allocation is lazy: the first time a member's plan is built (a membership row without a gid,
also every group from before this table existed), inside one `BEGIN IMMEDIATE` transaction, so
two orchestrator threads never hand out one gid twice.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from mounts.layout import GroupRef
from orchestrator.clock import now_iso
from orchestrator.state_store import StateStore, Transaction


@dataclass(frozen=True)
class GidRange:
    first: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def __contains__(self, gid: object) -> bool:
        return isinstance(gid, int) and self.first <= gid <= self.last


class GroupGidsExhausted(RuntimeError):
    """Every gid of the configured range is taken."""


def next_gid(highest: int | None, gid_range: GidRange, on_disk: frozenset[int] = frozenset()) -> int | None:
    """The gid after the highest one allocated in the range or carried by a group directory on
    disk (gids are never freed, so there are no gaps to fill); None when the range is used up."""
    found = [gid for gid in on_disk if gid in gid_range]
    if highest is not None:
        found.append(highest)
    candidate = gid_range.first if not found else max(found) + 1
    return candidate if candidate in gid_range else None


def gids_on_disk(groups_root: Path) -> frozenset[int]:
    """The gids of the group workspaces `groups/{channel}/{chat_id}/` (never following a link):
    a DB that lost its rows must not hand one of them to a new group."""
    found: set[int] = set()
    for channel in _directories(groups_root):
        found.update(st.st_gid for st in _directory_stats(channel))
    return frozenset(found)


def _directories(path: Path) -> list[Path]:
    return [Path(entry.path) for entry in _scan(path) if entry.is_dir(follow_symlinks=False)]


def _directory_stats(path: Path) -> list[os.stat_result]:
    stats = (entry.stat(follow_symlinks=False) for entry in _scan(path))
    return [st for st in stats if stat.S_ISDIR(st.st_mode)]


def _scan(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as entries:
            return list(entries)
    except (FileNotFoundError, NotADirectoryError):
        return []


class GroupGids:
    def __init__(self, store: StateStore, gid_range: GidRange, *, groups_root: Path | None = None) -> None:
        self._store = store
        self.range = gid_range
        self._groups_root = groups_root

    def memberships_of(self, user_id: int) -> dict[GroupRef, int]:
        """The groups `user_id` belongs to, each with its gid (allocated here when missing)."""
        with self._store.read() as tx:
            rows = tx.all(
                "SELECT m.channel, m.chat_id, g.gid FROM group_members m"
                " LEFT JOIN group_gids g ON g.channel = m.channel AND g.chat_id = m.chat_id"
                " WHERE m.user_id = ? ORDER BY m.channel, m.chat_id",
                (user_id,),
            )
        found = {GroupRef(row["channel"], row["chat_id"]): row["gid"] for row in rows}
        missing = [group for group, gid in found.items() if gid is None]
        if missing:
            with self._store.write() as tx:
                for group in missing:
                    found[group] = self.allocate_in(tx, group)
        return found

    def gid_of(self, group: GroupRef) -> int:
        """The gid of one group, allocated when it has none yet."""
        with self._store.write() as tx:
            return self.allocate_in(tx, group)

    def allocate_in(self, tx: Transaction, group: GroupRef) -> int:
        row = tx.one("SELECT gid FROM group_gids WHERE channel = ? AND chat_id = ?", (group.channel, group.chat_id))
        if row is not None:
            return int(row["gid"])
        highest = tx.one(
            "SELECT MAX(gid) AS gid FROM group_gids WHERE gid BETWEEN ? AND ?", (self.range.first, self.range.last)
        )
        # Scanned at each allocation (once per new group, never on a tool call): cheap, and it
        # also covers workspaces an operator restored from a backup while we ran.
        on_disk = gids_on_disk(self._groups_root) if self._groups_root is not None else frozenset()
        gid = next_gid(highest["gid"] if highest is not None else None, self.range, on_disk)
        if gid is None:
            raise GroupGidsExhausted(
                f"no free group gid in {self.range.first}..{self.range.last}; "
                "raise ORCH_GROUP_GID_COUNT (or move ORCH_GROUP_GID_BASE to a free range)"
            )
        tx.execute(
            "INSERT INTO group_gids (channel, chat_id, gid, allocated_at) VALUES (?, ?, ?, ?)",
            (group.channel, group.chat_id, gid, now_iso()),
        )
        return gid
