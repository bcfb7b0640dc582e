"""The agent's token on disk: where it is written, and what the host accepts when it reads one
back (a restarted orchestrator reconnecting to a running docker sandbox)."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

import pytest

from mounts.layout import DataLayout
from mounts.plan import plan_mounts
from orchestrator.sandboxes.agent_launch import prepare_agent_launch, read_agent_token
from orchestrator.sandboxes.base import SandboxUser
from orchestrator.settings import SandboxSettings
from orchestrator.users.dirs import UserDirectories
from sandbox_agent.wire import valid_token
from tests.conftest import make_settings

USER = 17
AS_ROOT = os.geteuid() == 0


@pytest.fixture
def directories(traversable_tmp: Path) -> UserDirectories:
    return UserDirectories(DataLayout(traversable_tmp / "data"), 100000)


def launch(directories: UserDirectories) -> str:
    settings = SandboxSettings.of(make_settings(directories.layout.root))
    user = SandboxUser(USER, plan_mounts(directories.layout, USER))
    return prepare_agent_launch(settings, directories, user, in_sandbox=True, parent_pid=None).token


def test_the_token_is_written_where_the_sandbox_can_read_but_not_write(directories: UserDirectories) -> None:
    token = launch(directories)
    layout = directories.layout
    assert valid_token(token) and read_agent_token(directories, USER) == token
    assert layout.token_path(USER).parent == layout.agent_secrets_dir(USER) != layout.socket_dir(USER)
    for path, mode in ((layout.agent_secrets_dir(USER), 0o750), (layout.token_path(USER), 0o640),
                       (layout.agent_config_path(USER), 0o640)):  # fmt: skip
        st = path.lstat()
        if AS_ROOT:
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 100000 + USER, mode), path
        else:
            assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0, path
    assert not (layout.socket_dir(USER) / "token").exists()


@pytest.mark.parametrize("swap", ["symlink", "hard_link", "not_a_token", "too_long", "fifo"])
def test_a_token_file_that_is_not_ours_or_not_a_token_is_never_used(
    directories: UserDirectories, traversable_tmp: Path, swap: str
) -> None:
    launch(directories)
    token_path = directories.layout.token_path(USER)
    elsewhere = traversable_tmp / "elsewhere"
    elsewhere.write_text(secrets.token_urlsafe(32))
    token_path.unlink()
    if swap == "symlink":
        token_path.symlink_to(elsewhere)
    elif swap == "hard_link":
        os.link(elsewhere, token_path)
    elif swap == "not_a_token":
        token_path.write_text("ORCH_ADMIN_TOKEN=admin-token-for-tests\n")
    elif swap == "too_long":
        token_path.write_text("a" * 44)
    else:
        os.mkfifo(token_path)  # opening it must not block the host
    assert read_agent_token(directories, USER) is None


@pytest.mark.skipif(not AS_ROOT, reason="ownership needs root")
def test_a_secrets_dir_the_sandbox_could_write_is_not_trusted(directories: UserDirectories) -> None:
    token = launch(directories)
    secrets_dir = directories.layout.agent_secrets_dir(USER)
    os.chown(secrets_dir, 100000 + USER, 100000 + USER)
    assert read_agent_token(directories, USER) is None
    os.chown(secrets_dir, 0, 100000 + USER)
    os.chmod(secrets_dir, 0o770)
    assert read_agent_token(directories, USER) is None
    assert launch(directories) != token  # a new start puts the policy back
    assert read_agent_token(directories, USER) is not None
