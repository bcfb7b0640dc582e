"""Platform identities: one user id per person, under concurrent first sightings and across a
restart; opaque ids validated; admins link a second platform and never move an identity."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mounts import ids
from orchestrator.errors import Conflict, InvalidInput
from orchestrator.state_schema import STATE_MIGRATIONS
from orchestrator.state_store import StateStore
from orchestrator.users.identities import (
    IdentityRecord,
    IdentityRepository,
    PlatformIdentity,
    channel_platform,
    parse_platform_identity,
    preferred_identity,
)
from orchestrator.users.repository import UserRepository

SLACK_OWNER = PlatformIdentity("slack", "U0OWNER")


def repository(path: Path, max_user_id: int = 1000) -> tuple[StateStore, IdentityRepository]:
    store = StateStore(path, STATE_MIGRATIONS)
    store.open()
    return store, IdentityRepository(store, UserRepository(store, max_user_id=max_user_id))


def test_fifty_concurrent_first_sightings_of_one_person_yield_one_user_id(tmp_path: Path) -> None:
    store, identities = repository(tmp_path / "state.sqlite3")
    barrier = threading.Barrier(50)
    seen: list[int] = []

    def sight() -> None:
        barrier.wait()
        seen.append(identities.sight(SLACK_OWNER).user_id)

    threads = [threading.Thread(target=sight) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 50 and len(set(seen)) == 1
    assert [r.user_id for r in identities.list(platform="slack")] == seen[:1]
    store.close()


def test_the_mapping_survives_a_restart_and_ids_are_never_handed_out_twice(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    store, identities = repository(path)
    first = identities.sight(SLACK_OWNER).user_id
    second = identities.sight(PlatformIdentity("slack", "U0SPEAK")).user_id
    assert (first, second) == (1000, 999)  # from the top of the range down
    store.close()

    store, identities = repository(path)
    assert identities.sight(SLACK_OWNER).user_id == first
    assert identities.sight(PlatformIdentity("feishu", "ou_new")).user_id == 998
    store.close()


def test_allocation_skips_the_ids_a_bot_uses_itself(tmp_path: Path) -> None:
    store, identities = repository(tmp_path / "state.sqlite3")
    users = UserRepository(store, max_user_id=1000)
    for uid in (1000, 999, 997):
        users.upsert(uid, display_name=None)
    assert identities.sight(SLACK_OWNER).user_id == 998
    assert identities.sight(PlatformIdentity("slack", "U2")).user_id == 996
    store.close()


def test_a_display_name_becomes_the_users(tmp_path: Path) -> None:
    store, identities = repository(tmp_path / "state.sqlite3")
    record = identities.sight(SLACK_OWNER, display_name="Alice")
    users = UserRepository(store, max_user_id=1000)
    assert users.get(record.user_id).display_name == "Alice"  # type: ignore[union-attr]
    identities.sight(SLACK_OWNER, display_name="Alice B.")
    assert users.get(record.user_id).display_name == "Alice B."  # type: ignore[union-attr]
    store.close()


def test_an_admin_links_a_second_platform_and_never_moves_an_identity(tmp_path: Path) -> None:
    store, identities = repository(tmp_path / "state.sqlite3")
    alice = identities.sight(SLACK_OWNER).user_id
    record, created = identities.link(PlatformIdentity("feishu", "ou_alice"), alice, actor="admin")
    assert created and record.user_id == alice
    assert identities.link(PlatformIdentity("feishu", "ou_alice"), alice, actor="admin")[1] is False
    bob = identities.sight(PlatformIdentity("slack", "U0BOB")).user_id
    with pytest.raises(Conflict):
        identities.link(PlatformIdentity("feishu", "ou_alice"), bob, actor="admin")
    assert sorted(r.platform for r in identities.of_users([alice])[alice]) == ["feishu", "slack"]
    store.close()


@pytest.mark.parametrize("bad", ["a/b", "..", ".", "a\x00b", "x" * (10 * 1024), "", "a b", "tab\there", "\u2028", "\u00e9t\u00e9"])
def test_bad_external_ids_are_refused(bad: str) -> None:
    with pytest.raises(ids.InvalidIdentifier):
        PlatformIdentity("slack", bad)


@pytest.mark.parametrize("bad", ["Slack", "1slack", "", "s" * 33, "sl/ack", "slack:x"])
def test_bad_platform_names_are_refused(bad: str) -> None:
    with pytest.raises(ids.InvalidIdentifier):
        PlatformIdentity(bad, "U1")


def test_platform_ids_of_real_platforms_are_taken_as_they_are() -> None:
    for platform, external in [("slack", "U024BE7LH"), ("feishu", "ou_7d8a6e6df7621556ce0d21922b676706ccs"),
                               ("discord", "80351110224678912"), ("teams", "29:1a2b3c-4d5e"), ("acme-chat", "alice@example.com")]:  # fmt: skip
        assert PlatformIdentity(platform, external).external_id == external


def test_the_acting_header_form() -> None:
    assert parse_platform_identity("slack:U024BE7LH", "X-Acting-User") == PlatformIdentity("slack", "U024BE7LH")
    assert parse_platform_identity("teams:29:1a2b", "X-Acting-User") == PlatformIdentity("teams", "29:1a2b")
    with pytest.raises(InvalidInput):
        parse_platform_identity("slack:", "X-Acting-User")
    with pytest.raises(InvalidInput):
        parse_platform_identity("Slack:U1", "X-Acting-User")


def test_the_identity_shown_prefers_the_sessions_platform() -> None:
    def rec(platform: str, at: str) -> IdentityRecord:
        return IdentityRecord(platform, "x", 5, None, at)

    both = [rec("slack", "2026-01-02"), rec("feishu", "2026-01-01")]
    assert preferred_identity(both, "slack").platform == "slack"  # type: ignore[union-attr]
    assert preferred_identity(both, "discord").platform == "feishu"  # type: ignore[union-attr]
    assert preferred_identity([], "slack") is None
    assert channel_platform("feishu_group") == "feishu" and channel_platform("slack") == "slack"
    assert channel_platform("_group") == "_group"
