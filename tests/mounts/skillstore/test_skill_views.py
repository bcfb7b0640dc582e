"""User views: hard links, atomic swaps, grace for replaced versions, copy fallbacks, and a
sandbox user that cannot change a stored byte."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mounts.layout import DataLayout, view_version_name
from mounts.skillstore.scan import scan_skill
from orchestrator.users.dirs import UserDirectories
from tests.mounts.skillstore.conftest import SkillWorld, make_world

SYSTEM_PYTHON = "/usr/bin/python3.11"  # world-executable; the venv's python lives under /root


def build(world: SkillWorld, uid: int, name: str) -> str:
    fp = scan_skill(world.layout.skill_source(name)).fingerprint
    world.views.ensure_user_dirs(uid)
    world.views.ensure_view(uid, name, fp, world.layout.skill_source(name))
    return fp


def test_a_view_is_a_symlink_to_a_complete_read_only_version(world: SkillWorld) -> None:
    world.system_skill("pdf", {"a/b.txt": "b"})
    fp = build(world, 5, "pdf")
    view = world.layout.user_view(5, "pdf")
    assert os.readlink(view) == f".v/{view_version_name(fp)}"
    assert scan_skill(world.real(view)).fingerprint == fp
    version = world.layout.user_view_version(5, fp)
    assert stat.S_IMODE(os.stat(version).st_mode) == 0o555
    assert stat.S_IMODE(os.stat(version / "a").st_mode) == 0o555
    assert stat.S_IMODE(os.stat(world.layout.user_views_dir(5)).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(world.layout.skill_views_root).st_mode) == 0o711


def test_a_replaced_version_stays_for_its_grace_period(world: SkillWorld) -> None:
    src = world.system_skill("pdf", {"SKILL.md": "v1"})
    fp1 = build(world, 5, "pdf")
    (src / "SKILL.md").write_text("v2")
    fp2 = build(world, 5, "pdf")
    old = world.layout.user_view_version(5, fp1)
    assert old.is_dir()  # a reader inside the old version can finish
    world.views.clean_user(5)
    assert old.is_dir()
    world.views.retired_grace_s = 0.0
    os.utime(old, (0, 0))
    world.views.clean_user(5)
    assert not old.exists()
    assert world.views.current(5, "pdf") == fp2
    assert sorted(os.listdir(world.layout.user_view_versions_dir(5))) == [view_version_name(fp2)]


@pytest.fixture
def other_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs mounted inside the data dir: the store and the view are on different devices."""
    mount_point = tmp_path / "data" / "skill-views" / "9"
    mount_point.mkdir(parents=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_exdev_falls_back_to_copying_and_says_so(
    world: SkillWorld, other_filesystem: Path, caplog: pytest.LogCaptureFixture
) -> None:
    world.system_skill("pdf", {"x/y.txt": "y", "z.txt": "z"})
    fp = build(world, 9, "pdf")
    view_file = world.layout.user_view(9, "pdf") / "x/y.txt"
    store_file = world.layout.content_entry(fp, "pdf") / "x/y.txt"
    assert view_file.read_text() == "y"
    assert not os.path.samestat(os.stat(view_file), os.stat(store_file))
    assert stat.S_IMODE(os.stat(view_file).st_mode) == 0o444
    assert scan_skill(world.real(world.layout.user_view(9, "pdf"))).fingerprint == fp
    assert "reason=EXDEV" in caplog.text and "copied_files=3" in caplog.text


@pytest.mark.slow
def test_emlink_falls_back_to_copying_only_the_full_inode(world: SkillWorld, caplog: pytest.LogCaptureFixture) -> None:
    world.system_skill("pdf", {"popular.txt": "p", "other.txt": "o"})
    fp = scan_skill(world.layout.skill_source("pdf")).fingerprint
    entry = world.store.ensure_entry(fp, "pdf", world.layout.skill_source("pdf"))
    store_file = entry / "popular.txt"
    # Fill the inode up to ext4's limit of 65,000 links.
    filler = world.layout.root / "filler"
    filler.mkdir()
    count = 1
    try:
        while True:
            os.link(store_file, filler / str(count))
            count += 1
    except OSError as exc:
        if exc.errno != errno.EMLINK:
            raise
    if count > 70_000:
        pytest.skip("this filesystem has no small link limit")
    build(world, 5, "pdf")
    view = world.layout.user_view(5, "pdf")
    assert not os.path.samestat(os.stat(view / "popular.txt"), os.stat(store_file))
    assert os.path.samestat(os.stat(view / "other.txt"), os.stat(entry / "other.txt"))
    assert "reason=EMLINK" in caplog.text and "copied_files=1" in caplog.text
    shutil.rmtree(filler)


ATTACK = r"""
import errno, json, os, sys
files, dirs, links, own_dir = json.loads(sys.argv[1])
outcomes = []
def attempt(what, path, fn):
    try:
        fn()
        outcomes.append([what, path, "succeeded"])
    except OSError as exc:
        outcomes.append([what, path, errno.errorcode.get(exc.errno, str(exc.errno))])
reads = 0
for f in files:
    with open(f, "rb") as fh:
        fh.read()
    reads += 1
    attempt("write", f, lambda: open(f, "r+b").write(b"pwned"))
    attempt("write-new", f, lambda: open(f, "wb").write(b"pwned"))
    attempt("append", f, lambda: open(f, "ab").write(b"pwned"))
    attempt("truncate", f, lambda: os.truncate(f, 0))
    attempt("chmod", f, lambda: os.chmod(f, 0o666))
    attempt("rename", f, lambda: os.rename(f, f + ".moved"))
    attempt("unlink", f, lambda: os.unlink(f))
    attempt("utime", f, lambda: os.utime(f, (0, 0)))
    attempt("hardlink-out", f, lambda: os.link(f, os.path.join(own_dir, "stolen-%d" % len(outcomes))))
for d in dirs:
    attempt("create-in", d, lambda: open(os.path.join(d, "planted"), "wb").close())
    attempt("chmod-dir", d, lambda: os.chmod(d, 0o777))
    attempt("rename-dir", d, lambda: os.rename(d, d + ".moved"))
    attempt("rmdir", d, lambda: os.rmdir(d))
for l in links:
    attempt("plant-view-link", l, lambda: os.symlink("/tmp", l + ".evil"))
    attempt("replace-view-link", l, lambda: os.rename(own_dir, l))
    attempt("unlink-view-link", l, lambda: os.unlink(l))
# positive control: this uid can write where it is allowed to
with open(os.path.join(own_dir, "control"), "w") as fh:
    fh.write("ok")
print(json.dumps({"reads": reads, "outcomes": outcomes}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"{SYSTEM_PYTHON} is missing")
def test_a_sandbox_user_cannot_change_a_stored_file() -> None:
    uid, user_id = 100_005, 5
    # Under a world-traversable directory (pytest's tmp dirs are 0700 root): otherwise every
    # attack would fail for the wrong reason.
    base = Path(tempfile.mkdtemp(prefix="skill-attack-", dir="/tmp"))
    try:
        os.chmod(base, 0o711)
        layout = DataLayout(base / "data")
        # The orchestrator's own way of giving a session's runtime dir to the sandbox user.
        directories = UserDirectories(layout, uid - user_id)
        world = make_world(base / "data", lambda u, s: directories.ensure_session_runtime(u, s, is_owner=False))
        os.chmod(base / "data", 0o711)
        world.system_skill("pdf", {"scripts/fill.py": "print(1)\n", "ref/a.md": "a" * 5000},
                           executable=("scripts/fill.py",))
        world.system_skill("xlsx", {"x.txt": "x"})
        os.symlink("scripts/fill.py", world.layout.skill_source("pdf") / "fill")
        world.sync.sync_to_session("default", user_id, "s")
        own = world.layout.home_dir(user_id)
        own.mkdir(parents=True)
        os.chown(own, uid, uid)
        stored = {}
        for fp_dir in world.layout.content_store.iterdir():
            for path in fp_dir.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    stored[path] = hashlib.sha256(path.read_bytes()).hexdigest()
        files, dirs, links = [], [], []
        for name in ("pdf", "xlsx"):
            for base_path in (world.layout.user_view(user_id, name), world.layout.session_skill_link(user_id, "s", name)):
                for root, dirnames, filenames in os.walk(base_path):
                    if root != str(world.layout.session_skill_link(user_id, "s", name)):
                        dirs.append(root)  # (the session link itself is the user's own, in its own dir)
                    files += [os.path.join(root, f) for f in filenames if not os.path.islink(os.path.join(root, f))]
            links.append(str(world.layout.user_view(user_id, name)))
        dirs.append(str(world.layout.user_views_dir(user_id)))
        dirs.append(str(world.layout.user_view_versions_dir(user_id)))
        assert len(files) == 2 * 5  # pdf: 3 files, xlsx: 2; through the view and the link
        args = json.dumps([files, dirs, links, str(own)])
        proc = subprocess.run([SYSTEM_PYTHON, "-c", ATTACK, args], user=uid, group=uid, extra_groups=[],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["reads"] == len(files)  # the views are readable by their user
        assert (own / "control").read_text() == "ok"  # and the attacker really ran with rights
        succeeded = [o for o in report["outcomes"] if o[2] == "succeeded"]
        assert succeeded == []
        assert {o[2] for o in report["outcomes"]} <= {"EACCES", "EPERM", "EROFS"}
        for path, digest in stored.items():
            assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
            assert stat.S_IMODE(path.stat().st_mode) in (0o444, 0o555) and path.stat().st_uid == 0
        assert world.store.verify_entry(world.views.current(user_id, "pdf") or "", "pdf") is None
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_names_with_equal_content_share_one_version(world: SkillWorld) -> None:
    world.system_skill("one", {"SKILL.md": "same\n"})
    world.system_skill("two", {"SKILL.md": "same\n"})
    assert world.sync.sync_to_session("default", 5, "s").available == ("one", "two")
    fp = world.views.current(5, "one")
    assert fp is not None and world.views.current(5, "two") == fp
    assert os.listdir(world.layout.user_view_versions_dir(5)) == [view_version_name(fp)]
    # one of them changing does not retire the version the other still shows
    (world.layout.skill_source("two") / "SKILL.md").write_text("different\n")
    world.changed(world.layout.skill_source("two") / "SKILL.md")
    world.views.retired_grace_s = 0.0
    world.sync.sync_to_session("default", 5, "s")
    world.views.clean_user(5)
    assert (world.layout.user_view(5, "one") / "SKILL.md").read_text() == "same\n"
    assert (world.layout.user_view(5, "two") / "SKILL.md").read_text() == "different\n"
