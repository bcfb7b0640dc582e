"""The host data layout: the one module that joins path segments.

Every method validates the ids it is given, so no caller can build a path from an
unvalidated id even by accident. The root is absolute because sandboxes see the same
absolute paths as the host.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from mounts import ids

RUNTIME_SUBDIRS = ("skills", "shell-output", "user-messages", "incoming", "outputs")
OUTPUTS_SUBDIR = "outputs"  # in a session runtime dir: a run's results (charts, reports)
COMPACTION_SUBDIR = "compaction"  # archives are the owner's: only the owner's runtime dir has one
TOKEN_FILE = "token"  # in agent_secrets_dir
AGENT_CONFIG_FILE = "agent.json"  # in agent_secrets_dir
LEASE_FILE = "lease"  # in agent_secrets_dir: the orchestrator's lease on a docker sandbox
EGRESS_SOCKET_FILE = "egress.sock"  # in socket_dir: the orchestrator's egress proxy listens there
EGRESS_STAGING_DIR = ".egress-staging"  # in sockets_root, root-only: where it binds before the rename


@dataclass(frozen=True, order=True)
class GroupRef:
    """A group chat; its shared workspace is `groups/{channel}/{chat_id}/`."""

    channel: str
    chat_id: str

    def __post_init__(self) -> None:
        ids.name(self.channel, "group.channel")
        ids.chat_id(self.chat_id, "group.chat_id")


VIEW_VERSIONS_DIR = ".v"


def view_version_name(fingerprint: str) -> str:
    """A view version's directory name: the fingerprint in lowercase base32 (52 characters).

    Short on purpose: the view's symlink target `.v/{this}` is then 55 bytes, under the 60
    that ext4 stores inside the inode, so a view's symlink costs no data block.
    """
    raw = bytes.fromhex(ids.fingerprint(fingerprint))
    return base64.b32encode(raw).decode().lower().rstrip("=")


def view_version_fingerprint(name: str) -> str | None:
    """The fingerprint a version directory name stands for; None for anything else."""
    if len(name) != 52 or not name.isascii() or not name.isalnum() or name != name.lower():
        return None
    try:
        raw = base64.b32decode(name.upper() + "====")
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None


def view_link_target(fingerprint: str) -> str:
    """The relative target of `skill-views/{uid}/{name}`: it resolves inside the same mount."""
    return f"{VIEW_VERSIONS_DIR}/{view_version_name(fingerprint)}"


def session_dir_name(session_id: str) -> str:
    """`session-{sha256(id)}`: the stored name of a session's chat directory."""
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
    def serve_lock(self) -> Path:
        """Held (flock) by the one server on this data dir for its lifetime; holds its pid."""
        return self.state_dir / "serve.lock"

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

    def session_skills_dir(self, user_id: int, session_id: str) -> Path:
        return self.runtime_dir(user_id, session_id) / "skills"

    def session_skill_link(self, user_id: int, session_id: str, skill: str) -> Path:
        return self.session_skills_dir(user_id, session_id) / ids.name(skill, "skill")

    def shell_output_dir(self, user_id: int, session_id: str) -> Path:
        """Where the agent spools a `shell` call's output too long for its answer."""
        return self.runtime_dir(user_id, session_id) / "shell-output"

    def outputs_dir(self, user_id: int, session_id: str) -> Path:
        """A session's results (charts, reports): where run_code writes the images a kernel shows."""
        return self.runtime_dir(user_id, session_id) / OUTPUTS_SUBDIR

    def incoming_dir(self, user_id: int, session_id: str) -> Path:
        """Where files a bot uploads from the chat land for the runtime user's tools."""
        return self.runtime_dir(user_id, session_id) / "incoming"

    def user_messages_dir(self, user_id: int, session_id: str) -> Path:
        """Where `dump_user_messages` writes (readable by the same runtime user's tools)."""
        return self.runtime_dir(user_id, session_id) / "user-messages"

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

    def skill_sources_dir(self, user_id: int | None) -> Path:
        """The directory holding skill sources: `skills/` for system skills (no user),
        `userskills/{uid}/` for a user's personal skills."""
        return self.skills_root if user_id is None else self.userskills_dir(user_id)

    def skill_source_staging(self, user_id: int | None, token: str) -> Path:
        # Beside the skills it replaces (one rename away); dot-named, so never listed as one.
        return self.skill_sources_dir(user_id) / f".staging-{ids.token(token)}"

    def skill_source_trash(self, user_id: int | None, token: str) -> Path:
        return self.skill_sources_dir(user_id) / f".trash-{ids.token(token)}"

    @property
    def skill_views_root(self) -> Path:
        return self.root / "skill-views"

    @property
    def content_store(self) -> Path:
        return self.skill_views_root / ".content"

    def content_entry(self, fingerprint: str, skill: str) -> Path:
        return self.content_store / ids.fingerprint(fingerprint) / ids.name(skill, "skill")

    def content_fp_dir(self, fingerprint: str) -> Path:
        return self.content_store / ids.fingerprint(fingerprint)

    def content_manifest(self, fingerprint: str) -> Path:
        # Dot-named: never a skill name, so it cannot collide with an entry.
        return self.content_fp_dir(fingerprint) / ".manifest.json"

    def content_staging(self, fingerprint: str, token: str) -> Path:
        # Inside the fingerprint's directory, so committing is a same-directory rename.
        return self.content_fp_dir(fingerprint) / f".staging-{ids.token(token)}"

    def content_trash(self, fingerprint: str, token: str) -> Path:
        return self.content_fp_dir(fingerprint) / f".trash-{ids.token(token)}"

    def content_store_trash(self, token: str) -> Path:
        return self.content_store / f".trash-{ids.token(token)}"

    @property
    def skill_locks_dir(self) -> Path:
        return self.skill_views_root / ".locks"

    @property
    def skill_store_lock(self) -> Path:
        return self.skill_locks_dir / "store.lock"

    @property
    def skill_sources_lock(self) -> Path:
        """Held while a skill source is installed or removed through the API."""
        return self.skill_locks_dir / "sources.lock"

    def user_view_lock(self, user_id: int) -> Path:
        return self.skill_locks_dir / f"user-{ids.user_id(user_id)}.lock"

    def user_views_dir(self, user_id: int) -> Path:
        return self.skill_views_root / str(ids.user_id(user_id))

    def user_view(self, user_id: int, skill: str) -> Path:
        """The stable view path: a symlink to the view's current version directory."""
        return self.user_views_dir(user_id) / ids.name(skill, "skill")

    def user_view_versions_dir(self, user_id: int) -> Path:
        return self.user_views_dir(user_id) / VIEW_VERSIONS_DIR

    def user_view_version(self, user_id: int, fingerprint: str) -> Path:
        """One immutable version of a view, keyed by content: names with equal content share it."""
        return self.user_view_versions_dir(user_id) / view_version_name(fingerprint)

    def user_view_staging(self, user_id: int, token: str) -> Path:
        return self.user_view_versions_dir(user_id) / f".staging-{ids.token(token)}"

    def user_view_temp_link(self, user_id: int, token: str) -> Path:
        """Where a view's new symlink is made before it is renamed over the old one."""
        return self.user_views_dir(user_id) / f".staging-{ids.token(token)}"

    def user_views_dir_trash(self, user_id: int, token: str) -> Path:
        return self.user_views_dir(user_id) / f".trash-{ids.token(token)}"

    def user_view_trash(self, user_id: int, token: str) -> Path:
        return self.user_view_versions_dir(user_id) / f".trash-{ids.token(token)}"

    # shared places ------------------------------------------------------------------
    @property
    def groups_root(self) -> Path:
        return self.root / "groups"

    def group_channel_dir(self, channel: str) -> Path:
        return self.groups_root / ids.name(channel, "channel")

    def group_dir(self, group: GroupRef) -> Path:
        return self.group_channel_dir(group.channel) / ids.chat_id(group.chat_id)

    @property
    def share_dir(self) -> Path:
        return self.root / "share"

    @property
    def outbox_root(self) -> Path:
        """Host only: the bytes of outgoing deliveries (send_file / send_image)."""
        return self.root / "outbox"

    def outbox_file(self, delivery_id: str) -> Path:
        return self.outbox_root / ids.file_name(delivery_id, "delivery_id")

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

    def egress_socket_path(self, user_id: int) -> Path:
        """The user's way out (docs/egress.md): the sandbox's forwarder connects here."""
        return self.socket_dir(user_id) / EGRESS_SOCKET_FILE

    # The socket directory is the sandbox's own (its agent binds there), so it holds no file
    # the host reads: the token and the agent's config live where only root writes.
    @property
    def agent_secrets_root(self) -> Path:
        return self.root / "agent-secrets"

    def agent_secrets_dir(self, user_id: int) -> Path:
        """Root-owned, group = the user's sandbox gid, 0750: the sandbox reads, never writes."""
        return self.agent_secrets_root / str(ids.user_id(user_id))

    def token_path(self, user_id: int) -> Path:
        return self.agent_secrets_dir(user_id) / TOKEN_FILE

    def agent_config_path(self, user_id: int) -> Path:
        return self.agent_secrets_dir(user_id) / AGENT_CONFIG_FILE

    def lease_path(self, user_id: int) -> Path:
        return self.agent_secrets_dir(user_id) / LEASE_FILE

    # per-volume disk images (host only: below state/, root 0700) -------------------
    @property
    def disks_dir(self) -> Path:
        return self.state_dir / "disks"

    @property
    def disk_images_dir(self) -> Path:
        return self.disks_dir / "images"

    def disk_image(self, volume_key: str) -> Path:
        return self.disk_images_dir / f"{ids.name(volume_key, 'volume')}.img"

    def disk_image_partial(self, volume_key: str) -> Path:
        """Where a new image is made (mkfs) before it is renamed into place."""
        return self.disk_images_dir / f".partial-{ids.name(volume_key, 'volume')}.img"

    @property
    def disk_mounts_dir(self) -> Path:
        return self.disks_dir / "mnt"

    def disk_mount(self, volume_key: str) -> Path:
        """Where a volume's image is mounted; its places are bound from here to their layout paths."""
        return self.disk_mounts_dir / ids.name(volume_key, "volume")

    @property
    def disk_legacy_dir(self) -> Path:
        return self.disks_dir / "legacy"

    def disk_legacy(self, volume_key: str) -> Path:
        """Where a migrated place's old directory waits for its removal."""
        return self.disk_legacy_dir / ids.name(volume_key, "volume")
