"""Installing and removing skill sources as a whole: real directories, real renames, a reader
racing the swaps, and `kill -9` in the middle of installs."""

from __future__ import annotations

import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mounts.skillstore.abandoned import owned_staging
from mounts.layout import DataLayout
from mounts.skillstore.install import SkillInstaller, SkillNotInstalled, installed_fingerprint
from mounts.skillstore.package import PackageLimits, SkillPackage, build_package
from mounts.skillstore.scan import list_skill_dirs, scan_skill

FILES = 60
LIMITS = PackageLimits(max_files=5000, max_file_bytes=1 << 20, max_total_bytes=64 << 20)


def version(name: str, number: int, files: int = FILES) -> SkillPackage:
    content = {"SKILL.md": (f"v{number}\n".encode(), False)}
    for k in range(files):
        content[f"part{k % 3}/f{k:03}.txt"] = (f"v{number} file {k}\n".encode() + b"." * 800, k % 7 == 0)
    return build_package(name, content, LIMITS)


def leftovers(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith((".staging-", ".trash-")))


@pytest.fixture
def layout(tmp_path: Path) -> DataLayout:
    return DataLayout(tmp_path / "data")


def test_install_writes_the_whole_tree_with_source_modes(layout: DataLayout) -> None:
    package = version("pdf", 1, files=8)
    result = SkillInstaller(layout).install(None, package)
    target = layout.skill_source("pdf")
    assert result.created and result.changed and result.previous_fingerprint is None
    assert result.path == target and scan_skill(target).fingerprint == package.manifest.fingerprint == result.fingerprint
    assert (target / "SKILL.md").read_text() == "v1\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(target / "part0").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(target / "part0" / "f000.txt").st_mode) == 0o755  # executable
    assert stat.S_IMODE(os.stat(target / "part1" / "f001.txt").st_mode) == 0o644
    assert list_skill_dirs(layout.skills_root).names == ("pdf",)
    assert leftovers(layout.skills_root) == []


def test_replace_swaps_the_tree_and_the_same_tree_is_a_no_op(layout: DataLayout) -> None:
    installer = SkillInstaller(layout)
    first = installer.install(None, version("pdf", 1))
    target = layout.skill_source("pdf")
    inode = os.stat(target).st_ino
    second = installer.install(None, version("pdf", 2, files=3))
    assert not second.created and second.changed and second.previous_fingerprint == first.fingerprint
    assert os.stat(target).st_ino != inode
    assert sorted(p.name for p in (target / "part0").iterdir()) == ["f000.txt"]  # nothing of v1 is left
    assert leftovers(layout.skills_root) == []
    inode = os.stat(target).st_ino
    again = installer.install(None, version("pdf", 2, files=3))
    assert not again.changed and not again.created and again.fingerprint == second.fingerprint
    assert os.stat(target).st_ino == inode


def test_replace_takes_the_name_from_whatever_held_it(layout: DataLayout) -> None:
    layout.skills_root.mkdir(parents=True)
    (layout.skills_root / "elsewhere").mkdir()
    (layout.skills_root / "pdf").symlink_to("elsewhere")
    result = SkillInstaller(layout).install(None, version("pdf", 1, files=1))
    assert not result.created and result.previous_fingerprint is None
    assert layout.skill_source("pdf").is_dir() and not layout.skill_source("pdf").is_symlink()
    assert (layout.skills_root / "elsewhere").is_dir()  # the link went, not its target


def test_remove_takes_the_whole_skill_at_once(layout: DataLayout) -> None:
    installer = SkillInstaller(layout)
    installed = installer.install(None, version("pdf", 1))
    removed = installer.remove(None, "pdf")
    assert removed.previous_fingerprint == installed.fingerprint
    assert not os.path.lexists(layout.skill_source("pdf")) and leftovers(layout.skills_root) == []
    with pytest.raises(SkillNotInstalled):
        installer.remove(None, "pdf")


def test_personal_skills_go_to_the_users_dir_prepared_by_the_callback(layout: DataLayout) -> None:
    prepared = []

    def prepare(user_id: int) -> None:
        prepared.append(user_id)
        layout.userskills_dir(user_id).mkdir(parents=True, exist_ok=True)

    installer = SkillInstaller(layout, prepare_user_dir=prepare)
    installer.install(7, version("mine", 1, files=2))
    assert prepared == [7]
    assert installed_fingerprint(layout.userskill_source(7, "mine")) is not None
    assert not layout.skills_root.exists()
    installer.remove(7, "mine")
    assert list_skill_dirs(layout.userskills_dir(7)).names == ()


def test_leftovers_of_a_killed_install_go_but_live_ones_stay(layout: DataLayout) -> None:
    installer = SkillInstaller(layout)
    installer.install(None, version("pdf", 1, files=1))
    dead = layout.skill_source_staging(None, "dead0000")
    dead.mkdir()
    (dead / "half.txt").write_text("half")
    trash = layout.skill_source_trash(None, "dead1111")
    trash.mkdir()
    with owned_staging(lambda token: layout.skill_source_staging(None, token)) as live:
        installer.install(None, version("other", 1, files=1))
        assert leftovers(layout.skills_root) == [live.name]  # its owner holds the lock
    assert list_skill_dirs(layout.skills_root).names == ("other", "pdf")


