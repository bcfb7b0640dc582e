"""Reading skill sources from disk: what is a skill, hashing, invalid trees, copying."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from pathlib import Path

import pytest

from mounts.skillstore.fingerprint import EntryKind
from mounts.skillstore.scan import InvalidSkill, SkillVanished, copy_skill, list_skill_dirs, scan_skill
from tests.mounts.skillstore.conftest import write_skill


def test_what_counts_as_a_skill(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    write_skill(root / "good", {})
    write_skill(root / "also_good.v2", {"x/y.txt": "y"})
    (root / "no-doc").mkdir()  # a directory without SKILL.md: not a skill, silently
    (root / ".git").mkdir()  # dot entries: skipped silently
    write_skill(root / "bad name", {})
    (root / "README.md").write_text("not a directory")
    os.symlink(root / "good", root / "linked")
    (root / "doc-is-dir").mkdir()
    (root / "doc-is-dir" / "SKILL.md").mkdir()
    listing = list_skill_dirs(root)
    assert listing.names == ("also_good.v2", "good")
    ignored = dict(listing.ignored)
    assert set(ignored) == {"bad name", "linked", "doc-is-dir"}
    assert "symlink" in ignored["linked"]
    assert list_skill_dirs(tmp_path / "missing").names == ()


def test_scan_hashes_content_exec_bits_and_symlinks(tmp_path: Path) -> None:
    skill = write_skill(tmp_path / "s", {"bin/run.sh": "#!/bin/sh\necho hi\n", "data.bin": bytes(range(256))},
                        executable=("bin/run.sh",))
    os.symlink("bin/run.sh", skill / "run")
    m = scan_skill(skill)
    by = m.by_path
    assert by["bin"].kind is EntryKind.DIR
    assert by["bin/run.sh"].executable and not by["data.bin"].executable
    assert by["data.bin"].sha256 == hashlib.sha256(bytes(range(256))).hexdigest() and by["data.bin"].size == 256
    assert by["run"].kind is EntryKind.SYMLINK and by["run"].target == "bin/run.sh"
    assert scan_skill(skill).fingerprint == m.fingerprint
    os.chmod(skill / "data.bin", 0o744)
    assert scan_skill(skill).fingerprint != m.fingerprint


def test_editing_any_file_changes_the_fingerprint(tmp_path: Path) -> None:
    skill = write_skill(tmp_path / "s", {"deep/er/file.txt": "one"})
    before = scan_skill(skill).fingerprint
    (skill / "deep/er/file.txt").write_text("two")
    assert scan_skill(skill).fingerprint != before


def test_escaping_symlink_makes_the_skill_invalid(tmp_path: Path) -> None:
    skill = write_skill(tmp_path / "s", {})
    os.symlink("../../../../etc/passwd", skill / "leak")
    with pytest.raises(InvalidSkill, match="outside"):
        scan_skill(skill)


def test_fifo_device_and_socket_make_the_skill_invalid(tmp_path: Path) -> None:
    fifo = write_skill(tmp_path / "fifo", {})
    os.mkfifo(fifo / "pipe")
    with pytest.raises(InvalidSkill, match="FIFO"):
        scan_skill(fifo)
    sock_skill = write_skill(tmp_path / "sock", {})
    # AF_UNIX paths are short: bind by a relative name from inside the directory.
    cwd = os.getcwd()
    os.chdir(sock_skill)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind("s.sock")
            with pytest.raises(InvalidSkill, match="socket"):
                scan_skill(sock_skill)
    finally:
        os.chdir(cwd)
    if os.geteuid() == 0:
        dev = write_skill(tmp_path / "dev", {})
        os.mknod(dev / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        with pytest.raises(InvalidSkill, match="character device"):
            scan_skill(dev)


def test_a_vanished_or_symlinked_root(tmp_path: Path) -> None:
    with pytest.raises(SkillVanished):
        scan_skill(tmp_path / "nope")
    real = write_skill(tmp_path / "real", {})
    os.symlink(real, tmp_path / "alias")
    with pytest.raises(InvalidSkill):
        scan_skill(tmp_path / "alias")


def test_copy_writes_the_same_tree_read_only(tmp_path: Path) -> None:
    skill = write_skill(tmp_path / "s", {"a/b.txt": "b", "run.sh": "x"}, executable=("run.sh",))
    os.symlink("a/b.txt", skill / "link")
    dest = tmp_path / "dest"
    dest.mkdir()
    copied = copy_skill(skill, dest)
    assert copied == scan_skill(skill)
    assert scan_skill(dest).fingerprint == copied.fingerprint
    assert stat.S_IMODE(os.stat(dest / "a/b.txt").st_mode) == 0o444
    assert stat.S_IMODE(os.stat(dest / "run.sh").st_mode) == 0o555
    assert stat.S_IMODE(os.stat(dest / "a").st_mode) == 0o555
    assert os.readlink(dest / "link") == "a/b.txt"
