"""First-time migration of a user's existing directories into its new image, for real (root,
loop devices): the image holds exactly the files that were there (hashes compared), a kill -9
in the middle loses nothing and the next start finishes it, and what a hostile sandbox planted
(a hard link to another user's file, a symlink to a host secret, a FIFO) is never followed nor
copied as someone else's data."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mounts.layout import DataLayout
from mounts.plan import plan_mounts
from orchestrator.quotas.mountinfo import read_mounts
from orchestrator.quotas.service import DiskQuotas
from orchestrator.settings import DiskQuotaSettings
from orchestrator.quotas.volumes import MIGRATED_MARKER
from orchestrator.users.dirs import UserDirectories
from tests.conftest import REPO
from tests.orchestrator.quotas.conftest import require_loop
from tests.orchestrator.quotas.world import quota_settings, release_mounts, traversable_data_dir

USER, OTHER = 21, 22


@pytest.fixture
def data_dir() -> Iterator[Path]:
    require_loop()
    data = traversable_data_dir()
    try:
        yield data
    finally:
        release_mounts(data)
        import shutil

        shutil.rmtree(data.parent, ignore_errors=True)


def tree_hashes(root: Path) -> dict[str, str]:
    """Every regular file below `root` by relative path -> sha256; links by their target."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = "link:" + os.readlink(path)
            elif path.is_file():
                found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def populate(layout: DataLayout, uid: int, *, files: int = 40) -> dict[str, dict[str, str]]:
    """Existing data in the user's old directories, owned by its sandbox uid as if its sandbox
    wrote it; returns each place's hashes."""
    places = {"home": layout.home_dir(USER), "uploads": layout.uploads_dir(USER), "deps": layout.deps_dir(USER)}
    for index, path in enumerate(places.values()):
        (path / "sub" / "deeper").mkdir(parents=True)
        for n in range(files):
            (path / "sub" / f"f{n}.bin").write_bytes(os.urandom(1000 + 37 * n + index))
        (path / "sub" / "deeper" / "note.txt").write_text("héllo\n")
        (path / "empty").mkdir()
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), uid, uid)
        os.chown(path, uid, uid)
    (places["home"] / "sub" / "f0.bin").chmod(0o640)
    return {name: tree_hashes(path) for name, path in places.items()}


