"""Per-user skill views `skill-views/{uid}/{name}`, built from the content store.

Layout of one user's views (root-owned; sandboxes get the directory mounted read-only):

    skill-views/{uid}/                  0755 (the orchestrator: root:{user gid} 0750)
    skill-views/{uid}/{name}            symlink -> .v/{fp in base32}   (55 bytes: inline in the inode)
    skill-views/{uid}/.v/{fp in base32}/  dirs 0555, files hard links of the store (0444/0555)

A version is built from the stored manifest in a locked staging directory, made read-only and
renamed into place; then the view's symlink is replaced with rename(2). Readers see the old
version or the new one, never a partial tree. When a hard link fails with EXDEV, EMLINK or
EPERM the file is copied instead, and the log says why.

Callers hold the user's lock and the store lock (shared) around `ensure_view`, `remove_view`
and `clean_user`; `current` takes no lock (it is one readlink).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mounts.skillstore.abandoned import hold, remove_abandoned
from mounts.skillstore.content_store import ContentStore
from mounts.skillstore.fingerprint import SkillManifest
from mounts.layout import VIEW_VERSIONS_DIR, DataLayout, view_link_target, view_version_fingerprint
from mounts.log_fields import kv
from mounts.skillstore.scan import STORE_DIR_MODE, STORE_EXEC_MODE, STORE_FILE_MODE
from mounts.fs.atomic_write import replace_symlink_at
from mounts.fs.flags import CREATE_FLAGS, READ_FLAGS, ROOT_FLAGS
from mounts.fs.tree_removal import remove_tree
from mounts.skillstore.view_plan import (
    RETIRED_VERSION_GRACE_S,
    VersionDir,
    plan_view_build,
    retired_versions,
)

log = logging.getLogger(__name__)

USER_VIEWS_MODE = 0o755  # without a policy hook: root-owned, readable, writable by nobody else

PrepareUserDir = Callable[[int], None]
# EXDEV: store and view on different filesystems; EMLINK: the inode's link limit (65,000 on
# ext4); EPERM: a filesystem without hard links, or protected_hardlinks for a non-owner.
LINK_FALLBACK_ERRNOS = {errno.EXDEV: "EXDEV", errno.EMLINK: "EMLINK", errno.EPERM: "EPERM"}


@dataclass(frozen=True)
class ViewOutcome:
    path: Path
    fingerprint: str
    built: bool  # a new version was built (False: the view was already current)
    copied_files: int = 0
    copy_reason: str | None = None


class SkillViews:
    def __init__(
        self,
        layout: DataLayout,
        store: ContentStore,
        *,
        clock: Callable[[], float] = time.time,
        retired_grace_s: float = RETIRED_VERSION_GRACE_S,
        prepare_user_dir: PrepareUserDir | None = None,
    ) -> None:
        self.layout = layout
        self.store = store
        # Creates `skill-views/{uid}/` with the deployment's policy (the orchestrator passes
        # the one that makes it root:{the user's gid} 0750); by default plain 0755.
        self._prepare_user_dir = prepare_user_dir
        self._clock = clock
        self.retired_grace_s = retired_grace_s

    # reading ---------------------------------------------------------------------
    def current(self, user_id: int, name: str) -> str | None:
        """The fingerprint the user's view of `name` shows now, or None without a view."""
        try:
            target = os.readlink(self.layout.user_view(user_id, name))
        except OSError:
            return None
        prefix = VIEW_VERSIONS_DIR + "/"
        if not target.startswith(prefix):
            return None
        return view_version_fingerprint(target[len(prefix) :])

    def view_names(self, user_id: int) -> list[str]:
        """The skills the user has a view of (their symlinks)."""
        try:
            entries = list(os.scandir(self.layout.user_views_dir(user_id)))
        except FileNotFoundError:
            return []
        return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_symlink())

    # writing (user lock + store lock held) ------------------------------------------
    def ensure_user_dirs(self, user_id: int) -> None:
        if self._prepare_user_dir is not None:
            self._prepare_user_dir(user_id)
        else:
            self._mkdir(self.layout.user_views_dir(user_id))
        self._mkdir(self.layout.user_view_versions_dir(user_id))

    @staticmethod
    def _mkdir(path: Path) -> None:
        try:
            os.mkdir(path, USER_VIEWS_MODE)
            os.chmod(path, USER_VIEWS_MODE)  # mkdir honours the umask
        except FileExistsError:
            pass

    def ensure_view(self, user_id: int, name: str, fingerprint: str, source: Path) -> ViewOutcome:
        """Make the user's view of `name` show `fingerprint`, storing the content if needed.
        (`ensure_user_dirs` first: once per user and sync, not per skill.)"""
        link = self.layout.user_view(user_id, name)
        version = self.layout.user_view_version(user_id, fingerprint)
        if self.current(user_id, name) == fingerprint and os.path.isdir(version):
            return ViewOutcome(link, fingerprint, built=False)
        copied, reason = 0, None
        if not os.path.isdir(version):
            entry = self.store.ensure_entry(fingerprint, name, source)
            manifest = self.store.manifest(fingerprint)
            copied, reason = self._build_version(user_id, name, fingerprint, manifest, entry, version)
        else:
            self.store.touch(fingerprint, name)
        self._point_view_at(user_id, name, fingerprint)
        return ViewOutcome(link, fingerprint, built=True, copied_files=copied, copy_reason=reason)

    def remove_view(self, user_id: int, name: str) -> None:
        """Drop the view of a skill that left the system set; its version retires."""
        old = self.current(user_id, name)
        if old is not None:
            self._touch_version(user_id, old)
        try:
            os.unlink(self.layout.user_view(user_id, name))
        except FileNotFoundError:
            pass

    def clean_user(self, user_id: int) -> int:
        """Remove a killed run's leftovers and versions retired longer than the grace period."""
        removed = remove_abandoned(self.layout.user_views_dir(user_id))
        versions_dir = self.layout.user_view_versions_dir(user_id)
        removed += remove_abandoned(versions_dir)
        try:
            entries = list(os.scandir(versions_dir))
        except FileNotFoundError:
            return removed
        versions = [VersionDir(e.name, e.stat(follow_symlinks=False).st_mtime) for e in entries]
        current = self.current_version_names(user_id)
        for dir_name in retired_versions(versions, current, now=self._clock(), grace_s=self.retired_grace_s):
            fp = view_version_fingerprint(dir_name)
            assert fp is not None
            self._discard(self.layout.user_view_version(user_id, fp), user_id)
            removed += 1
        return removed

    def current_version_names(self, user_id: int) -> set[str]:
        """The version directories some view of the user points at now."""
        names = set()
        for view in self.view_names(user_id):
            fp = self.current(user_id, view)
            if fp is not None:
                names.add(self.layout.user_view_version(user_id, fp).name)
        return names

    # internals -----------------------------------------------------------------------
    def _build_version(
        self, user_id: int, name: str, fingerprint: str, manifest: SkillManifest, entry: Path, version: Path
    ) -> tuple[int, str | None]:
        plan = plan_view_build(manifest)
        executable = {e.path for e in manifest.files if e.executable}
        copied, reason, link_ok = 0, None, True
        # No per-directory lock as in the store: the user's lock keeps other builders out, and
        # the GC (store lock, exclusive) never runs while this holds the store lock shared.
        staging = self.layout.user_view_staging(user_id, secrets.token_hex(8))
        os.mkdir(staging, 0o700)
        try:
            root_fd = os.open(staging, ROOT_FLAGS)
            try:
                entry_fd = os.open(entry, ROOT_FLAGS)
                try:
                    for path in plan.dirs:
                        os.mkdir(path, 0o700, dir_fd=root_fd)
                    for path in plan.files:
                        if link_ok:
                            try:
                                os.link(path, path, src_dir_fd=entry_fd, dst_dir_fd=root_fd, follow_symlinks=False)
                                continue
                            except OSError as exc:
                                if exc.errno not in LINK_FALLBACK_ERRNOS:
                                    raise
                                reason = LINK_FALLBACK_ERRNOS[exc.errno]
                                # EMLINK is about one inode; the others hold for every file.
                                link_ok = exc.errno == errno.EMLINK
                        _copy_file(entry_fd, root_fd, path, path in executable)
                        copied += 1
                finally:
                    os.close(entry_fd)
                for path, target in plan.symlinks:
                    os.symlink(target, path, dir_fd=root_fd)
                for path in plan.dirs_bottom_up:
                    os.chmod(path, STORE_DIR_MODE, dir_fd=root_fd)
                os.fchmod(root_fd, STORE_DIR_MODE)
            finally:
                os.close(root_fd)
            # Same directory: the rename needs no write permission on the moved directory.
            os.rename(staging, version)
        except BaseException:
            remove_tree(staging)
            raise
        if copied:
            log.warning(
                "hard-linking a skill view failed; copied instead %s",
                kv(runtime_user=user_id, skill=name, fingerprint=fingerprint[:16], reason=reason, copied_files=copied),
            )
        return copied, reason

    def _point_view_at(self, user_id: int, name: str, fingerprint: str) -> None:
        link = self.layout.user_view(user_id, name)
        old = self.current(user_id, name)
        if old is not None and old != fingerprint:
            # The replaced version's grace period starts now (see clean_user).
            self._touch_version(user_id, old)
        elif old is None and os.path.lexists(link) and not os.path.islink(link):
            # Something else sits where the view goes (an older layout): set it aside.
            if os.path.isdir(link):
                self._discard(link, user_id)
            else:
                os.unlink(link)
        # Under the user's lock nobody else works here; a killed run's temporary link is
        # removed by the next clean_user.
        tmp_link = self.layout.user_view_temp_link(user_id, secrets.token_hex(8))
        replace_symlink_at(None, str(link), view_link_target(fingerprint), temp=str(tmp_link))

    def _touch_version(self, user_id: int, fingerprint: str) -> None:
        now = self._clock()
        try:
            os.utime(self.layout.user_view_version(user_id, fingerprint), (now, now))
        except FileNotFoundError:
            pass

    def _discard(self, path: Path, user_id: int) -> None:
        """Rename a tree aside (same directory, under its lock), then delete it: a killed
        deletion leaves an unlocked `.trash-*` that the next cleaner removes, never a
        half-deleted tree under a name that is still used."""
        token = secrets.token_hex(8)
        if path.parent == self.layout.user_view_versions_dir(user_id):
            trash = self.layout.user_view_trash(user_id, token)
        else:
            trash = self.layout.user_views_dir_trash(user_id, token)
        fd = hold(path)
        try:
            os.rename(path, trash)
            remove_tree(trash)
        finally:
            os.close(fd)


def _copy_file(src_dir_fd: int, dst_dir_fd: int, path: str, executable: bool) -> None:
    src = os.open(path, READ_FLAGS, dir_fd=src_dir_fd)
    try:
        dst = os.open(path, CREATE_FLAGS, 0o600, dir_fd=dst_dir_fd)
        try:
            with open(src, "rb", closefd=False) as fsrc, open(dst, "wb", closefd=False) as fdst:
                shutil.copyfileobj(fsrc, fdst, 1 << 20)
            os.fchmod(dst, STORE_EXEC_MODE if executable else STORE_FILE_MODE)
        finally:
            os.close(dst)
    finally:
        os.close(src)
