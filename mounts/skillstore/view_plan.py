"""Planning a user's view of a skill (pure): what to create, in which order, and which old
versions may go.

A view `skill-views/{uid}/{name}` is a symlink to `.v/{fp in base32}/`, a directory of hard
links into the content store (one per content: names with equal content share it). A new version is built in a staging directory, renamed
into place complete, and then the symlink is replaced with `rename(2)`: a reader resolves
either the old version or the new one, never a partial tree. A replaced version is kept for
a grace period, so a reader already inside it can finish.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mounts.skillstore.fingerprint import EntryKind, SkillManifest
from mounts.layout import view_version_fingerprint

# A replaced version stays this long, so a reader that resolved it before the swap finishes.
RETIRED_VERSION_GRACE_S = 600.0


@dataclass(frozen=True)
class ViewBuildPlan:
    dirs: tuple[str, ...]  # parents before children
    files: tuple[str, ...]  # hard-linked (or copied) from the store entry
    symlinks: tuple[tuple[str, str], ...]  # (path, target)

    @property
    def dirs_bottom_up(self) -> tuple[str, ...]:
        # Made read-only after their contents exist: children first.
        return tuple(reversed(self.dirs))


def plan_view_build(manifest: SkillManifest) -> ViewBuildPlan:
    # The manifest is sorted by path bytes, and "a" < "a/b" in that order, so parents come first.
    dirs, files, symlinks = [], [], []
    for entry in manifest.entries:
        if entry.kind is EntryKind.DIR:
            dirs.append(entry.path)
        elif entry.kind is EntryKind.FILE:
            files.append(entry.path)
        else:
            symlinks.append((entry.path, entry.target))
    return ViewBuildPlan(tuple(dirs), tuple(files), tuple(symlinks))


@dataclass(frozen=True)
class VersionDir:
    dir_name: str
    mtime: float  # touched when the version is replaced


def retired_versions(
    versions: Iterable[VersionDir], current: Iterable[str], *, now: float, grace_s: float = RETIRED_VERSION_GRACE_S
) -> tuple[str, ...]:
    """Version directories no view points at any more and replaced longer than `grace_s` ago."""
    in_use = set(current)
    return tuple(
        sorted(
            v.dir_name
            for v in versions
            if v.dir_name not in in_use and view_version_fingerprint(v.dir_name) is not None and now - v.mtime > grace_s
        )
    )
