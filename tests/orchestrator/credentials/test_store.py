"""The store as other parts use it (the admin console among them): metadata without secrets,
grants granted and held, a user's purge that ends their grants and cuts their connections,
and the grant rules that hold whoever calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import audit
from orchestrator.credentials.keys import new_key, parse_keys
from orchestrator.credentials.model import InvalidCredential, validate_spec
from orchestrator.credentials.store import CredentialStore
from orchestrator.errors import Forbidden, NotFound
from orchestrator.state_schema import STATE_MIGRATIONS
from orchestrator.state_store import StateStore

SECRET = "purge-me-0123456789"


@pytest.fixture
def store(tmp_path: Path) -> CredentialStore:
    state = StateStore(tmp_path / "state.db", STATE_MIGRATIONS)
    state.open()
    return CredentialStore(state, parse_keys(new_key(), source="test"), grant_max_s=600)


def put(store: CredentialStore, user_id: int, name: str) -> None:
    store.put(user_id, validate_spec(name, ["api.example.org"], "Authorization", "Bearer {secret}", "TOKEN", SECRET), SECRET, actor="admin")


def test_metadata_grants_and_a_users_purge(store: CredentialStore) -> None:
    cuts: list[object] = []
    store.cut_listeners.append(cuts.append)
    put(store, 17, "deploy")
    put(store, 17, "docs")
    put(store, 67, "mine")
    assert [c.name for c in store.list_metadata(17)] == ["deploy", "docs"]
    assert SECRET not in repr(store.list_metadata(17))
    assert store.placeholder_env(17) == {"TOKEN": "cred:docs"} or store.placeholder_env(17) == {"TOKEN": "cred:deploy"}
    to_67 = store.grant(17, "deploy", grantee=67, session_id="s-1", ttl_s=60, actor="bot")
    from_67 = store.grant(67, "mine", grantee=17, session_id="s-1", ttl_s=60, actor="bot")
    assert [g.grant_id for g in store.grants_of(17).granted] == [to_67.grant_id]
    assert [g.grant_id for g in store.grants_of(17).held] == [from_67.grant_id]
    assert store.choose("api.example.org", 443, runtime_user_id=67, session_id="s-1").credential.name == "mine"

    assert store.purge_user(17, actor="admin:console") == 2
    assert store.list_metadata(17) == []
    ended = store.grants_of(67)
    assert all(g.revoked_at is not None for g in [*ended.granted, *ended.held])
    assert store.usable_in(67, "s-1") == [] and store.usable_in(17, "s-1") == []
    predicate = cuts[-1]
    assert predicate(None, 17, "deploy") and predicate(to_67.grant_id, 17, "deploy") and not predicate(None, 68, "x")  # type: ignore[operator]
    (row,) = audit.entries(store._store, action="credentials_purged", limit=10)
    assert row.detail["credentials"] == ["deploy", "docs"] and row.detail["grants_revoked"] == 2
    assert SECRET not in json.dumps([r.detail for r in audit.entries(store._store, limit=100)])


def test_grant_rules(store: CredentialStore) -> None:
    put(store, 17, "deploy")
    with pytest.raises(InvalidCredential, match="ORCH_GRANT_MAX_S"):
        store.grant(17, "deploy", grantee=67, session_id="s-1", ttl_s=601, actor="bot")
    with pytest.raises(NotFound):
        store.grant(67, "deploy", grantee=17, session_id="s-1", ttl_s=60, actor="bot")  # not 67's
    grant = store.grant(17, "deploy", grantee=67, session_id="s-1", ttl_s=60, actor="bot")
    with pytest.raises(Forbidden):
        store.revoke(grant.grant_id, acting=67, actor="bot")  # the grantee cannot revoke (nor re-grant)
    assert store.revoke(grant.grant_id, acting=17, actor="bot").revoked_at is not None
    (row,) = audit.entries(store._store, action="credential_grant_revoked", limit=10)
    assert row.detail["grant_id"] == grant.grant_id and row.detail["was_active"] is True
