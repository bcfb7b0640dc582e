"""mounts/fs/atomic_write.py: readers see the old or the new file, never a half one; owner and
mode set on the descriptor; a planted entry is refused, and a failed write leaves nothing."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from mounts.fs.atomic_write import TEMP_SUFFIX, replace_file_at, replace_symlink_at, write_new_file_at
from mounts.fs.nofollow import UnsafePath, closing_fd, open_root


def test_replace_gives_the_mode_and_owner_and_leaves_no_temp_file(tmp_path: Path) -> None:
    owner = (os.geteuid(), os.getegid()) if os.geteuid() != 0 else (12345, 12346)
    with closing_fd(open_root(tmp_path)) as fd:
        replace_file_at(fd, "a.json", b"one")
        replace_file_at(fd, "b.txt", b"two", mode=0o644, owner=owner)
        replace_file_at(fd, "a.json", b"three")
    assert (tmp_path / "a.json").read_bytes() == b"three"
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o600
    info = (tmp_path / "b.txt").stat()
    assert stat.S_IMODE(info.st_mode) == 0o644 and (info.st_uid, info.st_gid) == owner
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.txt"]


@pytest.mark.parametrize("planted", ["symlink", "fifo", "directory"])
def test_a_planted_entry_is_refused_and_left_alone(tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    target = tmp_path / "records.json"
    if planted == "symlink":
        target.symlink_to(victim)
    elif planted == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    with closing_fd(open_root(tmp_path)) as fd, pytest.raises(UnsafePath, match=f"found a {planted}|found a FIFO"):
        replace_file_at(fd, "records.json", b"new")
    assert victim.read_bytes() == b"keep"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(TEMP_SUFFIX)]


def test_a_failed_write_removes_its_temp_file(tmp_path: Path) -> None:
    with closing_fd(open_root(tmp_path)) as fd, pytest.raises(TypeError):
        replace_file_at(fd, "x", "not bytes")  # type: ignore[arg-type] - fails after the temp file exists
    assert list(tmp_path.iterdir()) == []


def test_the_temp_file_can_live_in_another_directory(tmp_path: Path) -> None:
    (tmp_path / "staging").mkdir()
    with closing_fd(open_root(tmp_path)) as fd, closing_fd(open_root(tmp_path / "staging")) as temp_fd:
        replace_file_at(fd, "manifest", b"m", mode=0o444, temp_dir_fd=temp_fd)
    assert (tmp_path / "manifest").read_bytes() == b"m"
    assert list((tmp_path / "staging").iterdir()) == []


def test_write_new_never_writes_through_an_existing_name(tmp_path: Path) -> None:
    (tmp_path / "victim").write_bytes(b"keep")
    (tmp_path / "new").symlink_to(tmp_path / "victim")
    with closing_fd(open_root(tmp_path)) as fd, pytest.raises(FileExistsError):
        write_new_file_at(fd, "new", b"evil")
    assert (tmp_path / "victim").read_bytes() == b"keep"


def test_readers_see_the_old_or_the_new_content_never_a_part(tmp_path: Path) -> None:
    old, new = b"a" * 300_000, b"b" * 300_000
    (tmp_path / "f").write_bytes(old)
    seen: set[bytes] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            data = (tmp_path / "f").read_bytes()
            seen.add(data if data in (old, new) else b"a part")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        with closing_fd(open_root(tmp_path)) as fd:
            for i in range(30):
                replace_file_at(fd, "f", new if i % 2 == 0 else old)
    finally:
        stop.set()
        reader.join()
    assert seen <= {old, new}


def test_replace_symlink_swaps_in_one_step_and_cleans_up_over_a_directory(tmp_path: Path) -> None:
    with closing_fd(open_root(tmp_path)) as fd:
        replace_symlink_at(fd, "current", "releases/1", temp=".current-1")
        replace_symlink_at(fd, "current", "releases/2", temp=".current-2")
        assert os.readlink(tmp_path / "current") == "releases/2"
        (tmp_path / "made-by-sandbox").mkdir()
        with pytest.raises(OSError):
            replace_symlink_at(fd, "made-by-sandbox", "elsewhere", temp=".link-3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "made-by-sandbox"]
