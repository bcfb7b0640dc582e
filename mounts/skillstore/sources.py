"""The skill sources and their fingerprints, hashed once and kept until something changes.

System skills live in `skills/{name}/`, a user's personal skills in `userskills/{uid}/{name}/`.
A set is listed and hashed at first use; afterwards a change reported by the file watcher
(`invalidate_paths`) marks the affected skills dirty, and they are hashed again (eagerly in
the watcher's thread via `refresh_dirty`, or at the next use). Each set carries a generation
that changes only when a skill's fingerprint, validity or presence changed, so a warm sync
compares two integers instead of walking trees.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from mounts import ids
from mounts.skillstore.fingerprint import SkillManifest
from mounts.layout import DataLayout
from mounts.log_fields import kv
from mounts.skillstore.scan import InvalidSkill, SkillVanished, SourceChanged, list_skill_dirs, scan_skill

log = logging.getLogger(__name__)

SCAN_ATTEMPTS = 3  # a source that keeps changing while read is retried, then reported


class SkillKind(str, Enum):
    SYSTEM = "system"
    PERSONAL = "personal"


@dataclass(frozen=True)
class SkillSource:
    name: str
    kind: SkillKind
    path: Path
    manifest: SkillManifest | None  # None when the skill is invalid
    problem: str | None = None

    @property
    def fingerprint(self) -> str | None:
        return self.manifest.fingerprint if self.manifest is not None else None


@dataclass(frozen=True)
class SourceSet:
    generation: int
    skills: Mapping[str, SkillSource]
    # name -> why an entry that looks like it wanted to be a skill is not one (for admins)
    ignored: tuple[tuple[str, str], ...] = ()


@dataclass
class _SetCache:
    kind: SkillKind
    user_id: int | None
    listing_dirty: bool = True
    dirty: set[str] = field(default_factory=set)
    skills: dict[str, SkillSource] = field(default_factory=dict)
    ignored: tuple[tuple[str, str], ...] = ()
    snapshot: SourceSet | None = None


class SkillSources:
    def __init__(self, layout: DataLayout) -> None:
        self.layout = layout
        self._lock = threading.RLock()
        self._generations = itertools.count(1)
        self._system = _SetCache(SkillKind.SYSTEM, None)
        self._personal: dict[int, _SetCache] = {}
        self.scans = 0  # skills hashed so far (tests and benchmarks read it)

    # reading ------------------------------------------------------------------------
    def system(self) -> SourceSet:
        with self._lock:
            return self._current(self._system)

    def personal(self, user_id: int) -> SourceSet:
        uid = ids.user_id(user_id)
        with self._lock:
            cache = self._personal.get(uid)
            if cache is None:
                cache = self._personal[uid] = _SetCache(SkillKind.PERSONAL, uid)
            return self._current(cache)

    # invalidation -------------------------------------------------------------------
    def invalidate_paths(self, paths: Iterable[Path]) -> None:
        """Mark the skills containing these changed paths dirty (from the file watcher, which
        reports paths as it saw them; see FileWatcher(resolve=False))."""
        skills_root = self.layout.skills_root.resolve()
        userskills_root = self.layout.userskills_root.resolve()
        with self._lock:
            for raw in paths:
                # Resolve the parent only: a changed symlink must name itself, not its target.
                raw_path = Path(raw)
                path = Path(os.path.realpath(raw_path.parent)) / raw_path.name
                if path.is_relative_to(skills_root):
                    self._mark(self._system, path.relative_to(skills_root).parts)
                elif path.is_relative_to(userskills_root):
                    parts = path.relative_to(userskills_root).parts
                    if not parts:
                        self.invalidate_all()
                        continue
                    try:
                        uid = ids.user_id(int(parts[0]))
                    except (ValueError, ids.InvalidIdentifier):
                        continue
                    cache = self._personal.get(uid)
                    if cache is not None:
                        self._mark(cache, parts[1:])
                elif skills_root.is_relative_to(path) or userskills_root.is_relative_to(path):
                    self.invalidate_all()  # a parent of the sources moved or vanished

    def invalidate_skill(self, kind: SkillKind, user_id: int | None, name: str) -> None:
        with self._lock:
            cache = self._system if kind is SkillKind.SYSTEM else self._personal.get(ids.user_id(user_id))
            if cache is not None:
                self._mark(cache, (name,))

    def invalidate_all(self) -> None:
        with self._lock:
            for cache in (self._system, *self._personal.values()):
                cache.listing_dirty = True
                cache.dirty.update(cache.skills)

    def refresh_dirty(self) -> None:
        """Hash what was invalidated now, so the next sync does not pay for it."""
        with self._lock:
            for cache in (self._system, *self._personal.values()):
                if cache.listing_dirty or cache.dirty:
                    self._current(cache)

    # internals --------------------------------------------------------------------------
    @staticmethod
    def _mark(cache: _SetCache, parts: tuple[str, ...]) -> None:
        # Any change may add or remove a skill (a SKILL.md appearing, a directory renamed):
        # the listing is one scandir, so it is always redone.
        cache.listing_dirty = True
        if parts:
            cache.dirty.add(parts[0])

    def _root(self, cache: _SetCache) -> Path:
        if cache.kind is SkillKind.SYSTEM:
            return self.layout.skills_root
        assert cache.user_id is not None
        return self.layout.userskills_dir(cache.user_id)

    def _source_path(self, cache: _SetCache, name: str) -> Path:
        if cache.kind is SkillKind.SYSTEM:
            return self.layout.skill_source(name)
        assert cache.user_id is not None
        return self.layout.userskill_source(cache.user_id, name)

    def _current(self, cache: _SetCache) -> SourceSet:
        if cache.snapshot is not None and not cache.listing_dirty and not cache.dirty:
            return cache.snapshot
        changed = cache.snapshot is None
        if cache.listing_dirty:
            listing = list_skill_dirs(self._root(cache))
            if listing.ignored != cache.ignored:
                for name, why in listing.ignored:
                    log.warning("not a skill %s", kv(kind=cache.kind.value, user=cache.user_id, entry=name, reason=why))
                cache.ignored = listing.ignored
                changed = True
            names = set(listing.names)
            for gone in set(cache.skills) - names:
                del cache.skills[gone]
                changed = True
            cache.dirty |= names - set(cache.skills)
            cache.dirty &= names
            cache.listing_dirty = False
        still_dirty = set()
        for name in sorted(cache.dirty):
            source = self._scan(cache, name)
            if source is None:
                if cache.skills.pop(name, None) is not None:
                    changed = True
                continue
            if source.problem is not None and source.problem.startswith("the source kept changing"):
                still_dirty.add(name)
            if cache.skills.get(name) != source:
                cache.skills[name] = source
                changed = True
        cache.dirty = still_dirty
        if changed or cache.snapshot is None:
            cache.snapshot = SourceSet(next(self._generations), dict(cache.skills), cache.ignored)
        return cache.snapshot

    def _scan(self, cache: _SetCache, name: str) -> SkillSource | None:
        path = self._source_path(cache, name)
        problem = None
        for _ in range(SCAN_ATTEMPTS):
            self.scans += 1
            try:
                return SkillSource(name, cache.kind, path, scan_skill(path))
            except SkillVanished:
                return None
            except InvalidSkill as exc:
                problem = exc.reason
                break
            except SourceChanged:
                problem = "the source kept changing while it was read"
            except OSError as exc:
                problem = f"cannot be read: {exc.strerror or exc}"
                break
        log.warning("invalid skill %s", kv(kind=cache.kind.value, user=cache.user_id, skill=name, reason=problem))
        return SkillSource(name, cache.kind, path, None, problem)
