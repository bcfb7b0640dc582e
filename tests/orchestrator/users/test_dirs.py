"""Host directories of a user's plan: owners and modes, and no symlink games as root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mounts.layout import DataLayout, GroupRef
from mounts.plan import plan_mounts
from orchestrator.users.dirs import GroupWithoutGid, UnsafeDirectory, UserDirectories
from tests.agent_env import traversable_tmp  # noqa: F401 - a fixture

AS_ROOT = os.geteuid() == 0
BASE = 100000
GROUP_GID = 2_000_000_005


def owner_mode(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


@pytest.mark.skipif(not AS_ROOT, reason="ownership is only managed as root")
def test_every_mount_of_the_plan_gets_its_owner_and_mode(traversable_tmp: Path) -> None:
    layout = DataLayout(traversable_tmp / "data")
    dirs = UserDirectories(layout, BASE)
    group = GroupRef("feishu", "oc_1")
    dirs.ensure_sandbox_dirs(plan_mounts(layout, 17, [group], {group: GROUP_GID}))
    uid = BASE + 17
    for path in (layout.runtime_user_dir(17), layout.uploads_dir(17), layout.home_dir(17), layout.deps_dir(17),
                 layout.tmp_dir(17), layout.socket_dir(17)):
        assert owner_mode(path) == (uid, uid, 0o700), path
    for path in (layout.user_views_dir(17), layout.userskills_dir(17)):
        assert owner_mode(path) == (0, uid, 0o750), path
    assert owner_mode(layout.share_dir) == (0, BASE, 0o3770)
    assert owner_mode(layout.group_dir(group)) == (0, GROUP_GID, 0o3770)  # the group's own gid
    for path in (layout.runtime_root, layout.uploads_root, layout.users_root, layout.deps_root, layout.tmp_root,
                 layout.sockets_root, layout.skill_views_root, layout.userskills_root, layout.groups_root,
                 layout.group_dir(group).parent):
        assert owner_mode(path) == (0, 0, 0o711), path


@pytest.mark.skipif(not AS_ROOT, reason="ownership is only managed as root")
def test_a_symlink_planted_by_the_user_is_never_chowned_through(traversable_tmp: Path) -> None:
    layout = DataLayout(traversable_tmp / "data")
    dirs = UserDirectories(layout, BASE)
    dirs.ensure_session_runtime(17, "s1", is_owner=True)
    victim = traversable_tmp / "victim"
    victim.mkdir(mode=0o755)
    session = layout.runtime_dir(17, "s2")
    os.symlink(victim, session)  # the user owns runtime/17 and could do this
    with pytest.raises(UnsafeDirectory, match="not a plain directory"):
        dirs.ensure_session_runtime(17, "s2", is_owner=False)
    assert owner_mode(victim) == (0, 0, 0o755)
    skills = layout.runtime_dir(17, "s1") / "skills"
    os.rmdir(skills)
    os.symlink(victim, skills)
    with pytest.raises(UnsafeDirectory):
        dirs.ensure_session_runtime(17, "s1", is_owner=True)
    assert owner_mode(victim) == (0, 0, 0o755)


def test_without_root_everything_belongs_to_the_current_user(traversable_tmp: Path) -> None:
    layout = DataLayout(traversable_tmp / "data")
    dirs = UserDirectories(layout, BASE)
    dirs.chown = False  # behave like an unprivileged orchestrator
    workdir = dirs.ensure_session_runtime(17, "s1", is_owner=False)
    assert owner_mode(workdir)[2] == 0o700
    assert sorted(p.name for p in workdir.iterdir()) == ["incoming", "outputs", "shell-output", "skills", "user-messages"]


@pytest.mark.skipif(not AS_ROOT, reason="ownership is only managed as root")
def test_a_group_workspace_without_its_own_gid_is_refused_not_shared(traversable_tmp: Path) -> None:
    layout = DataLayout(traversable_tmp / "data")
    dirs = UserDirectories(layout, BASE)
    group = GroupRef("feishu", "oc_1")
    with pytest.raises(GroupWithoutGid):
        dirs.ensure_sandbox_dirs(plan_mounts(layout, 17, [group]))
    assert not layout.group_dir(group).exists()


@pytest.mark.skipif(not AS_ROOT, reason="ownership is only managed as root")
def test_a_workspace_made_before_group_gids_moves_to_its_own_gid(traversable_tmp: Path) -> None:
    layout = DataLayout(traversable_tmp / "data")
    dirs = UserDirectories(layout, BASE)
    group = GroupRef("feishu", "oc_old")
    workspace = layout.group_dir(group)
    workspace.mkdir(parents=True)
    os.chown(workspace, 0, BASE)  # how the previous version left it: the shared gid
    os.chmod(workspace, 0o2770)
    dirs.ensure_sandbox_dirs(plan_mounts(layout, 17, [group], {group: GROUP_GID}))
    assert owner_mode(workspace) == (0, GROUP_GID, 0o3770)
