"""A whole skill sent over the API, checked before anything touches the disk. Pure.

`build_package` takes the name and the files (relative path -> bytes and executable bit) and
returns a `SkillPackage` with the directories the paths imply and the manifest (and so the
fingerprint) the written tree will have, or raises `InvalidPackage` naming the offending
field. A package holds only directories and regular files: links, devices and FIFOs cannot be
expressed, so the tree it writes is always a valid skill if it has a top-level `SKILL.md`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from mounts import ids
from mounts.skillstore.fingerprint import SKILL_DOC, EntryKind, ManifestEntry, SkillManifest


class InvalidPackage(ValueError):
    """The package cannot be installed; `field` names what to fix (`files.{path}`, `files`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class PackageLimits:
    max_files: int = 1000
    max_file_bytes: int = 5 * 1024 * 1024
    max_total_bytes: int = 20 * 1024 * 1024


@dataclass(frozen=True)
class PackageFile:
    path: str
    data: bytes
    executable: bool = False


@dataclass(frozen=True)
class SkillPackage:
    name: str
    files: tuple[PackageFile, ...]  # sorted by path
    directories: tuple[str, ...]  # every parent directory, parents before children

    @cached_property
    def manifest(self) -> SkillManifest:
        entries = [ManifestEntry(d, EntryKind.DIR) for d in self.directories]
        entries += [
            ManifestEntry(
                f.path, EntryKind.FILE, executable=f.executable, sha256=hashlib.sha256(f.data).hexdigest(), size=len(f.data)
            )
            for f in self.files
        ]
        return SkillManifest.of(entries)

    @property
    def total_bytes(self) -> int:
        return sum(len(f.data) for f in self.files)


def build_package(name: str, files: Mapping[str, tuple[bytes, bool]], limits: PackageLimits) -> SkillPackage:
    """Check a skill's name and files against the path rules and the caps."""
    try:
        ids.name(name, "name")
    except ids.InvalidIdentifier as exc:
        raise InvalidPackage(exc.field, exc.message) from None
    if len(files) > limits.max_files:
        raise InvalidPackage("files", f"files: {len(files)} files, at most {limits.max_files} are allowed")
    directories: set[str] = set()
    total = 0
    checked = []
    for path in sorted(files):
        field = f"files.{path}"
        try:
            ids.relative_path(path, field)
        except ids.InvalidIdentifier as exc:
            raise InvalidPackage(exc.field, exc.message) from None
        data, executable = files[path]
        if len(data) > limits.max_file_bytes:
            raise InvalidPackage(field, f"{field}: {len(data)} bytes, at most {limits.max_file_bytes} per file")
        total += len(data)
        if total > limits.max_total_bytes:
            raise InvalidPackage("files", f"files: more than {limits.max_total_bytes} bytes in total")
        parts = path.split("/")
        directories.update("/".join(parts[:i]) for i in range(1, len(parts)))
        checked.append(PackageFile(path, bytes(data), bool(executable)))
    clash = sorted(directories & set(files))
    if clash:
        field = f"files.{clash[0]}"
        raise InvalidPackage(field, f"{field}: is a file and also the directory of other files")
    if SKILL_DOC not in files:
        raise InvalidPackage("files", f"files: a skill needs a top-level {SKILL_DOC}")
    # Parents sort before their children ("a" < "a/b"), so creating in this order works.
    return SkillPackage(name, tuple(checked), tuple(sorted(directories)))
