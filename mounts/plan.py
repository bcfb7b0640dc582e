"""The per-user mount plan: one object feeds both the sandbox's mounts and the
PathSandbox's allowed roots.

Pure and deterministic: the same layout, user and groups always give the same plan and
the same hash. A plan holds only that user's directories, the shared places, and the
read-only agent code; nothing of another user and nothing host-only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from enum import Enum
from pathlib import Path

from mounts import ids
from mounts.layout import DataLayout, GroupRef

SANDBOX_TMP = Path("/tmp")


class Access(str, Enum):
    READ_ONLY = "ro"
    READ_WRITE = "rw"


@dataclass(frozen=True, order=True)
class Mount:
    sandbox_path: Path
    host_path: Path
    access: Access
    purpose: str
    # The agent's socket directory and its secrets directory are mounted for the agent (to
    # listen, to read its token and config), but they are not places for tools.
    tool_visible: bool = True
    # A group workspace's own gid: the directory is root:<gid> 2770 and only members' sandboxes
    # carry that gid, so no other sandbox uid can enter it (None for every other mount).
    gid: int | None = None


@dataclass(frozen=True)
class AllowedRoot:
    path: Path
    access: Access
    purpose: str

    @property
    def writable(self) -> bool:
        return self.access is Access.READ_WRITE


@dataclass(frozen=True)
class MountPlan:
    user_id: int
    mounts: tuple[Mount, ...]

    @cached_property  # asked on every tool call (a backend's staleness check); plans are frozen
    def plan_hash(self) -> str:
        canonical = json.dumps(
            {
                "user_id": self.user_id,
                "mounts": [
                    # The gid only where there is one, so plans without groups keep their hash.
                    [str(m.sandbox_path), str(m.host_path), m.access.value, m.purpose, m.tool_visible]
                    + ([m.gid] if m.gid is not None else [])
                    for m in self.mounts
                ],
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    def mount(self, purpose: str) -> Mount:
        for m in self.mounts:
            if m.purpose == purpose:
                return m
        raise KeyError(purpose)

    @property
    def group_gids(self) -> tuple[int, ...]:
        """The supplementary gids the sandbox needs: one per group workspace it mounts."""
        return tuple(sorted({m.gid for m in self.mounts if m.gid is not None}))

    def allowed_roots(self, *, in_sandbox: bool = True) -> tuple[AllowedRoot, ...]:
        """The PathSandbox's roots: sandbox paths inside a container (or a mount namespace),
        host paths where the agent runs directly on the host (the plain process backend)."""
        return tuple(
            AllowedRoot(m.sandbox_path if in_sandbox else m.host_path, m.access, m.purpose)
            for m in self.mounts
            if m.tool_visible
        )


def plan_mounts(
    layout: DataLayout,
    user_id: int,
    groups: Iterable[GroupRef] = (),
    group_gids: Mapping[GroupRef, int] | None = None,
) -> MountPlan:
    """`group_gids` gives each group workspace its own gid (orchestrator/users/group_gids.py); a
    group without one is planned without, which only a non-root orchestrator can run."""
    uid = ids.user_id(user_id)
    gids = group_gids or {}
    rw, ro = Access.READ_WRITE, Access.READ_ONLY

    def same(path: Path, access: Access, purpose: str, tool_visible: bool = True) -> Mount:
        return Mount(path, path, access, purpose, tool_visible)

    mounts = [
        same(layout.runtime_user_dir(uid), rw, "runtime"),
        same(layout.uploads_dir(uid), rw, "uploads"),
        same(layout.home_dir(uid), rw, "home"),
        same(layout.deps_dir(uid), rw, "deps"),
        Mount(SANDBOX_TMP, layout.tmp_dir(uid), rw, "tmp"),
        same(layout.user_views_dir(uid), ro, "skill_views"),
        same(layout.userskills_dir(uid), ro, "userskills"),
        same(layout.share_dir, rw, "share"),
        same(layout.agent_dir, ro, "agent", tool_visible=False),
        same(layout.socket_dir(uid), rw, "socket", tool_visible=False),
        # The token and the agent's config: read-only, so the sandbox cannot make the host
        # (root) read anything else through them.
        same(layout.agent_secrets_dir(uid), ro, "agent_secrets", tool_visible=False),
    ]
    for group in sorted(set(groups)):
        path = layout.group_dir(group)
        mounts.append(Mount(path, path, rw, f"group:{group.channel}/{group.chat_id}", gid=gids.get(group)))
    return MountPlan(user_id=uid, mounts=tuple(sorted(mounts)))