def test_without_renameat2_flags_it_falls_back_to_two_renames(layout: DataLayout, monkeypatch) -> None:
    import errno

    import mounts.fs.rename_swap as rename_swap

    def unsupported(*_args: object) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(rename_swap, "rename_noreplace", unsupported)
    monkeypatch.setattr(rename_swap, "exchange", unsupported)
    installer = SkillInstaller(layout)
    assert installer.install(None, version("pdf", 1, files=2)).created
    replaced = installer.install(None, version("pdf", 2, files=1))
    assert not replaced.created and replaced.changed
    assert scan_skill(layout.skill_source("pdf")).fingerprint == replaced.fingerprint
    assert leftovers(layout.skills_root) == []


def read_tree(path: Path) -> tuple[set[str], bool]:
    """The versions of every file read through one descriptor of the tree at `path`, and
    whether the read was complete. An incomplete read is only allowed from a tree that was
    superseded meanwhile (the replaced tree is deleted after the swap; its readers retry)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        versions, count = set(), 0
        try:
            for _, _, names, dir_fd in os.fwalk(".", dir_fd=fd):
                for name in names:
                    with open(os.open(name, os.O_RDONLY, dir_fd=dir_fd), "rb") as fh:
                        versions.add(fh.read(8).split(b" ")[0].split(b"\n")[0].decode())
                    count += 1
        except FileNotFoundError:
            pass
        complete = count == FILES + 1
        if not complete and os.path.samestat(os.fstat(fd), os.stat(path)):
            raise AssertionError(f"partial tree at its name: {count} files")
        return versions, complete
    finally:
        os.close(fd)


class Reader(threading.Thread):
    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.stop = threading.Event()
        self.complete_reads = 0
        self.seen: set[str] = set()
        self.violations: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set() and len(self.violations) < 20:
            try:
                versions, complete = read_tree(self.path)
            except FileNotFoundError:
                self.violations.append("the skill vanished")
                continue
            except AssertionError as exc:
                self.violations.append(str(exc))
                continue
            if len(versions) > 1:
                self.violations.append(f"mixed tree: {sorted(versions)}")
            if complete:
                self.complete_reads += 1
                self.seen |= versions


def test_readers_see_the_old_tree_or_the_new_one_never_a_missing_or_partial_one(layout: DataLayout) -> None:
    installer = SkillInstaller(layout)
    installer.install(None, version("pdf", 0))
    reader = Reader(layout.skill_source("pdf"))
    reader.start()
    try:
        for number in range(1, 41):
            installer.install(None, version("pdf", number))
    finally:
        reader.stop.set()
        reader.join()
    assert reader.violations == []
    assert reader.complete_reads > 20 and len(reader.seen) > 3
    assert leftovers(layout.skills_root) == []


INSTALLER = """
import sys
from pathlib import Path
from mounts.layout import DataLayout
from mounts.skillstore.install import SkillInstaller
from tests.mounts.skillstore.test_skill_install import version
installer = SkillInstaller(DataLayout(Path(sys.argv[1])))
start = int(sys.argv[2])
print("ready", flush=True)
for number in range(start, start + 1000):
    installer.install(None, version("pdf", number))
    print(number, flush=True)
"""


@pytest.mark.slow
def test_kill_9_during_installs_leaves_a_whole_skill_and_the_next_install_cleans_up(layout: DataLayout) -> None:
    rng = random.Random(11)
    installer = SkillInstaller(layout)
    installer.install(None, version("pdf", 0))
    target = layout.skill_source("pdf")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    previous, killed_mid_run = 0, 0
    for round_no in range(1, 16):
        child = subprocess.Popen(
            [sys.executable, "-c", INSTALLER, str(layout.root), str(round_no * 1000)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.25))
        killed = child.poll() is None
        if killed:
            os.kill(child.pid, signal.SIGKILL)
        out, err = child.communicate(timeout=30)
        assert "Traceback" not in err, err
        killed_mid_run += killed
        done = [int(n) for n in out.split()]
        # The skill at its name is exactly one whole version: the last one the child finished,
        # or the one it was installing when killed (swapped in, not yet reported).
        versions, complete = read_tree(target)
        assert complete and len(versions) == 1, versions
        number = int(versions.pop()[1:])
        assert scan_skill(target).fingerprint == version("pdf", number).manifest.fingerprint
        expected = (done[-1], done[-1] + 1) if done else (previous, round_no * 1000)
        assert number in expected, (number, expected)
        previous = number
    assert killed_mid_run >= 10
    installer.install(None, version("pdf", 99_999))
    assert leftovers(layout.skills_root) == []
