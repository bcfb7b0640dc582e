"""Reading skill sources from disk: which directories are skills, and their manifests.

The walk works on directory file descriptors and never follows a symlink (`O_NOFOLLOW`, and
each opened object is checked against its `lstat`), so a source that changes during the walk
cannot make it read outside the skill. `copy_skill` writes the tree it reads into a staging
directory in the same pass, hashing exactly the bytes it writes: the copy's manifest is the
truth about the copy, whatever the source did meanwhile.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from mounts import ids
from mounts.fs.flags import CREATE_FLAGS, DIR_FLAGS, READ_FLAGS
from mounts.skillstore.fingerprint import (
    SKILL_DOC,
    EntryKind,
    ManifestEntry,
    SkillManifest,
    entry_kind,
    manifest_problems,
    special_file_name,
)

CHUNK = 1 << 20
STORE_FILE_MODE = 0o444
STORE_EXEC_MODE = 0o555
STORE_DIR_MODE = 0o555


class InvalidSkill(Exception):
    """The tree is not a usable skill (an escaping symlink, a device, a FIFO, ...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SkillVanished(Exception):
    """The skill's source disappeared while it was being read."""


class SourceChanged(Exception):
    """The source changed while it was being read or copied; a later scan will settle it."""


@dataclass(frozen=True)
class SkillListing:
    names: tuple[str, ...]
    # name -> why an entry that looks like it wanted to be a skill is not one
    ignored: tuple[tuple[str, str], ...] = ()


def list_skill_dirs(root: Path) -> SkillListing:
    """The skills under `root`: real directories with a valid name holding a regular SKILL.md.

    Dot-entries are skipped silently; other entries that are not skills are reported in
    `ignored` (the caller logs them) so an admin sees why a skill does not show up.
    """
    names, ignored = [], []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return SkillListing(())
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            continue
        try:
            ids.name(name, "skill")
        except ids.InvalidIdentifier:
            ignored.append((name, "not a valid skill name (1-64 of A-Z a-z 0-9 . _ -)"))
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                if entry.is_symlink():
                    ignored.append((name, "a skill directory may not be a symlink"))
                continue
            doc = os.lstat(os.path.join(entry.path, SKILL_DOC))
        except FileNotFoundError:
            continue  # a directory without SKILL.md is not a skill
        except OSError as exc:
            ignored.append((name, f"cannot be read: {exc.strerror}"))
            continue
        if not stat.S_ISREG(doc.st_mode):
            ignored.append((name, f"{SKILL_DOC} is not a regular file"))
            continue
        names.append(name)
    return SkillListing(tuple(sorted(names)), tuple(sorted(ignored)))


class _Writer:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]


def _open_dir(name: str, dir_fd: int | None, expected: os.stat_result | None) -> int:
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    if expected is not None and not os.path.samestat(expected, os.fstat(fd)):
        os.close(fd)
        raise SourceChanged(f"{name} was replaced during the scan")
    return fd


def _hash_file(name: str, dir_fd: int, expected: os.stat_result, copy_to: _Writer | None) -> tuple[str, int]:
    # READ_FLAGS carry O_NONBLOCK: if the file was swapped for a FIFO after lstat, open must not hang.
    fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not os.path.samestat(expected, st):
            raise SourceChanged(f"{name} was replaced during the scan")
        digest = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if copy_to is not None:
                copy_to.write(chunk)
        return digest.hexdigest(), size
    finally:
        os.close(fd)


def _walk(dir_fd: int, prefix: str, out: list[ManifestEntry], dest_fd: int | None) -> None:
    with os.scandir(dir_fd) as it:
        children = sorted(entry.name for entry in it)
    for name in children:
        rel = prefix + name
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError as exc:
            raise SourceChanged(f"{rel} vanished during the scan") from exc
        kind = entry_kind(st.st_mode)
        if kind is None:
            raise InvalidSkill(f"{rel} is a {special_file_name(st.st_mode)}; skills may not contain one")
        if kind is EntryKind.DIR:
            out.append(ManifestEntry(rel, EntryKind.DIR))
            child = _open_dir(name, dir_fd, st)
            child_dest = None
            try:
                if dest_fd is not None:
                    os.mkdir(name, 0o700, dir_fd=dest_fd)
                    child_dest = _open_dir(name, dest_fd, None)
                _walk(child, rel + "/", out, child_dest)
                if child_dest is not None:
                    os.fchmod(child_dest, STORE_DIR_MODE)
            finally:
                os.close(child)
                if child_dest is not None:
                    os.close(child_dest)
        elif kind is EntryKind.FILE:
            executable = bool(st.st_mode & 0o111)
            writer = None
            if dest_fd is not None:
                out_fd = os.open(name, CREATE_FLAGS, 0o600, dir_fd=dest_fd)
                writer = _Writer(out_fd)
            try:
                sha, size = _hash_file(name, dir_fd, st, writer)
                if writer is not None:
                    os.fchmod(writer.fd, STORE_EXEC_MODE if executable else STORE_FILE_MODE)
            finally:
                if writer is not None:
                    os.close(writer.fd)
            out.append(ManifestEntry(rel, EntryKind.FILE, executable=executable, sha256=sha, size=size))
        else:
            try:
                target = os.readlink(name, dir_fd=dir_fd)
            except FileNotFoundError as exc:
                raise SourceChanged(f"{rel} vanished during the scan") from exc
            if dest_fd is not None:
                os.symlink(target, name, dir_fd=dest_fd)
            out.append(ManifestEntry(rel, EntryKind.SYMLINK, target=target))


def _read_tree(source: Path, dest: Path | None) -> SkillManifest:
    try:
        root_fd = _open_dir(str(source), None, None)
    except FileNotFoundError as exc:
        raise SkillVanished(f"{source} does not exist") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # ELOOP: the root is a symlink
            raise InvalidSkill(f"{source.name} is not a directory") from exc
        raise
    dest_fd = None
    try:
        if dest is not None:
            dest_fd = _open_dir(str(dest), None, None)
        entries: list[ManifestEntry] = []
        _walk(root_fd, "", entries, dest_fd)
        manifest = SkillManifest.of(entries)
    finally:
        os.close(root_fd)
        if dest_fd is not None:
            os.close(dest_fd)
    problems = manifest_problems(manifest)
    if problems:
        raise InvalidSkill("; ".join(problems))
    return manifest


def scan_skill(source: Path) -> SkillManifest:
    """Hash a skill's source tree. Raises InvalidSkill, SkillVanished or SourceChanged."""
    return _read_tree(source, None)


def copy_skill(source: Path, dest: Path) -> SkillManifest:
    """Copy a source tree into the existing, empty directory `dest`, with store modes
    (files 0444, or 0555 when executable; subdirectories 0555; `dest` itself is left for the
    caller). Returns the manifest of what was written."""
    return _read_tree(source, dest)
