"""Loop volumes: make, mount, migrate into, bind, adopt, grow and unmount per-volume images.

A volume's image is `state/disks/images/{key}.img`, mounted at `state/disks/mnt/{key}` (both
below root-only state/); each of its places is a directory in the image bound onto the place's
usual layout path, so no path changes for a sandbox, the prompt or the API, and docker binds
and bwrap see the image's filesystem.

Order of a first mount, crash-safe at every step (a kill -9 anywhere loses nothing):
1. mkfs into `.partial-{key}.img`, renamed into place when complete (a leftover partial is
   deleted and made again);
2. mount it; if the image has no `.migrated` marker, copy every place's existing directory
   into it afresh and verify the copy by hashes (the source is not touched);
3. write `.migrated` (fsynced): from now on the image holds the data;
4. per place: move the old directory to `state/disks/legacy/{key}/`, bind the image's
   directory in its place; finally remove the legacy trees.
A restart finds each step's result (mountinfo, the marker, the legacy trees) and goes on from
there: mounted images and binds are adopted, never mounted twice.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

from mounts.fs.atomic_write import fsync_dir
from mounts.fs.flags import DIR_FLAGS
from mounts.fs.nofollow import closing_fd, open_below, open_root
from mounts.fs.tree_removal import remove_tree_at
from mounts.layout import DataLayout
from orchestrator.crash_points import crash_point
from orchestrator.log import kv
from orchestrator.quotas import loopfs
from orchestrator.quotas.migration import manifest_of, migrate_place
from orchestrator.quotas.model import MIB, DiskUsage, Limits, Volume, grow_problem, usage_from_statvfs
from orchestrator.quotas.mountinfo import MountEntry, read_mounts, top_mount_at

log = logging.getLogger(__name__)

MIGRATED_MARKER = ".migrated"
# Old directories kept aside (they held data the image lacked); never removed automatically.
KEPT_PREFIX = "kept-"
# How long an offline grow waits for the last user of a volume to let go of it.
OFFLINE_RELEASE_S = 10.0
# A user's socket directory is writable by its sandbox but holds only two sockets: a tmpfs this
# small of its own bounds it (on the data filesystem it was a way around every quota).
SOCKET_FS_KIB = 64
SOCKET_FS_INODES = 32


class VolumeRefused(RuntimeError):
    """A volume change that is not made (a shrink); `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LoopVolumes:
    def __init__(self, layout: DataLayout) -> None:
        self.layout = layout
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._ready: set[str] = set()

    def _lock(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    # --- state --------------------------------------------------------------------------------

    def exists(self, volume: Volume) -> bool:
        return os.path.lexists(self.layout.disk_image(volume.key))

    def image_keys(self) -> list[str]:
        try:
            names = os.listdir(self.layout.disk_images_dir)
        except FileNotFoundError:
            return []
        return sorted(n.removesuffix(".img") for n in names if n.endswith(".img") and not n.startswith("."))

    def image_mount(self, key: str, entries: list[MountEntry] | None = None) -> MountEntry | None:
        """The mount of this key's image at its mount point, if that is what is mounted there."""
        entry = top_mount_at(entries if entries is not None else read_mounts(), self.layout.disk_mount(key))
        if entry is None or not entry.source.startswith("/dev/loop"):
            return None
        return entry if _backing_file(entry.source) == self.layout.disk_image(key) else None

    def usage(self, key: str) -> DiskUsage | None:
        """Usage from the mounted image's statvfs (None when it is not mounted)."""
        if self.image_mount(key) is None:
            return None
        return usage_from_statvfs(key, os.statvfs(self.layout.disk_mount(key)))

    def size_mb(self, key: str) -> int:
        return os.stat(self.layout.disk_image(key), follow_symlinks=False).st_size // MIB

    # --- ensure -------------------------------------------------------------------------------

    def ensure(self, volume: Volume, limits: Limits, *, create: bool, owner_ok: Callable[[int], bool]) -> bool:
        """The volume's image mounted and every place bound; `create` also makes (and migrates
        into) a missing image. False when there is no image and `create` is not given."""
        if volume.key in self._ready:
            return True
        with self._lock(volume.key):
            if volume.key in self._ready:
                return True
            if not self.exists(volume) and not create:
                return False
            self._ensure_locked(volume, limits, owner_ok)
            self._ready.add(volume.key)
            return True

    def _ensure_locked(self, volume: Volume, limits: Limits, owner_ok: Callable[[int], bool]) -> None:
        layout, key = self.layout, volume.key
        for directory in (layout.disk_images_dir, layout.disk_mounts_dir, layout.disk_legacy_dir):
            _make_host_dir(layout, directory)
        image = layout.disk_image(key)
        if not os.path.lexists(image):
            partial = layout.disk_image_partial(key)
            if os.path.lexists(partial):
                os.unlink(partial)  # an interrupted mkfs: made again
            loopfs.make_image(partial, size_mb=limits.disk_mb, inodes=limits.inodes)
            os.rename(partial, image)
            fsync_dir(image.parent)
            log.info("disk image made %s", kv(volume=key, size_mb=limits.disk_mb, inodes=limits.inodes))
        mount_point = layout.disk_mount(key)
        _make_host_dir(layout, mount_point)
        entries = read_mounts()
        image_entry = self.image_mount(key, entries)
        if image_entry is None:
            loopfs.mount_image(image, mount_point)
            entries = read_mounts()
            image_entry = self.image_mount(key, entries)
            if image_entry is None:
                raise loopfs.LoopError(f"{image} did not show up mounted at {mount_point}")
            log.info("disk image mounted %s", kv(volume=key, device=image_entry.source))
        else:
            log.info("disk image adopted %s", kv(volume=key, device=image_entry.source))
        with closing_fd(open_root(mount_point)) as image_fd:
            just_migrated = not _exists_at(image_fd, MIGRATED_MARKER)
            if just_migrated:
                self._migrate(volume, image_fd, owner_ok)
            legacy_fd = _open_host_dir(layout, layout.disk_legacy(key))
            with closing_fd(legacy_fd):
                for place in volume.places:
                    self._bind_place(
                        volume, place.subdir, place.layout_path, image_fd, legacy_fd, image_entry, entries,
                        verified=just_migrated,
                    )  # fmt: skip
                for name in os.listdir(legacy_fd):
                    if not name.startswith(KEPT_PREFIX):
                        remove_tree_at(legacy_fd, name)

    def _migrate(self, volume: Volume, image_fd: int, owner_ok: Callable[[int], bool]) -> None:
        for place in volume.places:
            src = open_below(self.layout.root, place.layout_path.relative_to(self.layout.root).parts)
            if src is None:
                remove_tree_at(image_fd, place.subdir)
                os.mkdir(place.subdir, 0o700, dir_fd=image_fd)
                continue
            with closing_fd(src):
                report = migrate_place(src, image_fd, place.subdir, owner_ok=owner_ok)
            log.info(
                "disk migration copied and verified a place %s",
                kv(volume=volume.key, place=place.subdir, files=report.files, bytes=report.bytes, skipped=len(report.skipped)),
            )
            for skipped in report.skipped[:20]:
                log.warning("disk migration left out an entry %s", kv(volume=volume.key, place=place.subdir, entry=skipped))
        fd = os.open(MIGRATED_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=image_fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.fsync(image_fd)
        crash_point("disk-migration-before-bind")

    def _bind_place(
        self,
        volume: Volume,
        subdir: str,
        target: Path,
        image_fd: int,
        legacy_fd: int,
        image_entry: MountEntry,
        entries: list[MountEntry],
        *,
        verified: bool,
    ) -> None:
        """`verified`: the old directory was copied and verified by this very call (what it
        left out, it left out on purpose)."""
        bound = top_mount_at(entries, target)
        if bound is not None and bound.device == image_entry.device and bound.root == f"/{subdir}":
            return  # adopted: bound by an earlier run
        if not _exists_at(image_fd, subdir):
            os.mkdir(subdir, 0o700, dir_fd=image_fd)
        parent_fd = _open_host_dir(self.layout, target.parent)
        with closing_fd(parent_fd):
            if _exists_at(parent_fd, target.name):
                # Copied into the image (the marker says so): out of the way, removed below, unless
                # it now holds something the image does not (written while the image was not
                # mounted): that is kept aside, never deleted.
                same = verified or self._same_as_image(parent_fd, target.name, image_fd, subdir)
                name = subdir if same else _kept_name(subdir)
                if name != subdir:
                    log.warning(
                        "disk place held data the image lacks: kept aside %s",
                        kv(volume=volume.key, place=subdir, kept=self.layout.disk_legacy(volume.key) / name),
                    )
                if _exists_at(legacy_fd, name):
                    remove_tree_at(legacy_fd, name)
                os.rename(target.name, name, src_dir_fd=parent_fd, dst_dir_fd=legacy_fd)
            os.mkdir(target.name, 0o700, dir_fd=parent_fd)
            with closing_fd(os.open(subdir, DIR_FLAGS, dir_fd=image_fd)) as source_fd:
                loopfs.bind(source_fd, parent_fd, target.name)
        log.info("disk place bound %s", kv(volume=volume.key, place=subdir, path=target))

    @staticmethod
    def _same_as_image(parent_fd: int, name: str, image_fd: int, subdir: str) -> bool:
        """Whether the old directory holds nothing but what the image's copy holds."""
        with closing_fd(os.open(name, DIR_FLAGS, dir_fd=parent_fd)) as old_fd:
            if not os.listdir(old_fd):
                return True
            with closing_fd(os.open(subdir, DIR_FLAGS, dir_fd=image_fd)) as copy_fd:
                return manifest_of(old_fd) == manifest_of(copy_fd)

    # --- changes ------------------------------------------------------------------------------

    def grow(self, volume: Volume, size_mb: int, *, stop_users: Callable[[], None]) -> bool:
        """Grow the volume's image to `size_mb`; True when done online. Without
        CAP_SYS_RESOURCE (online resize refused) the volume's sandboxes are stopped first
        (`stop_users`), its mounts taken down, the image checked and grown, and mounted again."""
        key = volume.key
        with self._lock(key):
            entry = self.image_mount(key)
            if entry is None:
                raise VolumeRefused(f"the volume {key} is not mounted")
            current = self.size_mb(key)
            problem = grow_problem(current, size_mb)
            if problem is not None:
                raise VolumeRefused(problem)
            if size_mb == current:
                return True
            image = self.layout.disk_image(key)
            if loopfs.can_resize_online():
                loopfs.grow_online(image, entry.source, size_mb)
                log.info("disk image grown online %s", kv(volume=key, from_mb=current, to_mb=size_mb))
                return True
            stop_users()
            self._ready.discard(key)
            for place in volume.places:
                loopfs.unmount(place.layout_path)
            loopfs.unmount(self.layout.disk_mount(key))
            deadline = time.monotonic() + OFFLINE_RELEASE_S
            while loopfs.image_attached(image):
                if time.monotonic() > deadline:
                    raise VolumeRefused(f"the volume {key} is still in use (a sandbox holds it); try again")
                time.sleep(0.05)
            loopfs.grow_offline(image, size_mb)
            log.info("disk image grown offline %s", kv(volume=key, from_mb=current, to_mb=size_mb))
            return False

    def ensure_socket_fs(self, socket_dir: Path, uid: int, gid: int) -> None:
        """The user's socket directory as a tmpfs of its own, mounted once (adopted after a
        restart). Its parent (`sockets/`) is root's; the directory is opened without following
        links and mounted on through /proc/self/fd."""
        key = f"socket:{socket_dir}"
        if key in self._ready:
            return
        with self._lock(key):
            if key in self._ready:
                return
            entry = top_mount_at(read_mounts(), socket_dir)
            if entry is None or entry.fstype != "tmpfs":
                parent_fd = _open_host_dir(self.layout, socket_dir.parent)
                with closing_fd(parent_fd):
                    if not _exists_at(parent_fd, socket_dir.name):
                        os.mkdir(socket_dir.name, 0o700, dir_fd=parent_fd)
                    loopfs.mount_tmpfs(parent_fd, socket_dir.name, size_kib=SOCKET_FS_KIB, inodes=SOCKET_FS_INODES, uid=uid, gid=gid)
                log.info("socket directory mounted %s", kv(path=socket_dir, size_kib=SOCKET_FS_KIB, inodes=SOCKET_FS_INODES))
            self._ready.add(key)

    def remove(self, volume: Volume) -> bool:
        """Unmount the volume's binds and image and delete the image (a purged user's); False
        when it had no image. Its places are left as empty mount points for the caller."""
        with self._lock(volume.key):
            self._ready.discard(volume.key)
            entries = read_mounts()
            image = self.image_mount(volume.key, entries)
            if image is not None:
                binds = [e for e in entries if e.device == image.device and e != image]
                for entry in sorted(binds, key=lambda e: -e.mount_id):
                    loopfs.unmount(entry.mount_point)
                loopfs.unmount(image.mount_point)
            path = self.layout.disk_image(volume.key)
            try:
                os.unlink(path)
            except FileNotFoundError:
                return False
            return True

    def unmount_all(self) -> int:
        """Unmount every image of this data dir and every bind of one (binds first); returns how
        many. Other mounts below the data dir (an operator's) are left alone."""
        with self._locks_guard:
            self._ready.clear()
        entries = read_mounts()
        images = [e for e in entries if self.layout.disk_mounts_dir in e.mount_point.parents]
        devices = {e.device for e in images}
        binds = [e for e in entries if e.device in devices and e not in images and self.layout.root in e.mount_point.parents]
        sockets = [e for e in entries if e.fstype == "tmpfs" and e.mount_point.parent == self.layout.sockets_root]
        for entry in sorted(binds, key=lambda e: -e.mount_id) + sorted(images, key=lambda e: -e.mount_id) + sockets:
            loopfs.unmount(entry.mount_point)
        return len(binds) + len(images) + len(sockets)


def _backing_file(device: str) -> Path | None:
    name = os.path.basename(device)
    try:
        with open(f"/sys/block/{name}/loop/backing_file", encoding="utf-8") as f:
            return Path(f.read().strip())
    except OSError:
        return None


def _kept_name(subdir: str) -> str:
    return f"{KEPT_PREFIX}{subdir}-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"


def _exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _make_host_dir(layout: DataLayout, path: Path) -> None:
    os.close(_open_host_dir(layout, path))


def _open_host_dir(layout: DataLayout, path: Path) -> int:
    """A directory below the data root, created 0700 where missing, never through a link."""
    fd = open_below(layout.root, path.relative_to(layout.root).parts, create=True)
    assert fd is not None
    return fd
