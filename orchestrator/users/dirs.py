"""Creating a user's directories on the host (the imperative side of the data layout).

When the orchestrator runs as root, a user's read-write directories belong to that user's
own unprivileged sandbox uid (base + user id), so the operating system keeps users apart,
not only the PathSandbox:
- private dirs (runtime, uploads, home, deps, tmp, sockets): owned by the uid, mode 0700;
- their parents (`runtime/`, `uploads/`, ...): root, 0711 — traversable, not listable;
- read-only per-user dirs (skill views, personal skill sources, the agent's token and
  config): root-owned, group = the user's own gid, 0750: the user reads them, nobody else
  does, and only root writes;
- `share/`: root-owned, group = the shared sandbox gid (= the uid base, which no user
  gets), mode 3770: every sandbox uid is in that group, new files inherit it (setgid) and
  agents run with umask 002, so everybody can edit each other's files; sticky, so only a
  file's owner may delete, rename or replace it;
- a group workspace: the same, but with the group's own gid (`group_gids.py`), which only
  its members' sandboxes carry: other sandbox uids cannot even enter it;
- `agent/`: root, 0755 (see `agent_deploy`).
Without root everything simply belongs to the current user.

Directories are created component by component from the data root on directory fds with
O_NOFOLLOW: a user owns `runtime/{uid}/` and could plant a symlink there, and root must never
chown or chmod whatever such a link points at.
"""

from __future__ import annotations

from collections.abc import Callable

import errno
import logging
import os
import stat
from pathlib import Path
from typing import Protocol

from mounts.fs.nofollow import UnsafePath, open_dir_at, open_root
from mounts.layout import COMPACTION_SUBDIR, RUNTIME_SUBDIRS, DataLayout
from mounts.plan import Mount, MountPlan
from mounts.ids import MAX_USER_ID
from orchestrator.errors import Conflict, InvalidInput
from orchestrator.log import kv

log = logging.getLogger(__name__)

PRIVATE_PURPOSES = frozenset({"runtime", "uploads", "home", "deps", "tmp", "socket"})
# agent_secrets: the agent's token and config, which the host writes and reads as root.
USER_READ_ONLY_PURPOSES = frozenset({"skill_views", "userskills", "agent_secrets"})
SHARED_PURPOSES = frozenset({"share"})  # group workspaces ("group:...") have their own gid

Ownership = tuple[int, int, int] | None  # (uid, gid, mode); None: leave as found


class UnsafeDirectory(Conflict):
    """Something other than a plain directory sits where a user's directory belongs (e.g. a
    symlink the user's own shell planted); root will not work through it."""

    code = "unsafe_directory"


class GroupWithoutGid(RuntimeError):
    """A plan mounts a group workspace without the group's own gid (a programming error)."""


def check_user_id(user_id: int, max_user_id: int, field: str = "user_id") -> int:
    """A 422 for a user id beyond this instance's ORCH_MAX_USER_ID (ids.user_id checks the
    absolute cap)."""
    if user_id > max_user_id:
        raise InvalidInput(f"{field} must be between 1 and {max_user_id} (ORCH_MAX_USER_ID)", field=field)
    return user_id


class VolumePreparer(Protocol):
    """What puts a plan's read-write places on their own filesystems (orchestrator/quotas/)."""

    def prepare(self, plan: MountPlan, *, sandbox_start: bool) -> None: ...

    def check_host_write(self, user_id: int) -> None: ...

    def ensure_socket_fs(self, user_id: int) -> None: ...


def sandbox_uid(user_id: int, *, uid_base: int, max_user_id: int) -> int:
    """The uid a user's sandbox runs as."""
    # The backstop of ORCH_MAX_USER_ID: no uid outside this instance's registered block
    # (`orchestrator.sandboxes.uid_blocks`) is ever handed out, whatever path a user id came in by.
    check_user_id(user_id, max_user_id)
    return uid_base + user_id


