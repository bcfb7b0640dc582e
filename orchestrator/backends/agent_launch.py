"""Preparing one user's agent start, shared by every backend: its configuration (allowed
roots from the mount plan — the single source of truth), a fresh per-sandbox token, and
both written into the user's socket directory.

The token is a 0600 file owned by the sandbox uid, never in argv or the environment (both
show in `ps` and `docker inspect`). The socket directory belongs to the sandbox uid, so the
files are created under a random name with O_EXCL|O_NOFOLLOW and renamed into place: a
symlink planted there is replaced, never written through.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from mounts.layout import DataLayout
from orchestrator.backends.base import SandboxUser
from orchestrator.settings import Settings
from orchestrator.user_dirs import UserDirectories
from sandbox_agent.wire import AgentConfig, AgentLimits, RootConfig

SANDBOX_TMP = "/tmp"


@dataclass(frozen=True)
class AgentLaunch:
    config: AgentConfig
    config_path: Path
    token: str

    @property
    def socket_path(self) -> Path:
        return Path(self.config.socket_path)


def write_private_file(path: Path, content: str, *, owner: int | None) -> None:
    """Atomically place a 0600 file owned by `owner` (None: the current user)."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            if owner is not None:
                os.fchown(fd, owner, owner)
            os.write(fd, content.encode())
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def agent_limits(settings: Settings) -> AgentLimits:
    return AgentLimits(
        output_cap_bytes=settings.output_cap_bytes,
        read_bytes_max=settings.read_bytes_max,
        shell_timeout_s=settings.tool_timeout_s,
        shell_timeout_max_s=settings.tool_timeout_max_s,
        grep_timeout_s=settings.grep_timeout_s,
    )


def shell_environment(layout: DataLayout, user_id: int) -> dict[str, str]:
    """Per-user CLI installs go to `deps/{uid}` (SPEC §2): npm and pip user prefixes there."""
    deps = layout.deps_dir(user_id)
    npm, python = deps / "npm", deps / "python"
    return {
        "PATH": f"{npm / 'bin'}:{python / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "NPM_CONFIG_PREFIX": str(npm),
        "PYTHONUSERBASE": str(python),
        "PIP_USER": "1",
    }


def prepare_agent_launch(
    settings: Settings,
    directories: UserDirectories,
    user: SandboxUser,
    *,
    in_sandbox: bool,
    parent_pid: int | None,
) -> AgentLaunch:
    """Write the user's agent config and a fresh token; the caller starts the agent."""
    layout = directories.layout
    user_id = user.user_id
    directories.ensure_sandbox_dirs(user.plan)
    owner = directories.sandbox_uid(user_id) if directories.chown else None
    token = secrets.token_urlsafe(32)
    write_private_file(layout.token_path(user_id), token + "\n", owner=owner)
    roots = [
        RootConfig(path=str(root.path), access=root.access.value, purpose=root.purpose)
        for root in user.plan.allowed_roots(in_sandbox=in_sandbox)
    ]
    config = AgentConfig(
        socket_path=str(layout.socket_path(user_id)),
        token_file=str(layout.token_path(user_id)),
        user_id=user_id,
        data_root=str(layout.root),
        home=str(layout.home_dir(user_id)),
        tmp_dir=SANDBOX_TMP if in_sandbox else str(layout.tmp_dir(user_id)),
        roots=roots,
        limits=agent_limits(settings),
        resolver=settings.agent_resolver,
        shell_env=shell_environment(layout, user_id),
        instance_id=secrets.token_hex(8),
        parent_pid=parent_pid,
        # Only for a uid of its own: RLIMIT_NPROC counts every process of the uid.
        max_processes=settings.sandbox_pids if owner is not None else None,
        sweep_uid=owner is not None,  # a uid of its own: every process of it is this sandbox's
    )
    config_path = layout.agent_config_path(user_id)
    write_private_file(config_path, config.model_dump_json(indent=2), owner=owner)
    return AgentLaunch(config=config, config_path=config_path, token=token)
