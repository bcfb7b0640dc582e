"""Garbage collection of the content store (`orchestrator gc` and a periodic task).

Safe against a concurrent materialization by a lock and a grace period: materializers hold
the store lock shared for as long as they create entries, build versions and swap views;
the GC takes it exclusively only to decide and to rename what goes into locked trash
directories, then deletes outside the lock. An entry is never deleted in place, so a killed GC
leaves either an intact entry or an unlocked `.trash-*` the next run removes — never a
half-deleted entry under its name. Existing hard links keep their data.

Also removed: leftovers of killed runs (staging and trash directories nobody holds) and view
versions replaced longer ago than their grace period.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mounts import ids
from mounts.skillstore.abandoned import hold, remove_abandoned
from mounts.skillstore.content_store import ContentStore
from mounts.fs.lock import flocked
from mounts.skillstore.gc_plan import GC_GRACE_S, StoreEntry, plan_gc
from mounts.layout import DataLayout
from mounts.log_fields import kv
from mounts.skillstore.views import SkillViews
from mounts.fs.tree_removal import remove_tree
from mounts.layout import view_version_fingerprint
from mounts.skillstore.view_plan import VersionDir, retired_versions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcReport:
    removed: tuple[tuple[str, str], ...]  # (fingerprint, name)
    kept_referenced: int
    kept_recent: int
    freed_bytes: int
    leftovers_removed: int
    retired_versions_removed: int
    corrupt: tuple[tuple[str, str], ...] = ()
    dry_run: bool = False

    def summary(self) -> str:
        return kv(
            removed=len(self.removed),
            kept_referenced=self.kept_referenced,
            kept_recent=self.kept_recent,
            freed_bytes=self.freed_bytes,
            leftovers_removed=self.leftovers_removed,
            retired_versions_removed=self.retired_versions_removed,
            corrupt=len(self.corrupt),
            dry_run=self.dry_run,
        )


@dataclass
class _Trash:
    """Trees renamed aside under the exclusive lock, deleted after it is released."""

    held: list[tuple[int, Path]] = field(default_factory=list)

    def take(self, path: Path, trash_path: Path) -> None:
        fd = hold(path)
        try:
            os.rename(path, trash_path)
        except BaseException:
            os.close(fd)
            raise
        self.held.append((fd, trash_path))

    def empty(self) -> None:
        for fd, path in self.held:
            try:
                remove_tree(path)
            finally:
                os.close(fd)
        self.held.clear()


def _user_ids(layout: DataLayout) -> list[int]:
    users = []
    try:
        names = os.listdir(layout.skill_views_root)
    except FileNotFoundError:
        return []
    for name in names:
        if name.isdigit():
            try:
                users.append(ids.user_id(int(name)))
            except ids.InvalidIdentifier:
                continue
    return sorted(users)


def _fingerprints(layout: DataLayout) -> list[str]:
    try:
        names = os.listdir(layout.content_store)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        try:
            found.append(ids.fingerprint(name))
        except ids.InvalidIdentifier:
            continue
    return sorted(found)


def _entries(layout: DataLayout) -> list[StoreEntry]:
    entries = []
    for fp in _fingerprints(layout):
        try:
            names = os.listdir(layout.content_fp_dir(fp))
        except FileNotFoundError:
            continue
        for name in names:
            if name.startswith("."):
                continue
            try:
                st = os.lstat(layout.content_entry(fp, name))
            except (FileNotFoundError, ids.InvalidIdentifier):
                continue
            entries.append(StoreEntry(fp, name, st.st_mtime))
    return entries


def _versions(layout: DataLayout, uid: int) -> list[VersionDir]:
    try:
        with os.scandir(layout.user_view_versions_dir(uid)) as it:
            return [VersionDir(e.name, e.stat(follow_symlinks=False).st_mtime) for e in it]
    except FileNotFoundError:
        return []


class SkillStoreGc:
    def __init__(self, layout: DataLayout, store: ContentStore, views: SkillViews) -> None:
        self.layout = layout
        self.store = store
        self.views = views

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        with flocked(self.layout.skill_store_lock, exclusive=True):
            yield

    def collect(
        self,
        *,
        max_age_s: float,
        now: float | None = None,
        grace_s: float = GC_GRACE_S,
        dry_run: bool = False,
        verify: bool = False,
    ) -> GcReport:
        now = time.time() if now is None else now
        self.store.ensure_dirs()
        corrupt: list[tuple[str, str]] = []
        if verify:
            # Hashing the whole store takes a while: done without the lock; entries are
            # immutable, and one that vanished meanwhile is simply skipped below.
            for entry in _entries(self.layout):
                if self.store.verify_entry(entry.fingerprint, entry.name) is not None:
                    corrupt.append((entry.fingerprint, entry.name))
        trash = _Trash()
        leftovers = retired = 0
        freed = 0
        with self._exclusive():
            users = _user_ids(self.layout)
            if not dry_run:
                leftovers += remove_abandoned(self.layout.content_store)
                for fp in _fingerprints(self.layout):
                    leftovers += remove_abandoned(self.layout.content_fp_dir(fp))
                for uid in users:
                    leftovers += remove_abandoned(self.layout.user_views_dir(uid))
                    leftovers += remove_abandoned(self.layout.user_view_versions_dir(uid))
            referenced: set[str] = set()
            corrupt_fps = {fp for fp, _ in corrupt}
            for uid in users:
                current = self.views.current_version_names(uid)
                versions = _versions(self.layout, uid)
                going = set(retired_versions(versions, current, now=now, grace_s=self.views.retired_grace_s))
                for version in versions:
                    fp = view_version_fingerprint(version.dir_name)
                    if fp is None:
                        continue
                    if version.dir_name in going or fp in corrupt_fps:
                        # Retired past its grace, or made of a corrupt entry's hard links (a
                        # current one is set aside too: the next sync rebuilds it from source).
                        retired += version.dir_name in going
                        if not dry_run:
                            path = self.layout.user_view_version(uid, fp)
                            trash.take(path, self.layout.user_view_trash(uid, secrets.token_hex(8)))
                        continue
                    referenced.add(fp)
            plan = plan_gc(_entries(self.layout), referenced, now=now, max_age_s=max_age_s, grace_s=grace_s)
            going_entries = {(e.fingerprint, e.name) for e in plan.remove} | set(corrupt)
            for fp, name in sorted(going_entries):
                try:
                    freed += self.store.manifest(fp).total_bytes
                except (OSError, ValueError):
                    pass
                if not dry_run:
                    try:
                        entry_trash = self.layout.content_trash(fp, secrets.token_hex(8))
                        trash.take(self.layout.content_entry(fp, name), entry_trash)
                    except FileNotFoundError:
                        continue
        trash.empty()
        if not dry_run:
            self._remove_empty_fingerprints({fp for fp, _ in going_entries})
        report = GcReport(
            removed=tuple(sorted(going_entries - set(corrupt))),
            kept_referenced=plan.kept_referenced,
            kept_recent=plan.kept_recent,
            freed_bytes=freed,
            leftovers_removed=leftovers,
            retired_versions_removed=retired,
            corrupt=tuple(sorted(corrupt)),
            dry_run=dry_run,
        )
        log.info("skill store GC %s", report.summary())
        return report

    def _remove_empty_fingerprints(self, fingerprints: set[str]) -> None:
        """Drop `.content/{fp}` (and its manifest) once no entry is left in it."""
        if not fingerprints:
            return
        trash = _Trash()
        with self._exclusive():
            for fp in sorted(fingerprints):
                fp_dir = self.layout.content_fp_dir(fp)
                try:
                    names = os.listdir(fp_dir)
                except FileNotFoundError:
                    continue
                if any(not n.startswith(".") for n in names):
                    continue  # a materializer stored a new name meanwhile
                if any(n.startswith((".staging-", ".trash-")) for n in names):
                    continue  # someone is still at work in it; the next GC will see
                trash.take(fp_dir, self.layout.content_store_trash(secrets.token_hex(8)))
                self.store.forget(fp)
        trash.empty()
