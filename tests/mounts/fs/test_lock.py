"""mounts/fs/lock.py: flock shared by threads and processes; a held lock tells its holder lives."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from mounts.fs.lock import acquire, flocked, flocked_at, holding, is_held
from mounts.fs.nofollow import closing_fd, open_root


def test_two_threads_exclude_each_other(tmp_path: Path) -> None:
    lock, inside, overlaps = tmp_path / "locks" / "x.lock", [], []

    def work() -> None:
        for _ in range(50):
            with flocked(lock, exclusive=True):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(1)
                inside.pop()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    assert oct(lock.stat().st_mode & 0o777) == oct(0o600)


def test_is_held_follows_the_holders_life(tmp_path: Path) -> None:
    (tmp_path / "claim").touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); sys.stdin.read()", str(tmp_path / "claim")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with closing_fd(os.open(tmp_path / "claim", os.O_RDONLY)) as fd:
            assert is_held(fd)
            assert not acquire(fd, blocking=False)
            holder.kill()  # a killed process releases its locks
            holder.wait()
            assert not is_held(fd)
            with holding(fd):
                assert acquire(fd, blocking=False)  # the same open file description: already ours
    finally:
        holder.kill()
        holder.wait()


def test_flocked_at_never_follows_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "victim").write_text("keep")
    (tmp_path / "x.lock").symlink_to(tmp_path / "victim")
    with closing_fd(open_root(tmp_path)) as fd:
        try:
            with flocked_at(fd, "x.lock", exclusive=True):
                raise AssertionError("locked through a symlink")
        except OSError:
            pass
    assert (tmp_path / "victim").read_text() == "keep"
