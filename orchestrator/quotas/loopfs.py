"""The imperative side of loop images: mkfs, loop mounts, bind mounts, online growth, unmount.

Images live below `state/disks/` (root, 0700), which no sandbox can reach. Bind targets are
opened without following links first and mounted on through `/proc/self/fd/N`, so a link
planted at a layout path never redirects a mount (the parents are root-owned 0711 anyway).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
from pathlib import Path

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MNT_DETACH = 0x2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

TOOL_TIMEOUT_S = 120


class LoopError(RuntimeError):
    """A loop-image operation failed; the message says which and why."""


def loop_problem() -> str | None:
    """Why loop images cannot work on this host (None: they can)."""
    for tool in ("mkfs.ext4", "resize2fs", "losetup", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (e2fsprogs, util-linux)"
    if not os.path.exists("/dev/loop-control"):
        return "/dev/loop-control is missing (no loop driver)"
    return None


def _run(*argv: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LoopError(f"{argv[0]} failed: {exc}") from None
    if done.returncode != 0:
        raise LoopError(f"{' '.join(argv)} failed: {(done.stderr or done.stdout).strip()[:500]}")
    return done.stdout


def make_image(path: Path, *, size_mb: int, inodes: int) -> None:
    """A sparse ext4 image of `size_mb` with at least `inodes` inodes, no reserved blocks (the
    quota is the user's whole), fsynced. `path` must not exist (O_EXCL)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size_mb * 1024 * 1024)
    finally:
        os.close(fd)
    # -N: the inode quota; -m 0: nothing kept for root; root_owner: the image's root directory
    # is root's (its places get the user's owner when they are bound).
    _run("mkfs.ext4", "-q", "-F", "-m", "0", "-N", str(inodes), "-E", "root_owner=0:0", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mount_image(image: Path, mount_point: Path) -> None:
    # `-o loop` sets the loop device's autoclear flag: unmounting frees it, so none leaks.
    _run("mount", "-t", "ext4", "-o", "loop,nosuid,nodev", str(image), str(mount_point))


def bind(source_fd: int, parent_fd: int, name: str) -> None:
    """Bind the directory `source_fd` onto the directory `name` in `parent_fd` (all opened
    without following links), nosuid and nodev."""
    target_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        source, target = f"/proc/self/fd/{source_fd}".encode(), f"/proc/self/fd/{target_fd}".encode()
        if _libc.mount(source, target, None, MS_BIND, None) != 0:
            code = ctypes.get_errno()
            raise LoopError(f"bind mount failed: {os.strerror(code)}")
    finally:
        os.close(target_fd)
    # A bind takes nosuid/nodev only by a remount (mount(2)), addressed through the parent so
    # that the name now reaches the new mount, not the directory under it.
    target = f"/proc/self/fd/{parent_fd}/{name}".encode()
    if _libc.mount(None, target, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, None) != 0:
        code = ctypes.get_errno()
        raise LoopError(f"remounting a bind nosuid,nodev failed: {os.strerror(code)}")


def mount_tmpfs(parent_fd: int, name: str, *, size_kib: int, inodes: int, uid: int, gid: int) -> None:
    """A small tmpfs (nosuid, nodev, noexec) on the directory `name` in `parent_fd`, opened
    without following links, its root owned by `uid:gid` with mode 0700."""
    target_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        options = f"size={size_kib}k,nr_inodes={inodes},mode=0700,uid={uid},gid={gid}".encode()
        target = f"/proc/self/fd/{target_fd}".encode()
        if _libc.mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options) != 0:
            code = ctypes.get_errno()
            raise LoopError(f"mounting a tmpfs failed: {os.strerror(code)}")
    finally:
        os.close(target_fd)


def unmount(path: Path) -> None:
    """Unmount `path`; a busy one (a running container still holds it) is detached lazily,
    and the loop device is freed when its last user goes (autoclear)."""
    if _libc.umount2(str(path).encode(), 0) == 0:
        return
    code = ctypes.get_errno()
    if code == errno.EBUSY and _libc.umount2(str(path).encode(), MNT_DETACH) == 0:
        return
    if code == errno.EINVAL:
        return  # not a mount point (any more)
    raise LoopError(f"unmounting {path} failed: {os.strerror(code)}")


CAP_SYS_RESOURCE = 24


def can_resize_online() -> bool:
    """ext4's online resize (EXT4_IOC_RESIZE_FS) needs CAP_SYS_RESOURCE, which a container
    running the orchestrator may lack even as root."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    except OSError:
        pass
    return False


def _extend(image: Path, size_mb: int) -> None:
    fd = os.open(image, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size_mb * 1024 * 1024)
        os.fsync(fd)
    finally:
        os.close(fd)


def grow_online(image: Path, device: str, size_mb: int) -> None:
    """Grow the mounted image: a larger file, the loop device told, then resize2fs."""
    _extend(image, size_mb)
    _run("losetup", "--set-capacity", device)
    _run("resize2fs", device)


def grow_offline(image: Path, size_mb: int) -> None:
    """Grow an image that no one has mounted (checked first, as resize2fs requires)."""
    _extend(image, size_mb)
    _run("e2fsck", "-f", "-p", str(image))
    _run("resize2fs", str(image))


def image_attached(image: Path) -> bool:
    """Whether some loop device still serves `image` (a mount of it somewhere, maybe in a
    container's namespace, is still alive)."""
    return bool(_run("losetup", "-j", str(image)).strip())
