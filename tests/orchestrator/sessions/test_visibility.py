"""Who sees a session: the rule alone, without a store (the HTTP side is in
test_session_isolation.py and tests/orchestrator/http/test_acting_user.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.sessions.records import SessionRecord
from orchestrator.sessions.visibility import Sight, sight
from orchestrator.users.repository import GroupRef

GROUP = GroupRef("feishu", "oc_team")
OWNER, MEMBER, STRANGER = 17, 67, 91
LIVE = SessionRecord(
    session_id="g-1", owner_user_id=OWNER, project_id=None, channel="feishu_group", group=GROUP,
    parent_session_id=None, title=None, last_runtime_user_id=None, allow_cross_read=True, cross_private=False,
    archived=False, pinned=False, created_at="t0", updated_at="t0",
)
PENDING = replace(LIVE, deleted_at="t1")
CLEANED = replace(PENDING, cleanup_done_at="t2")


def members(group: GroupRef, user: int) -> bool:
    return group == GROUP and user == MEMBER


@pytest.mark.parametrize(
    ("record", "acting", "owner_only", "expected"),
    [
        (LIVE, None, True, Sight.VISIBLE),  # the bot sees everything
        (LIVE, OWNER, True, Sight.VISIBLE),
        (LIVE, MEMBER, False, Sight.VISIBLE),  # a member sees its group's sessions
        (LIVE, MEMBER, True, Sight.HIDDEN),  # ...but only the owner changes them
        (LIVE, STRANGER, False, Sight.HIDDEN),
        (replace(LIVE, group=None), MEMBER, False, Sight.HIDDEN),  # no group, no members
        (PENDING, OWNER, False, Sight.CLEANUP_PENDING),  # the owner is told to repeat the DELETE
        (PENDING, None, False, Sight.CLEANUP_PENDING),
        (PENDING, MEMBER, False, Sight.HIDDEN),  # everybody else: not found
        (CLEANED, OWNER, False, Sight.HIDDEN),
        (None, None, False, Sight.HIDDEN),
    ],
)
def test_sight(record: SessionRecord | None, acting: int | None, owner_only: bool, expected: Sight) -> None:
    assert sight(record, acting, members, owner_only=owner_only) is expected


def test_membership_is_asked_only_when_it_decides() -> None:
    def no_lookup(group: GroupRef, user: int) -> bool:
        raise AssertionError("asked")

    for acting in (None, OWNER):
        assert sight(LIVE, acting, no_lookup) is Sight.VISIBLE
    assert sight(LIVE, MEMBER, no_lookup, owner_only=True) is Sight.HIDDEN
