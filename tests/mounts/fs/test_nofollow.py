"""mounts/fs/nofollow.py: no symlink is ever followed below the root; modes from creation."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from mounts.fs.atomic_write import replace_file_at
from mounts.fs.nofollow import UnsafePath, closing_fd, open_dirs, open_root, read_file_at
from mounts.fs.tree_removal import remove_tree_at

REPO = Path(__file__).resolve().parents[3]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
def test_directories_and_files_have_exact_modes_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        with closing_fd(open_root(tmp_path)) as root:
            fd = open_dirs(root, ["a", "b", "c"], create=True)
            assert fd is not None
            with closing_fd(fd):
                replace_file_at(fd, "f.json", b"{}")
    finally:
        os.umask(old)
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3
    assert mode(tmp_path / "a/b/c/f.json") == 0o600
    assert sorted(os.listdir(tmp_path / "a/b/c")) == ["f.json"]  # no temp file left behind


@pytest.mark.parametrize("planted_at", [0, 1, 2])
def test_a_symlinked_component_is_refused_and_nothing_is_created_behind_it(tmp_path: Path, planted_at: int) -> None:
    root, victim = tmp_path / "root", tmp_path / "victim"
    root.mkdir()
    victim.mkdir()
    parts = ["a", "b", "c"]
    real = root.joinpath(*parts[:planted_at])
    real.mkdir(parents=True, exist_ok=True)
    (real / parts[planted_at]).symlink_to(victim, target_is_directory=True)
    with closing_fd(open_root(root)) as fd:
        for create in (False, True):
            with pytest.raises(UnsafePath) as info:
                open_dirs(fd, parts, create=create)
            assert info.value.component == parts[planted_at]
            assert "symlink" in info.value.reason
    assert list(victim.iterdir()) == []


def test_reads_refuse_symlinks_fifos_directories_and_hard_links(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not yours")
    (tmp_path / "link").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    os.link(secret, tmp_path / "hard")
    (tmp_path / "ok").write_bytes(b"fine")
    with closing_fd(open_root(tmp_path)) as fd:
        for name, word in [("link", "symlink"), ("fifo", "FIFO"), ("dir", "directory"), ("hard", "hard links")]:
            with pytest.raises(UnsafePath) as info:
                read_file_at(fd, name)
            assert word in info.value.reason, name
        assert read_file_at(fd, "missing") is None
        assert read_file_at(fd, "ok") == b"fine"


def test_replacing_a_planted_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("keep")
    (tmp_path / "messages.json").symlink_to(secret)
    with closing_fd(open_root(tmp_path)) as fd, pytest.raises(UnsafePath):
        replace_file_at(fd, "messages.json", b"overwritten")
    assert secret.read_text() == "keep"
    assert (tmp_path / "messages.json").is_symlink()


def test_readers_never_see_a_half_written_file(tmp_path: Path) -> None:
    versions = [b"a" * 300_000, b"b" * 500_000]
    with closing_fd(open_root(tmp_path)) as fd:
        replace_file_at(fd, "f", versions[0])
        stop = threading.Event()

        def writer() -> None:
            i = 0
            while not stop.is_set():
                replace_file_at(fd, "f", versions[i % 2])
                i += 1

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            seen = {read_file_at(fd, "f") for _ in range(300)}
        finally:
            stop.set()
            thread.join()
    assert seen <= set(versions)


def build_hostile_tree(top: Path, victim: Path) -> None:
    (top / "skills").mkdir(parents=True)
    (top / "skills" / "web").symlink_to(victim, target_is_directory=True)
    (top / "to-file").symlink_to(victim / "precious")
    (top / "loop").symlink_to(top / "loop")
    os.mkfifo(top / "fifo")
    for i in range(50):
        (top / f"f{i}").write_text("x")
    deep = top
    for _ in range(150):  # deeper than the removal's fd bound (64)
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "bottom").write_text("y")


def test_remove_tree_removes_everything_and_follows_nothing(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    top = tmp_path / "root" / "sid"
    build_hostile_tree(top, victim)
    with closing_fd(open_root(tmp_path / "root")) as fd:
        removed = remove_tree_at(fd, "sid")
        assert remove_tree_at(fd, "sid") == 0  # idempotent
    assert not top.exists()
    assert removed > 200
    assert (victim / "precious").read_text() == "keep"


def test_remove_tree_of_a_symlink_removes_only_the_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    (tmp_path / "sid").symlink_to(victim, target_is_directory=True)
    with closing_fd(open_root(tmp_path)) as fd:
        assert remove_tree_at(fd, "sid") == 1
    assert (victim / "precious").read_text() == "keep"


NON_ROOT_REMOVAL = """
import os, sys
sys.path.insert(0, sys.argv[1])
from mounts.fs.nofollow import closing_fd, open_root
from mounts.fs.tree_removal import remove_tree_at
base = sys.argv[2]
top = os.path.join(base, "sid")
os.makedirs(os.path.join(top, "locked", "inner"))
open(os.path.join(top, "locked", "inner", "f"), "w").close()
os.makedirs(os.path.join(top, "readonly"))
open(os.path.join(top, "readonly", "g"), "w").close()
os.chmod(os.path.join(top, "locked", "inner"), 0o000)
os.chmod(os.path.join(top, "locked"), 0o300)
os.chmod(os.path.join(top, "readonly"), 0o500)
with closing_fd(open_root(base)) as fd:
    remove_tree_at(fd, "sid")
print("gone" if not os.path.exists(top) else "still there")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged uid")
def test_remove_tree_as_an_unprivileged_owner_unlocks_what_a_sandbox_locked() -> None:
    python = next(p for p in ("/usr/bin/python3.11", "/usr/bin/python3") if os.access(p, os.X_OK))
    base = tempfile.mkdtemp(prefix="nofollow-")
    lib = tempfile.mkdtemp(prefix="nofollow-lib-")
    try:
        # The toolkit is stdlib-only: a world-readable copy works wherever the checkout lives.
        copy = Path(lib) / "mounts" / "fs"
        copy.mkdir(parents=True)
        for module in ("flags.py", "nofollow.py", "tree_removal.py"):
            shutil.copy(REPO / "mounts" / "fs" / module, copy)
        for package in (copy.parent, copy):
            (package / "__init__.py").touch()
        for path in [Path(lib), *Path(lib).rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        os.chown(base, 65534, 65534)
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c",
             NON_ROOT_REMOVAL, lib, base],
            capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "gone"
    finally:
        shutil.rmtree(base)
        shutil.rmtree(lib)