def migrate(data_dir: Path, crash_at: str | None = None, *, fd_limit: int | None = None, inodes: int = 256) -> subprocess.CompletedProcess:
    """The user's sandbox start's part in a fresh process (so a crash point can kill it), with
    at most `fd_limit` open descriptors when given."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ORCH_CRASH_AT", None)
    if crash_at:
        env["ORCH_CRASH_AT"] = crash_at
    script = (
        "import sys; from pathlib import Path\n"
        "import resource\n"
        f"limit = {fd_limit!r}\n"
        "if limit: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "from tests.orchestrator.quotas.test_migration import start_user\n"
        f"start_user(Path({str(data_dir)!r}), user_inode_quota={inodes})\n"
    )
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, cwd=REPO)


def start_user(data_dir: Path, **overrides: object) -> None:
    settings = quota_settings(data_dir, **overrides)
    directories = UserDirectories(settings.layout, settings.sandbox_uid_base, settings.max_user_id)
    quotas = DiskQuotas(DiskQuotaSettings.of(settings), sandbox_uid=directories.sandbox_uid)
    directories.volumes = quotas
    quotas.start()
    directories.ensure_sandbox_dirs(plan_mounts(settings.layout, USER), sandbox_start=True)


def bound_places(layout: DataLayout) -> set[Path]:
    return {e.mount_point for e in read_mounts() if layout.root in e.mount_point.parents}


def test_existing_files_migrate_into_the_image_exactly_and_verified(data_dir: Path) -> None:
    settings = quota_settings(data_dir)
    layout = settings.layout
    uid = settings.sandbox_uid_base + USER
    before = populate(layout, uid)
    done = migrate(data_dir)
    assert done.returncode == 0, done.stderr
    for name, path in (("home", layout.home_dir(USER)), ("uploads", layout.uploads_dir(USER)), ("deps", layout.deps_dir(USER))):
        assert path in bound_places(layout), path
        assert tree_hashes(path) == before[name], name
        assert os.stat(path / "sub" / "f1.bin").st_uid == uid
    assert stat.S_IMODE(os.stat(layout.home_dir(USER) / "sub" / "f0.bin").st_mode) == 0o640
    assert (layout.home_dir(USER) / "empty").is_dir()
    assert os.listdir(layout.disk_legacy("user-21")) == []  # the old copies are gone
    assert os.path.exists(layout.disk_mount("user-21") / MIGRATED_MARKER)


@pytest.mark.parametrize("crash_at", ["disk-migration-mid-copy", "disk-migration-before-bind"])
def test_a_kill_9_during_the_migration_loses_nothing_and_the_next_start_finishes_it(data_dir: Path, crash_at: str) -> None:
    settings = quota_settings(data_dir)
    layout = settings.layout
    before = populate(layout, settings.sandbox_uid_base + USER)
    crashed = migrate(data_dir, crash_at=crash_at)
    assert crashed.returncode == -9, (crashed.returncode, crashed.stderr)
    # Nothing is lost at the crash: every file is still at its usual path or in the legacy
    # directory, byte for byte, and nothing is bound yet.
    assert layout.home_dir(USER) not in bound_places(layout)
    assert tree_hashes(layout.home_dir(USER)) == before["home"]
    finished = migrate(data_dir)
    assert finished.returncode == 0, finished.stderr
    assert tree_hashes(layout.home_dir(USER)) == before["home"]
    assert tree_hashes(layout.uploads_dir(USER)) == before["uploads"]
    assert tree_hashes(layout.deps_dir(USER)) == before["deps"]
    mounts = [e.mount_point for e in read_mounts() if layout.root in e.mount_point.parents]
    assert len(mounts) == len(set(mounts)), mounts  # the image mounted once, each place bound once
    assert os.listdir(layout.disk_legacy("user-21")) == []


def test_the_migration_never_copies_another_users_file_through_a_hard_link_nor_follows_a_link(data_dir: Path) -> None:
    settings = quota_settings(data_dir)
    layout = settings.layout
    uid, other_uid, shared_gid = (settings.sandbox_uid_base + u for u in (USER, OTHER, 0))
    populate(layout, uid, files=2)
    # The other user's file in share/, group-writable as agents' umask 002 leaves it: the
    # hostile user may hard-link it (protected_hardlinks lets a writer link) into its home.
    share = layout.share_dir
    share.mkdir(mode=0o770)
    os.chown(share, 0, shared_gid)
    secret = share / "other-users-secret.txt"
    secret.write_text("the other user's words\n")
    os.chown(secret, other_uid, shared_gid)
    secret.chmod(0o660)
    home = layout.home_dir(USER)
    as_user = {"user": uid, "group": uid, "extra_groups": [shared_gid]}
    subprocess.run(["ln", str(secret), str(home / "stolen.txt")], check=True, **as_user)  # type: ignore[arg-type]
    # A symlink to a host-only file and a FIFO that would hang a reader.
    host_secret = layout.state_dir / "host-secret"
    layout.state_dir.mkdir(mode=0o700, exist_ok=True)
    host_secret.write_text("root only\n")
    subprocess.run(["ln", "-s", str(host_secret), str(home / "to-host-secret")], check=True, **as_user)  # type: ignore[arg-type]
    subprocess.run(["mkfifo", str(home / "pipe")], check=True, **as_user)  # type: ignore[arg-type]

    done = migrate(data_dir)
    assert done.returncode == 0, done.stderr
    assert home in bound_places(layout)
    assert not (home / "stolen.txt").exists(), "the other user's file was copied into this user's image"
    assert "a hard link to someone else" in done.stderr
    link = home / "to-host-secret"
    assert link.is_symlink() and os.readlink(link) == str(host_secret)
    assert not (home / "pipe").exists()
    assert secret.read_text() == "the other user's words\n" and os.stat(secret).st_nlink == 1


def test_data_written_while_the_image_was_not_mounted_is_kept_aside_not_deleted(data_dir: Path) -> None:
    settings = quota_settings(data_dir)
    layout = settings.layout
    populate(layout, settings.sandbox_uid_base + USER, files=2)
    assert migrate(data_dir).returncode == 0
    home = layout.home_dir(USER)
    (home / "in-image.txt").write_text("in the image\n")
    release_mounts(data_dir)  # e.g. a reboot, or ORCH_DISK_UNMOUNT_ON_CLOSE
    (home / "written-while-unmounted.txt").write_text("not in the image\n")  # the bare mount point
    assert migrate(data_dir).returncode == 0
    assert (home / "in-image.txt").read_text() == "in the image\n"  # the image, mounted again
    kept = [p for p in os.listdir(layout.disk_legacy("user-21")) if p.startswith("kept-home-")]
    assert len(kept) == 1, os.listdir(layout.disk_legacy("user-21"))
    saved = layout.disk_legacy("user-21") / kept[0] / "written-while-unmounted.txt"
    assert saved.read_text() == "not in the image\n"
    # The other places were empty mount points: nothing kept for them.
    assert not [p for p in os.listdir(layout.disk_legacy("user-21")) if not p.startswith("kept-home-")]


def as_sandbox(data_dir: Path, script: str) -> tuple[object, DataLayout, int, Path]:
    """The user's old home, then `script` run in it by the user's sandbox uid (argv[1]: home)."""
    settings = quota_settings(data_dir)
    uid = settings.sandbox_uid_base + USER
    populate(settings.layout, uid, files=2)
    home = settings.layout.home_dir(USER)
    subprocess.run(["/usr/bin/python3", "-c", script, str(home)], check=True, user=uid, group=uid, timeout=30, cwd="/")
    return settings, settings.layout, uid, home


def test_a_tree_of_more_directories_than_descriptors_migrates(data_dir: Path) -> None:
    # A sandbox (or just a node_modules) holds more directories than the orchestrator may open
    # descriptors: the copy held two descriptors for every directory it had seen and failed
    # with EMFILE, which also starved every other user's calls in the server while it lasted.
    settings, layout, uid, home = as_sandbox(data_dir, "import os, sys\nfor i in range(600): os.makedirs(f'{sys.argv[1]}/wide/d{i}/sub')\n")
    before = tree_hashes(home)
    done = migrate(data_dir, fd_limit=256, inodes=4096)
    assert done.returncode == 0, done.stderr[-2000:]
    assert home in bound_places(layout)
    assert tree_hashes(home) == before
    assert all((home / "wide" / f"d{i}" / "sub").is_dir() for i in range(600))
    assert os.stat(home / "wide" / "d7" / "sub").st_uid == uid


def test_a_chain_of_directories_deeper_than_the_bound_is_refused_and_nothing_is_moved(data_dir: Path) -> None:
    # Only the current path's directories are open, so a hostile chain nested deeper than the
    # walk's bound would still run the process out of descriptors: refused, the source kept.
    from orchestrator.quotas.migration import MAX_DEPTH

    make = f"import os, sys\nos.chdir(sys.argv[1])\nfor i in range({MAX_DEPTH + 5}):\n    os.mkdir('d'); os.chdir('d')\nopen('bottom.txt', 'w').write('x')\n"
    settings, layout, uid, home = as_sandbox(data_dir, make)
    before = tree_hashes(home)
    done = migrate(data_dir, fd_limit=2 * MAX_DEPTH + 64, inodes=4096)
    assert done.returncode != 0
    assert "directories deep" in done.stderr and "Too many open files" not in done.stderr
    assert home not in bound_places(layout)
    assert tree_hashes(home) == before
