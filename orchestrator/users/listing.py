"""The admin's list of users (GET /v1/admin/users and the console's users page): each with
the platform identities that name it, the backend its sandbox runs on, the sandbox's state,
its groups; filtered by platform, backend and state, paged by user id."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mounts.layout import GroupRef
from orchestrator.errors import InvalidInput
from orchestrator.runs.records import MAX_RUN_SEQ as SQLITE_INT_MAX
from orchestrator.sandboxes.router import SandboxRouter
from orchestrator.state_store import StateStore
from orchestrator.users.identities import IdentityRecord, IdentityRepository
from orchestrator.users.repository import UserRepository
from orchestrator.users.sandbox_control import SandboxControl, sandbox_state

_BATCH = 200  # users read per query while a filter skips some


@dataclass(frozen=True)
class UserFilter:
    platform: str | None = None
    backend: str | None = None
    state: str | None = None


@dataclass(frozen=True)
class UserSummary:
    user_id: int
    display_name: str | None
    identities: tuple[IdentityRecord, ...]
    backend: str
    backend_override: str | None
    state: str
    groups: tuple[GroupRef, ...]
    created_at: str


def matches(summary: UserSummary, wanted: UserFilter) -> bool:
    """Pure: whether a user passes the filter (each given field must match)."""
    if wanted.platform is not None and all(i.platform != wanted.platform for i in summary.identities):
        return False
    if wanted.backend is not None and summary.backend != wanted.backend:
        return False
    return wanted.state is None or summary.state == wanted.state


@dataclass(frozen=True)
class GroupSummary:
    group: GroupRef
    members: tuple[int, ...]


def list_groups(store: StateStore, *, limit: int = 500) -> list[GroupSummary]:
    """Every group chat with members, and who they are."""
    with store.read() as tx:
        rows = tx.all(
            "SELECT channel, chat_id, group_concat(user_id) AS members FROM group_members"
            " GROUP BY channel, chat_id ORDER BY channel, chat_id LIMIT ?",
            (limit,),
        )
    return [
        GroupSummary(GroupRef(row["channel"], row["chat_id"]), tuple(sorted(int(m) for m in row["members"].split(","))))
        for row in rows
    ]


def parse_cursor(cursor: str | None) -> int | None:
    """Pure: a users page cursor (the last user id of the page before) or None."""
    if cursor is None or cursor == "":
        return None
    if not cursor.isascii() or not cursor.isdecimal() or int(cursor) > SQLITE_INT_MAX:
        raise InvalidInput("cursor must be the next_cursor of an earlier page", field="cursor")
    return int(cursor)


@dataclass(frozen=True)
class SandboxView:
    """A user's sandbox as a bot sees it (GET /v1/users/{id}/sandbox); never starts one."""

    user_id: int
    backend: str  # its override, or the default
    state: str  # running | paused | stopped | failed | none (it starts with the next call)
    since: str | None
    busy: int
    last_call_at: str | None  # the user's last tool call as a run's runtime user


class UserListing:
    def __init__(
        self,
        store: StateStore,
        users: UserRepository,
        identities: IdentityRepository,
        sandboxes: SandboxRouter,
        control: SandboxControl,
        *,
        last_call_at: Callable[[int], str | None] = lambda _user_id: None,
    ) -> None:
        """`last_call_at`: a user's last tool call as a run's runtime user (the runs' records)."""
        self._store = store
        self._users = users
        self._identities = identities
        self._sandboxes = sandboxes
        self._control = control
        self._last_call_at = last_call_at

    def sandbox_of(self, user_id: int) -> SandboxView | None:
        """None for a user the server does not know."""
        if self._users.get(user_id) is None:
            return None
        backend = self._sandboxes.backend_name_for(user_id)
        found = self._sandboxes.backends[backend].status() if backend in self._sandboxes.backends else []
        status = next((s for s in found if s.user_id == user_id), None)
        return SandboxView(
            user_id=user_id,
            backend=backend,
            state=status.state if status is not None else "none",
            since=status.since if status is not None else None,
            busy=status.busy if status is not None else 0,
            last_call_at=self._last_call_at(user_id),
        )

    def summary(self, user_id: int, states: dict[int, str] | None = None) -> UserSummary | None:
        found = self._summaries([user_id], states if states is not None else self._control.states())
        return found[0] if found else None

    def page(self, wanted: UserFilter, *, after: int | None, limit: int) -> tuple[list[UserSummary], int | None]:
        """Up to `limit` users above `after` (ascending ids), and the cursor of the next page
        (None: this was the last). Purged users are not listed."""
        states = self._control.states()
        picked: list[UserSummary] = []
        cursor = after or 0
        while len(picked) <= limit:
            with self._store.read() as tx:
                rows = tx.all(
                    "SELECT user_id FROM users WHERE user_id > ?"
                    " AND user_id NOT IN (SELECT user_id FROM purged_users) ORDER BY user_id LIMIT ?",
                    (cursor, _BATCH),
                )
            if not rows:
                break
            cursor = rows[-1]["user_id"]
            picked += [s for s in self._summaries([r["user_id"] for r in rows], states) if matches(s, wanted)]
        if len(picked) > limit:
            return picked[:limit], picked[limit - 1].user_id
        return picked, None

    def _summaries(self, user_ids: list[int], states: dict[int, str]) -> list[UserSummary]:
        identities = self._identities.of_users(user_ids)
        summaries = []
        for user_id in user_ids:
            record = self._users.get(user_id)
            if record is None:
                continue
            summaries.append(
                UserSummary(
                    user_id=user_id,
                    display_name=record.display_name,
                    identities=tuple(sorted(identities.get(user_id, ()), key=lambda i: i.created_at)),
                    backend=self._sandboxes.backend_name_for(user_id),
                    backend_override=record.backend,
                    state=sandbox_state(states, user_id),
                    groups=tuple(self._users.groups_of(user_id)),
                    created_at=record.created_at,
                )
            )
        return summaries
