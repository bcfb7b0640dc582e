"""The mount plan: pure, deterministic, one source of truth, nothing of anyone else."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mounts.layout import DataLayout, GroupRef
from mounts.plan import SANDBOX_TMP, Access, plan_mounts

LAYOUT = DataLayout(Path("/srv/orch-data"))
HOST_ONLY = [
    LAYOUT.state_dir,
    LAYOUT.sessions_root,
    LAYOUT.skills_root,
    LAYOUT.content_store,
    LAYOUT.skill_locks_dir,
]

# The hash of user 7's plan without groups: group gids left it as it was (mounts/plan.py of
# a153b35, d5f1bef1...); the read-only agent-secrets mount changed it on purpose, so every
# sandbox of an older orchestrator is recreated once and its token leaves the socket dir.
PLAN_HASH_OF_USER_7 = "434dfdb6d9cd86dee45a5f1f183c7f9c91c10daf2cb79d98c0aa444260f2525c"

user_ids = st.integers(min_value=1, max_value=1_000_000_000)
groups = st.builds(
    GroupRef,
    channel=st.sampled_from(["feishu_group", "dingtalk_group", "web"]),
    chat_id=st.from_regex(r"[A-Za-z0-9_@:=+-][A-Za-z0-9._@:=+-]{0,20}", fullmatch=True),
)


def is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@settings(max_examples=400, deadline=None)
@given(uid=user_ids, others=st.lists(user_ids, min_size=1, max_size=8), member_of=st.lists(groups, max_size=6))
def test_a_plan_never_holds_another_users_directory_or_anything_host_only(
    uid: int, others: list[int], member_of: list[GroupRef]
) -> None:
    plan = plan_mounts(LAYOUT, uid, member_of)
    for mount in plan.mounts:
        for host_only in HOST_ONLY:
            # Neither inside a host-only place nor a parent that would expose it.
            assert not is_within(mount.host_path, host_only) and not is_within(host_only, mount.host_path)
        for other in set(others) - {uid}:
            for theirs in (
                LAYOUT.runtime_user_dir(other),
                LAYOUT.uploads_dir(other),
                LAYOUT.home_dir(other),
                LAYOUT.deps_dir(other),
                LAYOUT.tmp_dir(other),
                LAYOUT.user_views_dir(other),
                LAYOUT.userskills_dir(other),
                LAYOUT.socket_dir(other),
            ):
                assert not is_within(mount.host_path, theirs) and not is_within(theirs, mount.host_path)
        # Per-user roots (runtime/, uploads/, ...) are never mounted whole.
        for root in (LAYOUT.runtime_root, LAYOUT.uploads_root, LAYOUT.users_root, LAYOUT.skill_views_root,
                     LAYOUT.userskills_root, LAYOUT.root):
            assert mount.host_path != root
    group_mounts = {m.host_path for m in plan.mounts if m.purpose.startswith("group:")}
    assert group_mounts == {LAYOUT.group_dir(g) for g in member_of}


@settings(max_examples=200, deadline=None)
@given(uid=user_ids, member_of=st.lists(groups, max_size=5))
def test_plans_are_deterministic_and_identical_paths_except_tmp(uid: int, member_of: list[GroupRef]) -> None:
    plan = plan_mounts(LAYOUT, uid, member_of)
    again = plan_mounts(LAYOUT, uid, list(reversed(member_of)) + member_of)
    assert plan == again and plan.plan_hash == again.plan_hash
    for mount in plan.mounts:
        if mount.purpose == "tmp":
            assert mount.sandbox_path == SANDBOX_TMP and mount.host_path == LAYOUT.tmp_dir(uid)
        else:
            assert mount.sandbox_path == mount.host_path


def test_the_plan_hash_changes_with_what_is_mounted() -> None:
    group = GroupRef("feishu_group", "chat-1")
    assert plan_mounts(LAYOUT, 7).plan_hash != plan_mounts(LAYOUT, 7, [group]).plan_hash
    assert plan_mounts(LAYOUT, 7).plan_hash != plan_mounts(LAYOUT, 8).plan_hash
    assert plan_mounts(LAYOUT, 7).plan_hash != plan_mounts(DataLayout(Path("/elsewhere")), 7).plan_hash


def test_group_gids_are_in_the_plan_and_its_hash() -> None:
    team, other = GroupRef("feishu", "team"), GroupRef("feishu", "other")
    plan = plan_mounts(LAYOUT, 7, [team, other], {team: 2_000_000_001, other: 2_000_000_000})
    assert plan.group_gids == (2_000_000_000, 2_000_000_001)
    assert {m.purpose: m.gid for m in plan.mounts if m.gid is not None} == {
        "group:feishu/team": 2_000_000_001,
        "group:feishu/other": 2_000_000_000,
    }
    assert plan_mounts(LAYOUT, 7, [team], {team: 2_000_000_001}).group_gids == (2_000_000_001,)
    # another gid for the same workspace is another plan (the sandbox must get the new gid)
    assert plan.plan_hash != plan_mounts(LAYOUT, 7, [team, other], {team: 2_000_000_002, other: 2_000_000_000}).plan_hash
    assert plan_mounts(LAYOUT, 7).group_gids == ()


def test_a_plan_without_groups_has_the_hash_it_had_without_group_gids() -> None:
    # Group gids must not recreate every sandbox: only plans with a group workspace change.
    assert plan_mounts(DataLayout(Path("/srv/orch-data")), 7).plan_hash == PLAN_HASH_OF_USER_7


def test_allowed_roots_come_from_the_same_plan_with_the_same_access() -> None:
    plan = plan_mounts(LAYOUT, 7, [GroupRef("web", "g")])
    roots = {r.path: r.access for r in plan.allowed_roots(in_sandbox=False)}
    assert roots[LAYOUT.user_views_dir(7)] is Access.READ_ONLY
    assert roots[LAYOUT.userskills_dir(7)] is Access.READ_ONLY
    assert roots[LAYOUT.runtime_user_dir(7)] is Access.READ_WRITE
    assert roots[LAYOUT.group_dir(GroupRef("web", "g"))] is Access.READ_WRITE
    # the agent code and the socket directory are mounted but are not places for tools
    assert LAYOUT.agent_dir not in roots and LAYOUT.socket_dir(7) not in roots
    in_sandbox = {r.path for r in plan.allowed_roots(in_sandbox=True)}
    assert SANDBOX_TMP in in_sandbox and LAYOUT.tmp_dir(7) not in in_sandbox


def test_views_and_sessions_links_resolve_inside_the_plan() -> None:
    # A session link points at skill-views/{uid}/{name}, whose target is relative and stays in
    # the same mount: everything a skill link leads to is inside the user's own plan.
    plan = plan_mounts(LAYOUT, 7)
    roots = [r.path for r in plan.allowed_roots(in_sandbox=False)]
    for path in (LAYOUT.session_skill_link(7, "s", "x"), LAYOUT.user_view(7, "x"),
                 LAYOUT.user_view_version(7, "f" * 64), LAYOUT.userskill_source(7, "x")):
        assert any(is_within(path, root) for root in roots)
