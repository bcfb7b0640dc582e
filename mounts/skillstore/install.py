"""Installing and removing a skill's source as a whole (the skills API; docs/skills.md).

A package (`mounts.skillstore.package`, already checked) is written into a locked staging directory
beside the skills (`skills/.staging-*` or `userskills/{uid}/.staging-*`), made durable, hashed
again from disk and compared with the package's manifest, and only then put in place with one
atomic rename: RENAME_NOREPLACE for a new skill, RENAME_EXCHANGE for a replacement. A reader
(the source scanner, the content store's copy) opens either the complete old tree or the
complete new one, never a half-written one and never a missing one. The replaced tree, now
under the staging name, is deleted afterwards. A removal renames the skill to a trash name
first, so it vanishes at once and whole.

Installs and removals are serialized by one flock; a process killed in the middle leaves an
unlocked `.staging-*` or `.trash-*` directory, which the next install or removal deletes
(`mounts.skillstore.abandoned`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mounts.skillstore.abandoned import owned_staging, remove_abandoned
from mounts.fs.atomic_write import fsync_dir, write_new_file_at
from mounts.fs.flags import DIR_FLAGS
from mounts.fs.lock import flocked
from mounts.fs.nofollow import closing_fd
from mounts.fs.rename_swap import put_in_place
from mounts.fs.tree_removal import remove_tree
from mounts.layout import DataLayout
from mounts.skillstore.package import SkillPackage
from mounts.skillstore.scan import InvalidSkill, SkillVanished, SourceChanged, scan_skill

SOURCE_DIR_MODE = 0o755  # host-side sources; a user's personal ones sit in their 0750 dir
SOURCE_FILE_MODE = 0o644
SOURCE_EXEC_MODE = 0o755


class SkillNotInstalled(LookupError):
    pass


@dataclass(frozen=True)
class Installed:
    name: str
    path: Path
    fingerprint: str
    previous_fingerprint: str | None  # of the tree it replaced (None: none, or not a valid skill)
    created: bool  # nothing had this name before
    changed: bool  # False: exactly this tree was installed already, nothing was written


@dataclass(frozen=True)
class Removed:
    name: str
    path: Path
    previous_fingerprint: str | None


def installed_fingerprint(path: Path) -> str | None:
    """The fingerprint of the skill at `path` as it is on disk now (None: absent or invalid)."""
    try:
        return scan_skill(path).fingerprint
    except (InvalidSkill, SkillVanished, SourceChanged, OSError):
        return None


class SkillInstaller:
    def __init__(self, layout: DataLayout, prepare_user_dir: Callable[[int], object] | None = None) -> None:
        """`prepare_user_dir` creates `userskills/{uid}/` with its owner and mode."""
        self.layout = layout
        self.prepare_user_dir = prepare_user_dir

    def _source(self, user_id: int | None, name: str) -> Path:
        if user_id is None:
            return self.layout.skill_source(name)
        return self.layout.userskill_source(user_id, name)

    def _ensure_parent(self, user_id: int | None) -> Path:
        parent = self.layout.skill_sources_dir(user_id)
        if user_id is not None and self.prepare_user_dir is not None:
            self.prepare_user_dir(user_id)
        else:
            parent.mkdir(parents=True, exist_ok=True)
        return parent

    def install(self, user_id: int | None, package: SkillPackage) -> Installed:
        """Put `package` in place as the system skill (`user_id` None) or the user's personal
        skill of its name, replacing whatever had that name."""
        target = self._source(user_id, package.name)
        fingerprint = package.manifest.fingerprint
        with flocked(self.layout.skill_sources_lock, exclusive=True):
            parent = self._ensure_parent(user_id)
            remove_abandoned(parent)
            previous = installed_fingerprint(target)
            if previous == fingerprint:
                return Installed(package.name, target, fingerprint, previous, created=False, changed=False)
            with owned_staging(lambda token: self.layout.skill_source_staging(user_id, token)) as staging:
                try:
                    _write_tree(staging, package)
                    written = scan_skill(staging).fingerprint
                    if written != fingerprint:  # the disk must hold exactly what was checked
                        raise RuntimeError(f"staged skill {package.name} hashes to {written}, expected {fingerprint}")
                    created = _place(parent, staging.name, target.name)
                except BaseException:
                    remove_tree(staging)
                    raise
                if not created:
                    remove_tree(staging)  # the replaced tree now sits under the staging name
        return Installed(package.name, target, fingerprint, previous, created=created, changed=True)

    def remove(self, user_id: int | None, name: str) -> Removed:
        target = self._source(user_id, name)
        with flocked(self.layout.skill_sources_lock, exclusive=True):
            parent = self.layout.skill_sources_dir(user_id)
            remove_abandoned(parent)
            if not os.path.lexists(target):
                raise SkillNotInstalled(name)
            previous = installed_fingerprint(target)
            trash = self.layout.skill_source_trash(user_id, secrets.token_hex(8))
            os.rename(target, trash)  # gone at once and whole; deleting may take a while
            fsync_dir(parent)
            remove_tree(trash)
        return Removed(name, target, previous)


def _place(parent: Path, staged: str, name: str) -> bool:
    """Move the staged tree to `name`; True when nothing had that name (created)."""
    with closing_fd(os.open(parent, DIR_FLAGS)) as fd:
        return put_in_place(fd, staged, name)


def _write_tree(root: Path, package: SkillPackage) -> None:
    """Write the package below the (fresh, empty, locked) directory `root`, durably: a
    replacement must not turn into an empty file after a power loss."""
    with closing_fd(os.open(root, DIR_FLAGS)) as root_fd:
        for directory in package.directories:  # parents first
            os.mkdir(directory, 0o700, dir_fd=root_fd)
        for file in package.files:
            mode = SOURCE_EXEC_MODE if file.executable else SOURCE_FILE_MODE
            write_new_file_at(root_fd, file.path, file.data, mode=mode)
        for directory in reversed(package.directories):  # children first
            with closing_fd(os.open(directory, DIR_FLAGS, dir_fd=root_fd)) as fd:
                os.fchmod(fd, SOURCE_DIR_MODE)
                os.fsync(fd)
        os.fchmod(root_fd, SOURCE_DIR_MODE)
        os.fsync(root_fd)
