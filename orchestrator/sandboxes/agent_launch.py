"""Preparing one user's agent start, shared by every backend: its configuration (allowed
roots from the mount plan — the single source of truth), a fresh per-sandbox token, and
both written into the user's agent-secrets directory.

The host (root) never resolves a path inside a directory the sandbox can write. The socket
directory is the sandbox's (its agent binds there), so the token and the config live in
`agent-secrets/{uid}/` instead: root-owned, group = the sandbox's gid, 0750, files 0640. The
sandbox reads its own token there and writes nothing; no other sandbox can enter. The host
reaches that directory and its files on directory fds with O_NOFOLLOW and checks owner and
mode, and a token read back (when a restarted orchestrator reconnects to a running agent) must
have the form of one before it is sent anywhere. The token is never in argv or the
environment (both show in `ps` and `docker inspect`).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from mounts.fs.atomic_write import replace_file_at
from mounts.fs.nofollow import UnsafePath, closing_fd, open_regular_at
from mounts.layout import AGENT_CONFIG_FILE, TOKEN_FILE, DataLayout
from orchestrator.sandboxes.base import SandboxUser
from orchestrator.settings import AgentSettings, SandboxSettings
from orchestrator.users.dirs import UnsafeDirectory, UserDirectories
from sandbox_agent.wire import AgentConfig, AgentLimits, EgressConfig, RootConfig, TOKEN_BYTES, valid_token

SANDBOX_TMP = "/tmp"


@dataclass(frozen=True)
class AgentLaunch:
    config: AgentConfig
    config_path: Path
    token: str

    @property
    def socket_path(self) -> Path:
        return Path(self.config.socket_path)


TOKEN_READ_MAX = 256  # bytes read back from a token file: a token is 43


def write_private_file(dir_fd: int, name: str, content: str, *, group: int | None) -> None:
    """Atomically place `name` in the directory `dir_fd`: mode 0640 with `group` (the sandbox's
    gid, which may read it), else 0600; owned by us (`mounts.fs.atomic_write`)."""
    owner = None if group is None else (-1, group)
    replace_file_at(dir_fd, name, content.encode(), mode=0o640 if group is not None else 0o600, owner=owner)


def read_agent_token(directories: UserDirectories, user_id: int) -> str | None:
    """The token of the agent last started for `user_id`, or None when there is no usable one
    (missing, not a plain file of ours with one link, or not of a token's form): the caller then
    starts a fresh agent rather than send anything else."""
    try:
        dir_fd = directories.open_agent_secrets_dir(user_id, create=False)
    except (OSError, UnsafeDirectory):
        return None
    try:
        with closing_fd(dir_fd):
            fd = open_regular_at(dir_fd, TOKEN_FILE, owner_uid=os.geteuid())
        if fd is None:
            return None
        with closing_fd(fd):
            token = os.read(fd, TOKEN_READ_MAX).decode("ascii", "replace").strip()
    except (OSError, UnsafePath):
        return None
    return token if valid_token(token) else None


def agent_limits(settings: AgentSettings) -> AgentLimits:
    return AgentLimits(
        output_cap_bytes=settings.output_cap_bytes,
        shell_output_cap_bytes=settings.shell_output_cap_bytes,
        shell_spool_max_bytes=settings.shell_spool_max_bytes,
        read_bytes_max=settings.read_bytes_max,
        shell_timeout_s=settings.tool_timeout_s,
        shell_timeout_max_s=settings.tool_timeout_max_s,
        grep_timeout_s=settings.grep_timeout_s,
        process_max_count=settings.process_max_per_user,
        process_spool_bytes=settings.process_spool_bytes,
        process_max_runtime_s=settings.process_max_runtime_s,
        kernels_max=settings.kernels_per_user,
        kernel_idle_s=settings.kernel_idle_s,
    )


GIT_NOREPLY_DOMAIN = "users.noreply.invalid"  # `.invalid` never resolves: no mail goes anywhere


def git_identity(user_id: int, display_name: str | None) -> dict[str, str]:
    """Who `git commit` in the sandbox says wrote it: the user's display name (else `user N`)
    and a no-reply address of the user id."""
    name = " ".join((display_name or "").split())[:100] or f"user {user_id}"
    email = f"user-{user_id}@{GIT_NOREPLY_DOMAIN}"
    return {"GIT_AUTHOR_NAME": name, "GIT_COMMITTER_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_COMMITTER_EMAIL": email}


def shell_environment(layout: DataLayout, user_id: int, user: SandboxUser | None = None) -> dict[str, str]:
    """Per-user CLI installs go to `deps/{uid}`: npm's prefix `deps/{uid}/npm`, and pip's
    target `deps/{uid}/pip` (importable through PYTHONPATH, its scripts on PATH). A target,
    not `--user`: Debian's python refuses `pip install --user` (PEP 668, externally
    managed), while an install into a directory of its own is allowed. Then git's identity,
    and the variables of the user's template (which may not name any of ours: recipe.py)."""
    deps = layout.deps_dir(user_id)
    npm, pip = deps / "npm", deps / "pip"
    env = dict(user.template.env) if user is not None and user.template is not None else {}
    env.update(git_identity(user_id, user.display_name if user is not None else None))
    env.update({
        "PATH": f"{npm / 'bin'}:{pip / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "NPM_CONFIG_PREFIX": str(npm),
        "PIP_TARGET": str(pip),
        "PYTHONPATH": str(pip),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    })  # fmt: skip
    return env


