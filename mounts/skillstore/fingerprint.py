"""Skill tree manifests and their fingerprints. Pure: values in, values out.

A manifest lists every entry of a skill tree below its root: directories, regular files (with
their executable bit, size and SHA-256) and symlinks (with their target). The fingerprint is a
SHA-256 over the sorted (relative path, type, executable bit, content hash, symlink target)
records, so two trees with the same fingerprint are interchangeable byte for byte.

A tree is invalid when a symlink could lead outside it (absolute targets, `..` above the root,
also through other symlinks of the tree) or loops; device files, FIFOs and sockets are refused
by the scanner before a manifest exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cached_property

FINGERPRINT_VERSION = b"skill-tree-v1"
SKILL_DOC = "SKILL.md"
MAX_SYMLINK_HOPS = 40  # the kernel's limit (ELOOP)


class EntryKind(str, Enum):
    DIR = "dir"
    FILE = "file"
    SYMLINK = "symlink"


def entry_kind(mode: int) -> EntryKind | None:
    """The kind of an lstat mode; None for what a skill may not contain."""
    if stat.S_ISDIR(mode):
        return EntryKind.DIR
    if stat.S_ISREG(mode):
        return EntryKind.FILE
    if stat.S_ISLNK(mode):
        return EntryKind.SYMLINK
    return None


def special_file_name(mode: int) -> str:
    """A readable name for a file type a skill may not contain."""
    for test, label in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return label
    return "special file"


class ManifestError(ValueError):
    """A manifest (or a stored manifest file) is malformed."""


def check_relative_path(path: str) -> str:
    """A clean relative path: no leading '/', no empty, '.' or '..' component, no NUL."""
    if not isinstance(path, str) or not path or "\0" in path or path.startswith("/"):
        raise ManifestError(f"not a clean relative path: {path!r}")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise ManifestError(f"not a clean relative path: {path!r}")
    return path


def _sort_key(path: str) -> bytes:
    # Byte order, so the fingerprint does not depend on how names decode.
    return os.fsencode(path)


@dataclass(frozen=True)
class ManifestEntry:
    path: str
    kind: EntryKind
    executable: bool = False
    sha256: str = ""
    size: int = 0
    target: str = ""

    def record(self) -> bytes:
        """The fingerprint record: five NUL-terminated fields (a path can never hold NUL)."""
        fields = (
            self.kind.value.encode(),
            os.fsencode(self.path),
            b"x" if self.executable else b"-",
            self.sha256.encode(),
            os.fsencode(self.target),
        )
        return b"".join(field + b"\0" for field in fields)


@dataclass(frozen=True)
class SkillManifest:
    entries: tuple[ManifestEntry, ...]

    @staticmethod
    def of(entries: Iterable[ManifestEntry]) -> SkillManifest:
        ordered = tuple(sorted(entries, key=lambda e: _sort_key(e.path)))
        for entry in ordered:
            check_relative_path(entry.path)
        paths = [e.path for e in ordered]
        if len(set(paths)) != len(paths):
            raise ManifestError("duplicate paths in manifest")
        return SkillManifest(ordered)

    @cached_property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(FINGERPRINT_VERSION + b"\0")
        for entry in self.entries:
            digest.update(entry.record())
        return digest.hexdigest()

    @cached_property
    def by_path(self) -> Mapping[str, ManifestEntry]:
        return {e.path: e for e in self.entries}

    @property
    def files(self) -> tuple[ManifestEntry, ...]:
        return tuple(e for e in self.entries if e.kind is EntryKind.FILE)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind is EntryKind.FILE)

    def to_json(self) -> str:
        rows = []
        for e in self.entries:
            row: dict[str, object] = {"path": e.path, "kind": e.kind.value}
            if e.kind is EntryKind.FILE:
                row.update(executable=e.executable, sha256=e.sha256, size=e.size)
            elif e.kind is EntryKind.SYMLINK:
                row["target"] = e.target
            rows.append(row)
        # ensure_ascii keeps undecodable names (surrogate escapes) representable.
        return json.dumps({"version": 1, "fingerprint": self.fingerprint, "entries": rows}, ensure_ascii=True)

    @staticmethod
    def from_json(text: str) -> SkillManifest:
        """Parse a stored manifest; it must reproduce the fingerprint it claims."""
        try:
            data = json.loads(text)
            entries = []
            for row in data["entries"]:
                kind = EntryKind(row["kind"])
                entries.append(
                    ManifestEntry(
                        path=str(row["path"]),
                        kind=kind,
                        executable=bool(row.get("executable", False)),
                        sha256=str(row.get("sha256", "")),
                        size=int(row.get("size", 0)),
                        target=str(row.get("target", "")),
                    )
                )
            manifest = SkillManifest.of(entries)
            claimed = data["fingerprint"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"malformed manifest: {exc}") from exc
        if manifest.fingerprint != claimed:
            raise ManifestError("manifest does not match its fingerprint")
        return manifest


def symlink_problem(tree: Mapping[str, ManifestEntry], link_path: str) -> str | None:
    """Why following the symlink at `link_path` could leave the tree, or None when it cannot.

    The link is resolved against the tree itself, component by component, the way the kernel
    would: a `..` that comes after another symlink counts from where that symlink leads, so
    `a/b/l1 -> ../l2/..` with `a/l2 -> ..` is caught. A component the tree does not have is
    treated as a plain directory (lexically), which only ever makes the check stricter.
    """
    link = tree[link_path]
    if link.target.startswith("/"):
        return f"symlink {link_path} has an absolute target"
    current = link_path.split("/")[:-1]
    # A stack of component stacks: the innermost symlink's target is walked first, then the
    # rest of the path that led to it.
    stacks = [list(reversed(link.target.split("/")))]
    hops = 0
    while stacks:
        todo = stacks[-1]
        if not todo:
            stacks.pop()
            continue
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not current:
                return f"symlink {link_path} points outside the skill"
            current.pop()
            continue
        entry = tree.get("/".join([*current, part]))
        if entry is not None and entry.kind is EntryKind.SYMLINK:
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                return f"symlink {link_path} loops"
            if entry.target.startswith("/"):
                return f"symlink {link_path} leads through an absolute symlink"
            stacks.append(list(reversed(entry.target.split("/"))))
            continue
        current.append(part)
    return None


def manifest_problems(manifest: SkillManifest) -> list[str]:
    """Every reason this tree is not a usable skill (empty when it is)."""
    problems = []
    doc = manifest.by_path.get(SKILL_DOC)
    if doc is None or doc.kind is not EntryKind.FILE:
        problems.append(f"{SKILL_DOC} is missing or not a regular file")
    for entry in manifest.entries:
        if entry.kind is EntryKind.SYMLINK:
            problem = symlink_problem(manifest.by_path, entry.path)
            if problem is not None:
                problems.append(problem)
    return problems
