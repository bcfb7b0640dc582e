"""Credentials and grants in SQLite and in memory. Secrets are Fernet tokens at rest and in
memory; one is decrypted only when a connection injects it (`secret_of`). The proxy's loop
reads the in-memory maps (whole entries replaced in one assignment); writers take the lock.

This is also the service API other parts use (the admin console among them): `list_metadata`,
`grants_of` and `purge_user`.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

from cryptography.fernet import InvalidToken, MultiFernet

from orchestrator import audit
from orchestrator.clock import iso, now_iso
from orchestrator.credentials.keys import CredentialsKeyRefused, check_token, verify_check
from orchestrator.credentials.model import (
    Credential,
    CredentialSpec,
    Grant,
    InvalidCredential,
    Usable,
    choose_credential,
    credential_host,
    grant_active,
    placeholder,
)
from orchestrator.errors import Forbidden, NotFound
from orchestrator.runs.prompt_identity import DelegatedCredential
from orchestrator.state_store import StateStore, Transaction


@dataclass(frozen=True)
class GrantsOfUser:
    granted: list[Grant]  # what the user granted
    held: list[Grant]  # what was granted to the user (or to every runtime user of a session)


class CredentialStore:
    def __init__(self, store: StateStore, keys: MultiFernet, *, grant_max_s: int) -> None:
        self._store = store
        self._keys = keys
        self.grant_max_s = grant_max_s
        self._lock = threading.Lock()
        self._credentials: dict[int, dict[str, Credential]] = {}
        self._secrets: dict[tuple[int, str], bytes] = {}  # Fernet tokens, never clear text
        self._grants: dict[str, Grant] = {}  # active or recently ended; the proxy filters by time
        # Called with a predicate over (grant_id or None, owner user id, credential name):
        # connections it matches are cut (a revocation, a deletion).
        self.cut_listeners: list[Callable[[Callable[[str | None, int, str], bool]], None]] = []
        self._open()

    # --- start ----------------------------------------------------------------------------

    def _open(self) -> None:
        with self._store.write() as tx:
            row = tx.one("SELECT token FROM credentials_key_check WHERE id = 1")
            if row is None:
                tx.execute("INSERT INTO credentials_key_check (id, token) VALUES (1, ?)", (check_token(self._keys),))
            elif not verify_check(self._keys, bytes(row["token"])):
                raise CredentialsKeyRefused(
                    "the credentials key does not open the stored credentials (ORCH_CREDENTIALS_KEY or "
                    "ORCH_CREDENTIALS_KEY_FILE changed?); start with the key they were stored with, or with the new "
                    "key first and the old one after it to rotate"
                )
            self._rotate_in(tx, self._keys)  # rows still under an older key move to the first
            rows = tx.all("SELECT * FROM credentials")
            grants = tx.all("SELECT * FROM credential_grants WHERE revoked_at IS NULL AND expires_at > ?", (now_iso(),))
        for row in rows:
            self._remember(_credential(row), bytes(row["secret"]))
        for row in grants:
            grant = _grant(row)
            self._grants[grant.grant_id] = grant

    def _rotate_in(self, tx: Transaction, keys: MultiFernet) -> int:
        count = 0
        for row in tx.all("SELECT user_id, name, secret FROM credentials"):
            try:
                token = keys.rotate(bytes(row["secret"]))
            except InvalidToken:
                raise CredentialsKeyRefused(
                    f"credential {row['name']!r} of user {row['user_id']} does not open with the credentials key; "
                    "keep the key it was stored with among the keys"
                ) from None
            tx.execute("UPDATE credentials SET secret = ? WHERE user_id = ? AND name = ?", (token, row["user_id"], row["name"]))
            count += 1
        tx.execute("UPDATE credentials_key_check SET token = ? WHERE id = 1", (check_token(keys),))
        return count

    def rotate(self, keys: MultiFernet, *, actor: str) -> int:
        """Re-encrypt every credential with the first of `keys` (all of them must open every
        row), then use `keys`. Connections go on meanwhile: the in-memory tokens are swapped
        after the commit, and every key of `keys` opens both the old and the new ones."""
        with self._lock:
            with self._store.write() as tx:
                count = self._rotate_in(tx, keys)
                rows = tx.all("SELECT user_id, name, secret FROM credentials")
                audit.record(tx, actor=actor, action="credentials_key_rotated", credentials=count)
            self._keys = keys
            for row in rows:
                self._secrets[(int(row["user_id"]), str(row["name"]))] = bytes(row["secret"])
        return count

    def _remember(self, credential: Credential, token: bytes) -> None:
        mine = dict(self._credentials.get(credential.user_id, {}))
        mine[credential.name] = credential
        self._secrets[(credential.user_id, credential.name)] = token
        self._credentials[credential.user_id] = mine

    # --- credentials ----------------------------------------------------------------------

    def put(self, user_id: int, spec: CredentialSpec, secret: str, *, actor: str) -> Credential:
        token = self._keys.encrypt(secret.encode())
        now = now_iso()
        with self._lock:
            old = self._credentials.get(user_id, {}).get(spec.name)
            credential = Credential(
                user_id=user_id, name=spec.name, hosts=spec.hosts, header=spec.header, template=spec.template,
                env=spec.env, created_at=old.created_at if old else now, last_used_at=old.last_used_at if old else None,
            )  # fmt: skip
            with self._store.write() as tx:
                tx.execute(
                    "INSERT INTO credentials (user_id, name, hosts, header, template, env, secret, created_at, last_used_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(user_id, name) DO UPDATE SET hosts = excluded.hosts,"
                    " header = excluded.header, template = excluded.template, env = excluded.env, secret = excluded.secret",
                    (user_id, spec.name, json.dumps(list(spec.hosts)), spec.header, spec.template, spec.env, token,
                     credential.created_at, credential.last_used_at),
                )  # fmt: skip
                audit.record(
                    tx, actor=actor, action="credential_set", runtime_user_id=user_id, credential=spec.name,
                    hosts=list(spec.hosts), header=spec.header, replaced=old is not None,
                )  # fmt: skip
            self._remember(credential, token)
        if old is not None:  # new hosts or a new secret: tunnels made with the old one end
            self._cut(lambda _grant, owner, name: owner == user_id and name == spec.name)
        return credential

    def list_metadata(self, user_id: int) -> list[Credential]:
        return sorted(self._credentials.get(user_id, {}).values(), key=lambda c: c.name)

    def placeholder_env(self, user_id: int) -> dict[str, str]:
        """`{env: "cred:{name}"}` of the user's credentials that name a variable."""
        return {c.env: placeholder(c.name) for c in self.list_metadata(user_id) if c.env is not None}

    def get(self, user_id: int, name: str) -> Credential:
        credential = self._credentials.get(user_id, {}).get(name)
        if credential is None:
            raise NotFound(f"user {user_id} has no credential {name!r}")
        return credential

    def delete(self, user_id: int, name: str, *, actor: str) -> None:
        self.get(user_id, name)
        with self._lock:
            now = now_iso()
            with self._store.write() as tx:
                tx.execute("DELETE FROM credentials WHERE user_id = ? AND name = ?", (user_id, name))
                ended = self._end_grants_in(tx, "grantor_user_id = ? AND credential = ?", (user_id, name), now)
                audit.record(tx, actor=actor, action="credential_deleted", runtime_user_id=user_id, credential=name,
                             grants_revoked=ended)  # fmt: skip
            self._forget(user_id, name, now)
        self._cut(lambda _grant, owner, cred: owner == user_id and cred == name)

    def purge_user(self, user_id: int, *, actor: str) -> int:
        """Delete every credential of the user and end every grant from or to them; returns
        how many credentials were deleted."""
        with self._lock:
            now = now_iso()
            names = list(self._credentials.get(user_id, {}))
            with self._store.write() as tx:
                tx.execute("DELETE FROM credentials WHERE user_id = ?", (user_id,))
                ended = self._end_grants_in(tx, "grantor_user_id = ? OR grantee_user_id = ?", (user_id, user_id), now)
                audit.record(tx, actor=actor, action="credentials_purged", runtime_user_id=user_id,
                             credentials=names, grants_revoked=ended)  # fmt: skip
            for name in names:
                self._forget(user_id, name, now)
            for grant in list(self._grants.values()):
                if grant.grantee_user_id == user_id and grant.revoked_at is None:
                    self._grants[grant.grant_id] = replace(grant, revoked_at=now)
        self._cut(lambda grant_id, owner, _name: owner == user_id or (grant_id is not None and self._ended(grant_id)))
        return len(names)

    def _forget(self, user_id: int, name: str, now: str) -> None:
        mine = dict(self._credentials.get(user_id, {}))
        mine.pop(name, None)
        self._credentials[user_id] = mine
        self._secrets.pop((user_id, name), None)
        for grant in list(self._grants.values()):
            if grant.grantor_user_id == user_id and grant.credential == name and grant.revoked_at is None:
                self._grants[grant.grant_id] = replace(grant, revoked_at=now)

    def _end_grants_in(self, tx: Transaction, where: str, params: tuple[object, ...], now: str) -> int:
        cursor = tx.execute(f"UPDATE credential_grants SET revoked_at = ? WHERE revoked_at IS NULL AND ({where})", (now, *params))
        return int(cursor.rowcount or 0)

    def _ended(self, grant_id: str) -> bool:
        grant = self._grants.get(grant_id)
        return grant is None or not grant_active(grant, now_iso())

    def secret_of(self, credential: Credential) -> str:
        """Decrypted for one connection; never stored or logged."""
        token = self._secrets.get((credential.user_id, credential.name))
        if token is None:
            raise NotFound(f"credential {credential.name!r} is gone")
        return self._keys.decrypt(token).decode()

    def note_used(self, user_id: int, name: str, at: str) -> None:
        """`last_used_at` (the egress audit writer, off the proxy's loop)."""
        with self._store.write() as tx:
            tx.execute("UPDATE credentials SET last_used_at = ? WHERE user_id = ? AND name = ?", (at, user_id, name))
        with self._lock:  # unless deleted meanwhile: a deletion is never undone here
            credential = self._credentials.get(user_id, {}).get(name)
            token = self._secrets.get((user_id, name))
            if credential is not None and token is not None:
                self._remember(replace(credential, last_used_at=at), token)

    # --- grants ---------------------------------------------------------------------------

    def grant(
        self, grantor: int, credential: str, *, grantee: int | None, session_id: str, ttl_s: int, actor: str
    ) -> Grant:
        if ttl_s <= 0 or ttl_s > self.grant_max_s:
            raise InvalidCredential(f"ttl_s is 1 to {self.grant_max_s} (ORCH_GRANT_MAX_S)", "ttl_s")
        self.get(grantor, credential)
        now = datetime.now(timezone.utc)
        grant = Grant(
            grant_id=f"gr_{secrets.token_hex(12)}", grantor_user_id=grantor, credential=credential, grantee_user_id=grantee,
            session_id=session_id, created_at=iso(now), expires_at=iso(now + timedelta(seconds=ttl_s)), revoked_at=None,
        )  # fmt: skip
        with self._lock:
            with self._store.write() as tx:
                tx.execute(
                    "INSERT INTO credential_grants (grant_id, grantor_user_id, credential, grantee_user_id, session_id,"
                    " created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (grant.grant_id, grantor, credential, grantee, session_id, grant.created_at, grant.expires_at),
                )
                audit.record(
                    tx, actor=actor, action="credential_granted", session_id=session_id, owner_user_id=grantor,
                    runtime_user_id=grantee, grant_id=grant.grant_id, credential=credential, expires_at=grant.expires_at,
                )  # fmt: skip
            self._grants[grant.grant_id] = grant
        return grant

    def grant_by_id(self, grant_id: str) -> Grant:
        grant = self._grants.get(grant_id)
        if grant is None:
            with self._store.read() as tx:
                row = tx.one("SELECT * FROM credential_grants WHERE grant_id = ?", (grant_id,))
            if row is None:
                raise NotFound(f"grant {grant_id} not found")
            grant = _grant(row)
        return grant

    def revoke(self, grant_id: str, *, acting: int | None, actor: str) -> Grant:
        grant = self.grant_by_id(grant_id)
        if acting is not None and acting != grant.grantor_user_id:
            raise Forbidden(f"only the grantor (user {grant.grantor_user_id}) revokes grant {grant_id}", field="X-Acting-User")
        now = now_iso()
        with self._lock:
            with self._store.write() as tx:
                ended = self._end_grants_in(tx, "grant_id = ?", (grant_id,), now)
                audit.record(
                    tx, actor=actor, action="credential_grant_revoked", session_id=grant.session_id,
                    owner_user_id=grant.grantor_user_id, runtime_user_id=grant.grantee_user_id, grant_id=grant_id,
                    credential=grant.credential, was_active=bool(ended) and grant.expires_at > now,
                )  # fmt: skip
            grant = replace(grant, revoked_at=grant.revoked_at or now)
            self._grants[grant_id] = grant
        self._cut(lambda gid, _owner, _name: gid == grant_id)
        return grant

    def grants_of(self, user_id: int) -> GrantsOfUser:
        with self._store.read() as tx:
            granted = tx.all("SELECT * FROM credential_grants WHERE grantor_user_id = ? ORDER BY created_at", (user_id,))
            held = tx.all("SELECT * FROM credential_grants WHERE grantee_user_id = ? ORDER BY created_at", (user_id,))
        return GrantsOfUser([_grant(r) for r in granted], [_grant(r) for r in held])

    def usable_in(self, runtime_user_id: int, session_id: str | None) -> list[tuple[Grant, Credential]]:
        """Delegated credentials a run of `runtime_user_id` in `session_id` may use now."""
        now = now_iso()
        found = []
        for grant in self._grants.values():
            if grant.grantor_user_id == runtime_user_id:
                continue
            if grant.session_id == session_id and grant_active(grant, now) and grant.grantee_user_id in (None, runtime_user_id):
                credential = self._credentials.get(grant.grantor_user_id, {}).get(grant.credential)
                if credential is not None:
                    found.append((grant, credential))
        return sorted(found, key=lambda gc: gc[0].created_at)

    def delegated_to(
        self, runtime_user_id: int, session_id: str, display_name: Callable[[int], str | None]
    ) -> tuple[DelegatedCredential, ...]:
        """What a run of `runtime_user_id` in `session_id` is told it may use (metadata only)."""
        return tuple(
            DelegatedCredential(
                credential=c.name, owner_user_id=c.user_id, owner_display_name=display_name(c.user_id), hosts=c.hosts,
                expires_at=g.expires_at, grant_id=g.grant_id,
            )  # fmt: skip
            for g, c in self.usable_in(runtime_user_id, session_id)
        )

    # --- what the proxy asks --------------------------------------------------------------

    def choose(self, host: str, port: int, *, runtime_user_id: int, session_id: str | None) -> Usable | None:
        return choose_credential(
            host, port, runtime_user_id=runtime_user_id, session_id=session_id,
            own=self._credentials.get(runtime_user_id, {}).values(),
            delegated=self.usable_in(runtime_user_id, session_id), now_iso=now_iso(),
        )  # fmt: skip

    def is_credential_host(self, host: str, *, runtime_user_id: int, session_id: str | None) -> bool:
        usable = [*self._credentials.get(runtime_user_id, {}).values(), *(c for _, c in self.usable_in(runtime_user_id, session_id))]
        return credential_host(host, 0, usable)

    def still_usable(self, usable: Usable) -> bool:
        """Checked before each request of an intercepted connection."""
        if (usable.credential.user_id, usable.credential.name) not in self._secrets:
            return False
        return usable.grant is None or not self._ended(usable.grant.grant_id)

    def _cut(self, predicate: Callable[[str | None, int, str], bool]) -> None:
        for listener in self.cut_listeners:
            listener(predicate)


def _credential(row: sqlite3.Row) -> Credential:
    return Credential(
        user_id=int(row["user_id"]), name=str(row["name"]), hosts=tuple(json.loads(row["hosts"])), header=str(row["header"]),
        template=str(row["template"]), env=row["env"], created_at=str(row["created_at"]), last_used_at=row["last_used_at"],
    )  # fmt: skip


def _grant(row: sqlite3.Row) -> Grant:
    return Grant(
        grant_id=str(row["grant_id"]), grantor_user_id=int(row["grantor_user_id"]), credential=str(row["credential"]),
        grantee_user_id=row["grantee_user_id"], session_id=str(row["session_id"]), created_at=str(row["created_at"]),
        expires_at=str(row["expires_at"]), revoked_at=row["revoked_at"],
    )  # fmt: skip