def egress_config(
    settings: SandboxSettings, layout: DataLayout, user_id: int, *, private_network: bool, hand_over: bool = True
) -> EgressConfig | None:
    """Where the sandbox's forwarder listens and relays to; None with egress off. On the host's
    network (the bare process backend) a fixed port would collide between users: any free one.
    `hand_over`: the sandbox's sockets are the host kernel's, so connections can be passed."""
    if settings.egress == "off":
        return None
    ca = settings.ca_bundle
    return EgressConfig(
        socket_path=str(layout.egress_socket_path(user_id)),
        port=settings.egress_forwarder_port if private_network else 0,
        ca_file=str(ca) if ca.is_file() else None,
        hand_over=hand_over,
    )


def prepare_agent_launch(
    settings: SandboxSettings,
    directories: UserDirectories,
    user: SandboxUser,
    *,
    in_sandbox: bool,
    parent_pid: int | None,
    private_network: bool = True,
    listen_port: int | None = None,
    egress_reachable: bool = True,
    host_kernel: bool = True,
) -> AgentLaunch:
    """Write the user's agent config and a fresh token; the caller starts the agent.
    `listen_port`: the agent also listens on that port of its loopback (a pod's);
    `egress_reachable`: the sandbox can reach the host's egress socket (not from a pod on
    another node); `host_kernel`: its sockets are the host's (not under gVisor)."""
    layout = directories.layout
    user_id = user.user_id
    directories.ensure_sandbox_dirs(user.plan, sandbox_start=True)
    sandbox_uid = directories.sandbox_uid(user_id) if directories.chown else None
    token = secrets.token_urlsafe(TOKEN_BYTES)
    roots = [
        RootConfig(path=str(root.path), access=root.access.value, purpose=root.purpose)
        for root in user.plan.allowed_roots(in_sandbox=in_sandbox)
    ]
    config = AgentConfig(
        socket_path=str(layout.socket_path(user_id)),
        token_file=str(layout.token_path(user_id)),
        listen_port=listen_port,
        user_id=user_id,
        data_root=str(layout.root),
        home=str(layout.home_dir(user_id)),
        tmp_dir=SANDBOX_TMP if in_sandbox else str(layout.tmp_dir(user_id)),
        roots=roots,
        limits=agent_limits(settings.agent),
        resolver=settings.agent.resolver,
        shell_env={**directories.credential_env(user_id), **shell_environment(layout, user_id, user)},
        kernel_python=settings.agent.kernel_python,
        instance_id=secrets.token_hex(8),
        parent_pid=parent_pid,
        # Only for a uid of its own: RLIMIT_NPROC counts every process of the uid.
        max_processes=settings.pids if sandbox_uid is not None else None,
        sweep_uid=sandbox_uid is not None,  # a uid of its own: every process of it is this sandbox's
        egress=(
            egress_config(settings, layout, user_id, private_network=private_network, hand_over=host_kernel)
            if egress_reachable
            else None
        ),
        # Later than the orchestrator's own idle stop, so normally that one acts; this bounds a
        # sandbox whose orchestrator vanished (docs/lifecycle.md).
        idle_exit_s=settings.idle_timeout_s + settings.dead_man_margin_s,
    )
    with closing_fd(directories.open_agent_secrets_dir(user_id, create=True)) as dir_fd:
        try:
            write_private_file(dir_fd, TOKEN_FILE, token + "\n", group=sandbox_uid)
            write_private_file(dir_fd, AGENT_CONFIG_FILE, config.model_dump_json(indent=2), group=sandbox_uid)
        except UnsafePath as exc:
            # Only root writes there: something else at the token's or config's name was not
            # put there by us, and the agent is not started on top of it.
            raise UnsafeDirectory(
                f"{layout.agent_secrets_dir(user_id)}: {exc.component} {exc.reason}; remove it and retry"
            ) from None
    return AgentLaunch(config=config, config_path=layout.agent_config_path(user_id), token=token)
