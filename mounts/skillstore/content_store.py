"""The immutable content store `skill-views/.content/{fp}/{name}/`.

An entry is written once: the source is copied into a locked staging directory beside it
(hashing exactly the bytes written), checked against the fingerprint it will be filed under,
made read-only, and renamed into place. It is never modified afterwards; a new fingerprint is
a new directory. Each fingerprint keeps its manifest (`.content/{fp}/.manifest.json`), so a
view can be built from the store without walking anything again. The manifest is written
before the entry is renamed into place, so an entry never exists without it.

Callers hold the store lock shared (see `skill_gc`); only the GC takes it exclusively.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from mounts.skillstore.abandoned import owned_staging, remove_abandoned
from mounts.skillstore.fingerprint import ManifestError, SkillManifest
from mounts.layout import DataLayout
from mounts.log_fields import kv
from mounts.skillstore.scan import STORE_DIR_MODE, SourceChanged, copy_skill, scan_skill
from mounts.fs.atomic_write import replace_file_at
from mounts.fs.flags import DIR_FLAGS
from mounts.fs.nofollow import closing_fd
from mounts.fs.tree_removal import remove_tree

log = logging.getLogger(__name__)

SKILL_VIEWS_ROOT_MODE = 0o711  # sandboxes traverse to their own view; nobody lists the users
CONTENT_MODE = 0o700  # host only


class ContentStore:
    def __init__(self, layout: DataLayout, *, clock: Callable[[], float] = time.time) -> None:
        self.layout = layout
        self._clock = clock
        self._manifests: dict[str, SkillManifest] = {}
        self._lock = threading.Lock()

    def ensure_dirs(self) -> None:
        root = self.layout.skill_views_root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, SKILL_VIEWS_ROOT_MODE)
        self.layout.content_store.mkdir(exist_ok=True)
        os.chmod(self.layout.content_store, CONTENT_MODE)
        self.layout.skill_locks_dir.mkdir(mode=0o700, exist_ok=True)

    def has_entry(self, fingerprint: str, name: str) -> bool:
        return os.path.isdir(self.layout.content_entry(fingerprint, name))

    def ensure_entry(self, fingerprint: str, name: str, source: Path) -> Path:
        """The entry for (fp, name), copied from `source` if the store does not have it yet.

        Raises SourceChanged when the source no longer has that fingerprint, and whatever the
        copy raises (InvalidSkill, SkillVanished, OSError); the store is unchanged then.
        """
        entry = self.layout.content_entry(fingerprint, name)
        if os.path.isdir(entry):
            self.touch(fingerprint, name)
            return entry
        fp_dir = self.layout.content_fp_dir(fingerprint)
        fp_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        remove_abandoned(fp_dir)
        with owned_staging(lambda token: self.layout.content_staging(fingerprint, token)) as staging:
            try:
                manifest = copy_skill(source, staging)
                if manifest.fingerprint != fingerprint:
                    raise SourceChanged(f"skill {name} changed since it was fingerprinted")
                self._write_manifest(fingerprint, manifest)
                os.chmod(staging, STORE_DIR_MODE)
                try:
                    # Same directory, so no write permission on the moved directory is needed.
                    os.rename(staging, entry)
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                    # Another writer committed the same content first: theirs is as good.
                    remove_tree(staging)
            except BaseException:
                remove_tree(staging)
                raise
        with self._lock:
            self._manifests[fingerprint] = manifest
        log.info("stored skill content %s", kv(skill=name, fingerprint=fingerprint[:16], files=len(manifest.files)))
        return entry

    def touch(self, fingerprint: str, name: str) -> None:
        """Mark an entry used now: the GC removes only entries unused for N days."""
        now = self._clock()
        try:
            os.utime(self.layout.content_entry(fingerprint, name), (now, now))
        except FileNotFoundError:
            pass

    def manifest(self, fingerprint: str) -> SkillManifest:
        """The stored manifest of a fingerprint (cached; read and checked once)."""
        with self._lock:
            cached = self._manifests.get(fingerprint)
        if cached is not None:
            return cached
        text = self.layout.content_manifest(fingerprint).read_text()
        manifest = SkillManifest.from_json(text)
        if manifest.fingerprint != fingerprint:
            raise ManifestError(f"the manifest filed under {fingerprint} is for {manifest.fingerprint}")
        with self._lock:
            self._manifests[fingerprint] = manifest
        return manifest

    def remember(self, manifest: SkillManifest) -> None:
        """Cache a manifest known from a scan (same content as the stored one, by fingerprint)."""
        with self._lock:
            self._manifests.setdefault(manifest.fingerprint, manifest)

    def forget(self, fingerprint: str) -> None:
        with self._lock:
            self._manifests.pop(fingerprint, None)

    def verify_entry(self, fingerprint: str, name: str) -> str | None:
        """Re-hash an entry; the problem found, or None when it still has its fingerprint."""
        try:
            found = scan_skill(self.layout.content_entry(fingerprint, name)).fingerprint
        except Exception as exc:  # any failure to read it back means it is not intact
            return f"{type(exc).__name__}: {exc}"
        return None if found == fingerprint else f"content hashes to {found}"

    def _write_manifest(self, fingerprint: str, manifest: SkillManifest) -> None:
        path = self.layout.content_manifest(fingerprint)
        if path.exists():
            return
        # The temp file sits in a locked staging directory: a killed writer's is swept with it.
        with owned_staging(lambda token: self.layout.content_staging(fingerprint, token)) as tmp_dir:
            with closing_fd(os.open(tmp_dir, DIR_FLAGS)) as tmp_fd, closing_fd(os.open(path.parent, DIR_FLAGS)) as fd:
                replace_file_at(fd, path.name, manifest.to_json().encode(), mode=0o444, temp_dir_fd=tmp_fd)
            remove_tree(tmp_dir)
