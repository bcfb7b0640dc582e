"""Removing one member's files from a shared place as root: only that owner's entries go, a link
it planted is removed as a link (never followed out of the place or onto another's file), its
directories go once empty and are kept while they hold others' files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mounts.fs.nofollow import closing_fd, open_root
from orchestrator.quotas.member_files import remove_member_files
from orchestrator.quotas.scan import usage_by_owner

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="telling members apart by owner needs root (chown)")

MEMBER, OTHER = 4_100_001, 4_100_002


def owned(path: Path, uid: int, content: str | None = None, *, directory: bool = False) -> None:
    if directory:
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    os.chown(path, uid, uid, follow_symlinks=False)


def test_only_the_members_entries_go_and_no_planted_link_is_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host-file").write_text("host")
    place = tmp_path / "share"
    place.mkdir()
    owned(place / "others.txt", OTHER, "o")
    owned(place / "mine.bin", MEMBER, "m" * 5000)
    # The member's links: to the host outside the place, to another member's file, to a directory.
    for name, target in (("to-host", outside / "host-file"), ("to-other", place / "others.txt"), ("to-dir", outside)):
        os.symlink(target, place / name)
        owned(place / name, MEMBER)
    # The member's directory holding another's file (kept), another's directory holding the
    # member's file (the file goes), and the member's nested directory (goes whole).
    owned(place / "mixed", MEMBER, directory=True)
    owned(place / "mixed" / "theirs", OTHER, "t")
    owned(place / "their-dir", OTHER, directory=True)
    owned(place / "their-dir" / "mine", MEMBER, "m")
    owned(place / "deep", MEMBER, directory=True)
    owned(place / "deep" / "er", MEMBER, directory=True)
    owned(place / "deep" / "er" / "f", MEMBER, "f")

    owners, partial = usage_by_owner(tmp_path, place, max_entries=100)
    assert not partial and owners[MEMBER].inodes_used == 9 and owners[OTHER].inodes_used == 3

    with closing_fd(open_root(place)) as fd:
        removal = remove_member_files(fd, MEMBER, max_entries=100)
    assert removal.complete and removal.kept_dirs == 1
    assert removal.removed == 8  # mine.bin, three links, their-dir/mine, deep/er/f, deep/er, deep
    assert sorted(os.listdir(place)) == ["mixed", "others.txt", "their-dir"]
    assert os.listdir(place / "mixed") == ["theirs"] and os.listdir(place / "their-dir") == []
    assert (outside / "host-file").read_text() == "host" and (place / "others.txt").read_text() == "o"
    owners, _ = usage_by_owner(tmp_path, place, max_entries=100)
    assert owners[MEMBER].inodes_used == 1  # the kept directory


def test_the_removal_stops_at_its_bound(tmp_path: Path) -> None:
    place = tmp_path / "share"
    place.mkdir()
    for n in range(50):
        owned(place / f"f{n}", MEMBER, "")
    with closing_fd(open_root(place)) as fd:
        removal = remove_member_files(fd, MEMBER, max_entries=10)
    assert not removal.complete and removal.removed == 10 and len(os.listdir(place)) == 40
