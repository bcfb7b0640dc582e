"""The host-wide registry of live instances' sandbox uid blocks (root only; see `uid_blocks.py`).

One file per instance in `ORCH_UID_REGISTRY_DIR` (default /run/sandbox-orchestrator/uid-blocks,
on tmpfs: a reboot clears it), named by the instance id, holding {data_dir, base, max_user_id,
pid}. The instance holds an exclusive flock on its file for its lifetime, so a file counts as
live only while its flock is held: a crashed instance's file is stale and removed by the next
registrant. Registering runs under a registry-wide lock, so two instances starting at once see
each other. Not root: nothing is registered (all sandboxes run as the orchestrator's own uid).
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from pathlib import Path

from mounts.fs.flags import DIR_FLAGS, LOCK_FLAGS
from mounts.fs.lock import acquire, flocked_at, is_held
from mounts.fs.nofollow import UnsafePath, open_regular_at
from orchestrator.log import kv
from orchestrator.startup_checks import StartupRefused
from orchestrator.sandboxes.uid_blocks import Claim, UidBlock, conflict_message, overlapping_claim

log = logging.getLogger(__name__)

_INSTANCE_ID = re.compile(r"[0-9a-f]{12}")
_SUFFIX = ".json"
_LOCK_NAME = ".registry.lock"
_MAX_FILE_BYTES = 4096


def _safe_dir(path: Path) -> int:
    """Create `path` and its missing parents (root 0755) and open it; refuse a directory anyone
    else could change (a symlink, another owner, group/other-writable)."""
    for part in [*reversed(path.parents), path]:
        try:
            os.mkdir(part, 0o755)
        except FileExistsError:
            pass
    fd = os.open(path, DIR_FLAGS)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise StartupRefused(f"{path} (the uid block registry) must be owned by root and writable only by it")
    return fd


def _read_claim(dir_fd: int, name: str) -> tuple[int, Claim | None] | None:
    """Open another instance's file; (fd, its claim or None when malformed); None: gone."""
    try:
        fd = open_regular_at(dir_fd, name)
    except (OSError, UnsafePath):
        return None
    if fd is None:
        return None
    try:
        data = json.loads(os.read(fd, _MAX_FILE_BYTES))
        claim = Claim(
            instance_id=name[: -len(_SUFFIX)],
            data_dir=str(data["data_dir"]),
            block=UidBlock.of(int(data["base"]), int(data["max_user_id"])),
            pid=int(data["pid"]),
        )
    except (ValueError, KeyError, TypeError):
        claim = None
    return fd, claim


class UidBlockRegistration:
    """This instance's claim, held until `release()`."""

    def __init__(self, directory: Path, dir_fd: int, name: str, fd: int) -> None:
        self.directory = directory
        self._dir_fd = dir_fd
        self._name = name
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with flocked_at(self._dir_fd, _LOCK_NAME, exclusive=True):
            try:
                os.unlink(self._name, dir_fd=self._dir_fd)
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = None
        os.close(self._dir_fd)


def register(
    directory: Path, *, instance_id: str, data_dir: Path, base: int, max_user_id: int
) -> UidBlockRegistration | None:
    """Claim base..base + max_user_id for this instance, or raise StartupRefused when another
    live instance holds an overlapping block. None when not root (nothing to claim)."""
    if os.geteuid() != 0:
        return None
    if not _INSTANCE_ID.fullmatch(instance_id):
        raise ValueError(f"bad instance id {instance_id!r}")
    ours = Claim(instance_id, str(data_dir), UidBlock.of(base, max_user_id), os.getpid())
    name = instance_id + _SUFFIX
    dir_fd = _safe_dir(directory)
    try:
        with flocked_at(dir_fd, _LOCK_NAME, exclusive=True):
            others = _live_claims(dir_fd, skip=name)
            other = overlapping_claim(ours, others)
            if other is not None:
                raise StartupRefused(conflict_message(ours.block, other))
            fd = _claim_own_file(dir_fd, name, ours)
    except BaseException:
        os.close(dir_fd)
        raise
    if fd is None:
        os.close(dir_fd)
        return None
    log.info(
        "sandbox uid block registered %s",
        kv(first=ours.block.first, last=ours.block.last, registry=directory / name),
    )
    return UidBlockRegistration(directory, dir_fd, name, fd)


def live_claims(directory: Path) -> list[Claim]:
    """The blocks live instances hold now (e.g. to choose a free one); none without a registry."""
    if os.geteuid() != 0 or not directory.is_dir():
        return []
    dir_fd = _safe_dir(directory)
    try:
        with flocked_at(dir_fd, _LOCK_NAME, exclusive=True):
            return _live_claims(dir_fd, skip="")
    finally:
        os.close(dir_fd)


def _live_claims(dir_fd: int, *, skip: str) -> list[Claim]:
    claims = []
    for name in os.listdir(dir_fd):
        if name == skip or not name.endswith(_SUFFIX) or not _INSTANCE_ID.fullmatch(name[: -len(_SUFFIX)]):
            continue
        opened = _read_claim(dir_fd, name)
        if opened is None:
            continue
        fd, claim = opened
        try:
            if not is_held(fd):
                # Its owner is gone (crashed, killed): the block is free again.
                os.unlink(name, dir_fd=dir_fd)
                log.info("removed a stale uid block claim %s", kv(file=name))
            elif claim is None:
                log.warning("unreadable live uid block claim ignored %s", kv(file=name))
            else:
                claims.append(claim)
        finally:
            os.close(fd)
    return claims


def _claim_own_file(dir_fd: int, name: str, ours: Claim) -> int | None:
    """The fd holding our file's flock; None when another service on the same data dir already
    holds it (that claim covers the data dir; our block was still checked against the others)."""
    fd = os.open(name, LOCK_FLAGS, 0o644, dir_fd=dir_fd)
    try:
        if not acquire(fd, blocking=False):
            # Another service on this very data dir (a second one in this process, or a child
            # process as the crash tests start): the same instance id, whose claim stays its
            # holder's. Refusing a second server on one data dir is not this check's business.
            holder = _read_claim(dir_fd, name)
            if holder is not None:
                os.close(holder[0])
            log.info(
                "the uid block of this data dir is claimed by another service %s",
                kv(pid=holder[1].pid if holder is not None and holder[1] is not None else None),
            )
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        body = {"data_dir": ours.data_dir, "base": ours.block.first, "max_user_id": ours.block.last - ours.block.first,
                "pid": ours.pid}
        os.write(fd, json.dumps(body).encode())
        return fd
    except BaseException:
        os.close(fd)
        raise
