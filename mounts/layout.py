"""The host data layout (SPEC §2): the one module that joins path segments.

Every method validates the ids it is given, so no caller can build a path from an
unvalidated id even by accident. The root is absolute because sandboxes see the same
absolute paths as the host.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from mounts import ids

RUNTIME_SUBDIRS = ("skills", "shell-output", "user-messages", "incoming")
COMPACTION_SUBDIR = "compaction"  # D6: only the owner's runtime dir has one


@dataclass(frozen=True, order=True)
class GroupRef:
    """A group chat; its shared workspace is `groups/{channel}/{chat_id}/`."""

    channel: str
    chat_id: str

    def __post_init__(self) -> None:
        ids.name(self.channel, "group.channel")
        ids.chat_id(self.chat_id, "group.chat_id")


def session_dir_name(session_id: str) -> str:
    """`session-{sha256(id)}`: the stored name of a session's chat directory (SPEC §9)."""
    digest = hashlib.sha256(ids.session_id(session_id).encode()).hexdigest()
    return f"session-{digest}"


@dataclass(frozen=True)
class DataLayout:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(os.path.abspath(self.root)))

    # host-only state ---------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def state_db(self) -> Path:
        return self.state_dir / "orchestrator.sqlite3"

    @property
    def collaboration_db(self) -> Path:
        return self.state_dir / "collaboration.sqlite3"

    @property
    def sessions_root(self) -> Path:
        return self.root / "sessions"

    def session_chat_dir(self, owner_user_id: int, project_id: str | None, session_id: str) -> Path:
        scope = "personal" if project_id is None else f"project-{ids.project_id(project_id)}"
        actor = f"actor-{ids.user_id(owner_user_id, 'owner_user_id')}"
        return self.sessions_root / actor / scope / session_dir_name(session_id) / "chat"

    # per-user directories ------------------------------------------------------------
    @property
    def runtime_root(self) -> Path:
        return self.root / "runtime"

    def runtime_user_dir(self, user_id: int) -> Path:
        return self.runtime_root / str(ids.user_id(user_id))

    def runtime_dir(self, user_id: int, session_id: str) -> Path:
        return self.runtime_user_dir(user_id) / ids.session_id(session_id)

    def session_skill_link(self, user_id: int, session_id: str, skill: str) -> Path:
        return self.runtime_dir(user_id, session_id) / "skills" / ids.name(skill, "skill")

    @property
    def uploads_root(self) -> Path:
        return self.root / "uploads"

    def uploads_dir(self, user_id: int) -> Path:
        return self.uploads_root / str(ids.user_id(user_id))

    def upload_file(self, user_id: int, file: str) -> Path:
        return self.uploads_dir(user_id) / ids.file_name(file)

    @property
    def users_root(self) -> Path:
        return self.root / "users"

    def home_dir(self, user_id: int) -> Path:
        return self.users_root / str(ids.user_id(user_id))

    @property
    def deps_root(self) -> Path:
        return self.root / "deps"

    def deps_dir(self, user_id: int) -> Path:
        return self.deps_root / str(ids.user_id(user_id))

    @property
    def tmp_root(self) -> Path:
        return self.root / "tmp"

    def tmp_dir(self, user_id: int) -> Path:
        return self.tmp_root / str(ids.user_id(user_id))

    # skills -----------------------------------------------------------------------
    @property
    def skills_root(self) -> Path:
        return self.root / "skills"

    def skill_source(self, skill: str) -> Path:
        return self.skills_root / ids.name(skill, "skill")

    @property
    def userskills_root(self) -> Path:
        return self.root / "userskills"

    def userskills_dir(self, user_id: int) -> Path:
        return self.userskills_root / str(ids.user_id(user_id))

    def userskill_source(self, user_id: int, skill: str) -> Path:
        return self.userskills_dir(user_id) / ids.name(skill, "skill")

    @property
    def skill_views_root(self) -> Path:
        return self.root / "skill-views"

    @property
    def content_store(self) -> Path:
        return self.skill_views_root / ".content"

    def content_entry(self, fingerprint: str, skill: str) -> Path:
        return self.content_store / ids.fingerprint(fingerprint) / ids.name(skill, "skill")

    def user_views_dir(self, user_id: int) -> Path:
        return self.skill_views_root / str(ids.user_id(user_id))

    def user_view(self, user_id: int, skill: str) -> Path:
        return self.user_views_dir(user_id) / ids.name(skill, "skill")

    # shared places ------------------------------------------------------------------
    @property
    def groups_root(self) -> Path:
        return self.root / "groups"

    def group_dir(self, group: GroupRef) -> Path:
        return self.groups_root / ids.name(group.channel, "channel") / ids.chat_id(group.chat_id)

    @property
    def share_dir(self) -> Path:
        return self.root / "share"

    @property
    def agent_dir(self) -> Path:
        return self.root / "agent"

    @property
    def agent_releases_dir(self) -> Path:
        return self.agent_dir / "releases"

    def agent_release_dir(self, release_id: str) -> Path:
        """An immutable deployed agent runtime, named by the hash of its content."""
        return self.agent_releases_dir / ids.fingerprint(release_id, "release_id")

    @property
    def agent_current(self) -> Path:
        """Symlink to the release new agents start from."""
        return self.agent_dir / "current"

    @property
    def agent_build_file(self) -> Path:
        return self.agent_dir / "BUILD"

    @property
    def sockets_root(self) -> Path:
        return self.root / "sockets"

    def socket_dir(self, user_id: int) -> Path:
        return self.sockets_root / str(ids.user_id(user_id))

    def socket_path(self, user_id: int) -> Path:
        return self.socket_dir(user_id) / "agent.sock"

    def token_path(self, user_id: int) -> Path:
        return self.socket_dir(user_id) / "token"

    def agent_config_path(self, user_id: int) -> Path:
        return self.socket_dir(user_id) / "agent.json"