class UserDirectories:
    def __init__(
        self,
        layout: DataLayout,
        uid_base: int,
        max_user_id: int = MAX_USER_ID,
        *,
        volumes: VolumePreparer | None = None,
        credential_env: Callable[[int], dict[str, str]] = lambda _user_id: {},
    ) -> None:
        """`volumes`: the disk quotas' preparer (None: plain directories); `credential_env`: the
        placeholder variables of the user's credentials (`GITHUB_TOKEN=cred:github`), put into
        the shells' environment when the sandbox starts; never a secret."""
        self.layout = layout
        self.uid_base = uid_base
        self.max_user_id = max_user_id
        self.chown = os.geteuid() == 0
        self.volumes = volumes
        self.credential_env = credential_env

    def sandbox_uid(self, user_id: int) -> int:
        return sandbox_uid(user_id, uid_base=self.uid_base, max_user_id=self.max_user_id)

    @property
    def shared_gid(self) -> int:
        """The group every sandbox uid is in: owns `share/` and group workspaces."""
        return self.uid_base

    # --- policies ---------------------------------------------------------------------------

    def _parent(self) -> Ownership:
        return (0, 0, 0o711) if self.chown else None

    def _private(self, user_id: int) -> Ownership:
        if self.chown:
            uid = self.sandbox_uid(user_id)
            return (uid, uid, 0o700)
        return (os.geteuid(), os.getegid(), 0o700)

    def _user_read_only(self, user_id: int) -> Ownership:
        return (0, self.sandbox_uid(user_id), 0o750) if self.chown else None

    def _shared(self, gid: int | None = None) -> Ownership:
        # Sticky: only an entry's owner (or root) may rename or delete it, so a member cannot
        # swap another member's file for a symlink (issue 12, item 7).
        return (0, self.shared_gid if gid is None else gid, 0o3770) if self.chown else None

    def _group_workspace(self, mount: Mount) -> Ownership:
        if self.chown and mount.gid is None:
            # Fail closed: the shared gid would open the workspace to every sandbox uid.
            raise GroupWithoutGid(f"{mount.host_path}: the group workspace has no gid of its own in this plan")
        return self._shared(mount.gid)

    # --- the one primitive ----------------------------------------------------------------

    def _ensure(self, path: Path, levels: list[Ownership]) -> Path:
        """Create `path` below the data root, never following a symlink; `levels[i]` is the
        ownership of the i-th component below the root (missing entries: leave as found)."""
        os.close(self._open_dir(path, levels))
        return path

    def _open_dir(self, path: Path, levels: list[Ownership], *, create: bool = True) -> int:
        """`_ensure`, but returns the open fd of `path` (the caller closes it). Without
        `create` a missing component is FileNotFoundError and nothing is created."""
        names = path.relative_to(self.layout.root).parts
        if create:
            self.layout.root.mkdir(parents=True, exist_ok=True)
        fd = open_root(self.layout.root)
        try:
            for depth, name in enumerate(names):
                try:
                    child = open_dir_at(fd, name, create=create)
                except UnsafePath as exc:
                    raise UnsafeDirectory(
                        f"{path}: {exc.component} is not a plain directory ({exc.reason}); remove it and retry"
                    ) from None
                if child is None:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
                os.close(fd)
                fd = child
                want = levels[depth] if depth < len(levels) else None
                if want is not None:
                    uid, gid, mode = want
                    st = os.fstat(fd)
                    if self.chown and (st.st_uid, st.st_gid) != (uid, gid):
                        os.fchown(fd, uid, gid)
                    if stat.S_IMODE(st.st_mode) != mode:
                        os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def ensure_data_root_traversable(self) -> None:
        root = self.layout.root
        root.mkdir(parents=True, exist_ok=True)
        if self.chown:
            mode = stat.S_IMODE(os.stat(root).st_mode)
            if mode & 0o011 != 0o011:
                os.chmod(root, mode | 0o011)
                log.info("made the data root traversable for sandbox uids %s", kv(path=root, mode=oct(mode | 0o011)))

    # --- what callers use --------------------------------------------------------------

    def ensure_session_runtime(self, user_id: int, session_id: str, *, is_owner: bool) -> Path:
        """`runtime/{uid}/{sid}/` with its subdirectories; `compaction/` only for the owner."""
        private = self._private(user_id)
        workdir = self._ensure(self.layout.runtime_dir(user_id, session_id), [self._parent(), private, private])
        subdirs = list(RUNTIME_SUBDIRS) + ([COMPACTION_SUBDIR] if is_owner else [])
        for sub in subdirs:
            self._ensure(workdir / sub, [self._parent(), private, private, private])
        return workdir

    def ensure_skill_views_dir(self, user_id: int) -> Path:
        """`skill-views/{uid}/` with its read-only policy (the skill store builds views in it)."""
        return self._ensure_user_read_only(user_id, self.layout.user_views_dir(user_id))

    def ensure_userskills_dir(self, user_id: int) -> Path:
        """`userskills/{uid}/` with its read-only policy: personal skills are the user's alone."""
        return self._ensure_user_read_only(user_id, self.layout.userskills_dir(user_id))

    def _ensure_user_read_only(self, user_id: int, path: Path) -> Path:
        depth = len(path.relative_to(self.layout.root).parts)
        return self._ensure(path, [self._parent()] * (depth - 1) + [self._user_read_only(user_id)])

    def ensure_uploads(self, user_id: int) -> Path:
        # Uploads are served publicly by the orchestrator, not by other sandboxes.
        return self._ensure(self.layout.uploads_dir(user_id), [self._parent(), self._private(user_id)])

    def open_agent_secrets_dir(self, user_id: int, *, create: bool) -> int:
        """An open fd of `agent-secrets/{uid}/` (the caller closes it), reached without
        following a link and checked: owned by root (by us when not root) and writable by
        nobody else, so nothing in it was put there by a sandbox. `create` also makes it with
        its policy (root:<sandbox gid> 0750); without, a missing one is FileNotFoundError."""
        path = self.layout.agent_secrets_dir(user_id)
        levels = [self._parent(), self._user_read_only(user_id)] if create else []
        fd = self._open_dir(path, levels, create=create)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            os.close(fd)
            raise UnsafeDirectory(
                f"{path} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}; "
                f"only uid {os.geteuid()} may write there"
            )
        return fd

    def ensure_socket_dir(self, user_id: int) -> Path:
        self._ensure_socket_fs(user_id)
        return self._ensure(self.layout.socket_dir(user_id), [self._parent(), self._private(user_id)])

    def _ensure_socket_fs(self, user_id: int) -> None:
        if self.volumes is not None:  # bounded: the sandbox writes there, outside its image
            self._ensure(self.layout.sockets_root, [self._parent()])
            self.volumes.ensure_socket_fs(user_id)

    def check_host_write(self, user_id: int) -> None:
        """Refuse a host write for the user when the disk is short (the watermark, or the
        user over its quota in scan mode); nothing without disk quotas."""
        if self.volumes is not None:
            self.volumes.check_host_write(user_id)

    def ensure_sandbox_dirs(self, plan: MountPlan, *, sandbox_start: bool = False) -> None:
        """Every host directory of a user's mount plan exists with its owner and mode.
        `sandbox_start`: the user's sandbox is about to start (none of it runs), so its disk
        image may be made and its old directories migrated into it (docs/disk-quotas.md)."""
        self.ensure_data_root_traversable()
        if self.volumes is not None:
            # Mounted first: the owners and modes below then land on the image's directories.
            self.volumes.prepare(plan, sandbox_start=sandbox_start)
            self._ensure_socket_fs(plan.user_id)
        for mount in plan.mounts:
            purpose, path = mount.purpose, mount.host_path
            depth = len(path.relative_to(self.layout.root).parts)
            parents = [self._parent()] * (depth - 1)
            if purpose in PRIVATE_PURPOSES:
                self._ensure(path, parents + [self._private(plan.user_id)])
            elif purpose in USER_READ_ONLY_PURPOSES:
                self._ensure(path, parents + [self._user_read_only(plan.user_id)])
            elif purpose in SHARED_PURPOSES:
                self._ensure(path, parents + [self._shared()])
            elif purpose.startswith("group:"):
                self._ensure(path, parents + [self._group_workspace(mount)])
            # "agent" is deployed by AgentDeployment.
