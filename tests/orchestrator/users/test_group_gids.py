"""Each group workspace's own gid: allocated once, never shared, never overlapping user uids."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from mounts.ids import MAX_USER_ID
from mounts.layout import GroupRef
from orchestrator.users.group_gids import GidRange, GroupGids, GroupGidsExhausted, next_gid
from orchestrator.service import OrchestratorService
from orchestrator.settings import MAX_ID
from orchestrator.state_schema import STATE_MIGRATIONS
from orchestrator.state_store import StateStore
from orchestrator.users.repository import UserRepository
from tests.conftest import make_settings

TEAM, OTHER = GroupRef("feishu", "team"), GroupRef("dingtalk", "team")


def test_next_gid_counts_up_inside_the_range() -> None:
    small = GidRange(5000, 3)
    assert next_gid(None, small) == 5000
    assert next_gid(5000, small) == 5001
    assert next_gid(5002, small) is None  # used up
    assert 5002 in small and 5003 not in small and 4999 not in small


def store_at(tmp_path: Path) -> StateStore:
    store = StateStore(tmp_path / "state.sqlite3", STATE_MIGRATIONS)
    store.open()
    return store


def join(store: StateStore, group: GroupRef, user_id: int) -> None:
    with store.write() as tx:
        UserRepository.add_group_member(tx, group, user_id)


def test_a_gid_is_allocated_once_per_group_and_kept(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    gids = GroupGids(store, GidRange(2_000_000_000, 10))
    join(store, TEAM, 1)
    join(store, TEAM, 2)
    join(store, OTHER, 2)
    first = gids.memberships_of(1)
    assert first == {TEAM: 2_000_000_000}
    second = gids.memberships_of(2)
    assert second == {OTHER: 2_000_000_001, TEAM: 2_000_000_000}  # same group, same gid
    assert gids.gid_of(GroupRef("web", "new")) == 2_000_000_002
    store.close()
    reopened = store_at(tmp_path)
    assert GroupGids(reopened, GidRange(2_000_000_000, 10)).memberships_of(2) == second
    assert GroupGids(reopened, GidRange(2_000_000_000, 10)).memberships_of(3) == {}
    reopened.close()


def test_concurrent_first_plans_never_hand_out_one_gid_twice(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    groups = [GroupRef("feishu", f"g{i}") for i in range(12)]
    for i, group in enumerate(groups):
        join(store, group, 1 + i % 3)
        join(store, group, 4)  # user 4 is in every group
    gids = GroupGids(store, GidRange(3_000_000, 100))
    barrier = threading.Barrier(6)
    seen: list[dict[GroupRef, int]] = []

    def plan(user_id: int) -> None:
        barrier.wait()
        seen.append(gids.memberships_of(user_id))

    threads = [threading.Thread(target=plan, args=(u,)) for u in (1, 2, 3, 4, 4, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    merged: dict[GroupRef, int] = {}
    for answer in seen:
        for group, gid in answer.items():
            assert merged.setdefault(group, gid) == gid  # everybody saw the same gid
    assert set(merged) == set(groups)
    assert len(set(merged.values())) == len(groups)
    store.close()


def test_a_used_up_range_is_a_clear_error(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    gids = GroupGids(store, GidRange(5000, 1))
    assert gids.gid_of(TEAM) == 5000
    with pytest.raises(GroupGidsExhausted, match="ORCH_GROUP_GID_COUNT"):
        gids.gid_of(OTHER)
    assert gids.gid_of(TEAM) == 5000
    store.close()


def test_the_router_says_sandbox_unavailable_when_no_gid_is_left(tmp_path: Path) -> None:
    service = OrchestratorService(make_settings(tmp_path / "data", group_gid_base=5000, group_gid_count=1))
    try:
        join(service.store, TEAM, 1)
        join(service.store, OTHER, 2)
        assert service.sandboxes.sandbox_user(1).plan.group_gids == (5000,)
        from orchestrator.errors import ToolError

        with pytest.raises(ToolError) as info:
            service.sandboxes.sandbox_user(2)
        assert info.value.code == "sandbox_unavailable"
    finally:
        service.close()


# Each case is built from the uid block in force (the defaults, or a test run's
# ORCH_SANDBOX_UID_BASE / ORCH_MAX_USER_ID), so it describes a real overlap under any block.
@pytest.mark.parametrize(
    "overlap",
    [
        lambda base, top, gids: {"group_gid_base": base},  # the shared gid
        lambda base, top, gids: {"group_gid_base": base + min(501, top)},  # some user's uid
        # reaches into the uids from below
        lambda base, top, gids: {"group_gid_base": base // 2, "group_gid_count": base - base // 2 + 10_000},
        lambda base, top, gids: {"sandbox_uid_base": gids - top // 2},  # the uids reach into the gids
        # the uids pass 31 bits, clear of the gids
        lambda base, top, gids: {"sandbox_uid_base": MAX_ID - top + 1, "group_gid_base": 1000, "group_gid_count": 1000},
        lambda base, top, gids: {"group_gid_base": 2**31 - 10, "group_gid_count": 100},  # past 31 bits
    ],
    ids=["shared-gid", "a-users-uid", "from-below", "uids-into-gids", "uids-past-31-bits", "gids-past-31-bits"],
)
def test_overlapping_or_oversized_id_ranges_are_refused(
    tmp_path: Path, overlap: Callable[[int, int, int], dict[str, int]]
) -> None:
    in_force = make_settings(tmp_path)
    overrides = overlap(in_force.sandbox_uid_base, in_force.max_user_id, in_force.group_gid_base)
    with pytest.raises(ValidationError):
        make_settings(tmp_path, **overrides)


def test_the_default_ranges_are_apart(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    uids = range(settings.sandbox_uid_base, settings.sandbox_uid_base + MAX_USER_ID + 1)
    gids = settings.group_gid_range
    assert gids.first > uids[-1] and gids.last < 2**31 - 1
    assert make_settings(tmp_path, group_gid_base=10_000, group_gid_count=50_000).group_gid_range.last == 59_999


def test_only_a_lost_group_replaces_a_busy_sandbox() -> None:
    from orchestrator.sandboxes.lifecycle_decision import loses_group_access

    assert loses_group_access((2_000_000_000, 2_000_000_001), (2_000_000_001,))
    assert not loses_group_access((2_000_000_001,), (2_000_000_000, 2_000_000_001))  # a join waits
    assert not loses_group_access((), ())
