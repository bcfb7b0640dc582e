"""People named by a chat platform: `(platform, external id)` mapped once to a user id of ours.

A bot may name a person the way its platform does (Slack's `U024BE7LH`, Feishu's `ou_...`)
instead of keeping its own table of integers. The first sighting allocates a user id, which
keeps deciding everything a user id decides (the sandbox uid, the data directories); the
mapping is a row, so it survives restarts, and an id once allocated is never handed out again.

Allocation runs inside one write transaction (SQLite has one writer at a time), so fifty
concurrent first sightings of one person yield one user id. Ids are taken from the top of the
instance's range downwards, skipping every id the `users` table already knows: a bot that
manages small integer ids of its own keeps them, and meets an allocated id only by naming it.

External ids are opaque text: validated (`mounts.ids.external_id`) and only ever a row key,
never part of a path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mounts import ids
from orchestrator import audit
from orchestrator.clock import now_iso
from orchestrator.errors import Conflict, InvalidInput
from orchestrator.state_store import StateStore, Transaction
from orchestrator.users.repository import UserRepository

ACTING_SEPARATOR = ":"


@dataclass(frozen=True, order=True)
class PlatformIdentity:
    """A person as a chat platform knows them; validated on construction."""

    platform: str
    external_id: str

    def __post_init__(self) -> None:
        ids.platform(self.platform, "platform")
        ids.external_id(self.external_id, "id")

    def header_value(self) -> str:
        return f"{self.platform}{ACTING_SEPARATOR}{self.external_id}"


def parse_platform_identity(text: str, field: str) -> PlatformIdentity:
    """Pure: `{platform}:{external_id}` (as `X-Acting-User` carries it) into an identity. The
    platform name has no `:`, so the first one separates; the id may hold more."""
    platform, sep, external = text.partition(ACTING_SEPARATOR)
    if not sep:
        raise InvalidInput(f"{field} must be a user id or {{platform}}:{{id}}", field=field)
    try:
        return PlatformIdentity(platform, external)
    except ids.InvalidIdentifier as exc:
        raise InvalidInput(f"{field}: {exc.message}", field=field) from None


@dataclass(frozen=True)
class IdentityRecord:
    platform: str
    external_id: str
    user_id: int
    display_name: str | None
    created_at: str

    @property
    def identity(self) -> PlatformIdentity:
        return PlatformIdentity(self.platform, self.external_id)


def _record(row) -> IdentityRecord:  # type: ignore[no-untyped-def]
    return IdentityRecord(
        platform=row["platform"],
        external_id=row["external_id"],
        user_id=row["user_id"],
        display_name=row["display_name"],
        created_at=row["created_at"],
    )


def preferred_identity(records: Iterable[IdentityRecord], platform_hint: str | None) -> IdentityRecord | None:
    """Pure: the identity to show for a person in a context of `platform_hint` (a session's
    group platform or channel): one on that platform if the person has one, else the oldest."""
    ordered = sorted(records, key=lambda r: (r.created_at, r.platform, r.external_id))
    if platform_hint is not None:
        for record in ordered:
            if record.platform == platform_hint:
                return record
    return ordered[0] if ordered else None


def channel_platform(channel: str) -> str:
    """Pure: the platform a session channel belongs to (`feishu_group` → `feishu`)."""
    for suffix in ("_group", "_private"):
        if channel.endswith(suffix) and len(channel) > len(suffix):
            return channel[: -len(suffix)]
    return channel


class IdentityRepository:
    def __init__(self, store: StateStore, users: UserRepository) -> None:
        self._store = store
        self._users = users

    # --- reading ----------------------------------------------------------------------------

    def get(self, identity: PlatformIdentity) -> IdentityRecord | None:
        with self._store.read() as tx:
            row = tx.one(
                "SELECT * FROM identities WHERE platform = ? AND external_id = ?",
                (identity.platform, identity.external_id),
            )
        return _record(row) if row else None

    def of_users(self, user_ids: Iterable[int]) -> Mapping[int, list[IdentityRecord]]:
        wanted = sorted(set(user_ids))
        found: dict[int, list[IdentityRecord]] = {}
        if not wanted:
            return found
        with self._store.read() as tx:
            for start in range(0, len(wanted), 500):  # SQLite's variable limit
                chunk = wanted[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for row in tx.all(f"SELECT * FROM identities WHERE user_id IN ({marks})", chunk):
                    found.setdefault(row["user_id"], []).append(_record(row))
        return found

    def list(self, *, platform: str | None = None, user_id: int | None = None, limit: int = 100, after: str | None = None) -> list[IdentityRecord]:
        clauses, params = [], []  # type: ignore[var-annotated]
        if platform is not None:
            clauses.append("platform = ?")
            params.append(platform)
        if user_id is not None:
            clauses.append("user_id = ?")
            params.append(user_id)
        if after is not None:
            clauses.append("platform || ':' || external_id > ?")
            params.append(after)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._store.read() as tx:
            rows = tx.all(
                f"SELECT * FROM identities {where} ORDER BY platform || ':' || external_id LIMIT ?",
                (*params, limit),
            )
        return [_record(row) for row in rows]

    # --- writing ----------------------------------------------------------------------------

    def sight(self, identity: PlatformIdentity, *, display_name: str | None = None, actor: str = "bot") -> IdentityRecord:
        """The person's record, allocating their user id on the first sighting. A display name,
        when given, becomes the user's (as `PUT /v1/users/{uid}` would set it)."""
        with self._store.write() as tx:
            row = self._row(tx, identity)
            if row is None:
                user_id = self._allocate(tx)
                now = now_iso()
                tx.execute(
                    "INSERT INTO users (user_id, display_name, created_at, updated_at) VALUES (?, ?, ?, ?)",
                    (user_id, display_name, now, now),
                )
                tx.execute(
                    "INSERT INTO identities (platform, external_id, user_id, display_name, created_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (identity.platform, identity.external_id, user_id, display_name, now),
                )
                audit.record(
                    tx, actor=actor, action="identity.allocate", runtime_user_id=user_id,
                    platform=identity.platform, external_id=identity.external_id,
                )  # fmt: skip
            elif display_name is not None and display_name != row["display_name"]:
                now = now_iso()
                tx.execute(
                    "UPDATE identities SET display_name = ? WHERE platform = ? AND external_id = ?",
                    (display_name, identity.platform, identity.external_id),
                )
                tx.execute(
                    "UPDATE users SET display_name = ?, updated_at = ? WHERE user_id = ?",
                    (display_name, now, row["user_id"]),
                )
            row = self._row(tx, identity)
        assert row is not None
        return _record(row)

    def link(self, identity: PlatformIdentity, user_id: int, *, actor: str) -> tuple[IdentityRecord, bool]:
        """Admin: name an existing (or new) user by one more platform identity — the same person
        on two platforms. Returns the record and whether it was created. An identity already
        mapped to another user is a 409: moving it would move a person's sandbox and files."""
        self._users.admit(user_id)
        with self._store.write() as tx:
            row = self._row(tx, identity)
            if row is not None and row["user_id"] != user_id:
                raise Conflict(
                    f"{identity.header_value()} already names user {row['user_id']}; an identity is never moved"
                    " to another user",
                    field="user_id",
                )
            created = row is None
            if created:
                UserRepository.ensure(tx, user_id)
                tx.execute(
                    "INSERT INTO identities (platform, external_id, user_id, display_name, created_at)"
                    " VALUES (?, ?, ?, NULL, ?)",
                    (identity.platform, identity.external_id, user_id, now_iso()),
                )
                audit.record(
                    tx, actor=actor, action="identity.link", runtime_user_id=user_id,
                    platform=identity.platform, external_id=identity.external_id,
                )  # fmt: skip
            row = self._row(tx, identity)
        assert row is not None
        return _record(row), created

    @staticmethod
    def _row(tx: Transaction, identity: PlatformIdentity):  # type: ignore[no-untyped-def]
        return tx.one(
            "SELECT * FROM identities WHERE platform = ? AND external_id = ?",
            (identity.platform, identity.external_id),
        )

    def _allocate(self, tx: Transaction) -> int:
        """The highest free user id at or below the allocation mark; the mark moves below it,
        so an allocated id is never handed out again (even if its user is deleted)."""
        top = self._users.max_user_id
        mark = tx.one("SELECT next_user_id FROM identity_allocation WHERE id = 1")
        candidate = min(top, mark["next_user_id"]) if mark is not None else top
        # A cursor, read only as far as the first gap: not the whole table.
        for row in tx.execute("SELECT user_id FROM users WHERE user_id <= ? ORDER BY user_id DESC", (candidate,)):
            if row["user_id"] != candidate:
                break
            candidate -= 1
        if candidate < 1:
            raise Conflict("no user id is left to allocate for a new platform identity", field="id")
        tx.execute(
            "INSERT INTO identity_allocation (id, next_user_id) VALUES (1, ?)"
            " ON CONFLICT (id) DO UPDATE SET next_user_id = excluded.next_user_id",
            (candidate - 1,),
        )
        return candidate
