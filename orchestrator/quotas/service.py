"""DiskQuotas: the one object the rest of the orchestrator asks about disk limits.

- `prepare(plan, sandbox_start=...)`, called by UserDirectories before a user's directories
  get their owners: the host watermark, then (loop) the user's, share's and the groups'
  images mounted and bound, or (scan) a host write of an over-quota user refused;
- `usage(user_id)` / `all_usage()`: DiskUsage against the quota (the admin route reads it, and
  so can /metrics);
- `set_disk_limit(...)`: grow online, refuse a shrink;
- `explain_no_space(...)`: a sandbox's no_space answer, told it is the quota and how full;
- `refuse_write(...)` and `scan_round()`: the non-root fallback;
- `members(...)`, `shared_round()`, `free_member(...)`: each member's share of share/ and of a
  group workspace (no member may fill one for everyone), measured by file owner and refused.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mounts import ids
from mounts.fs.nofollow import UnsafePath, closing_fd, open_below
from mounts.layout import GroupRef
from mounts.plan import MountPlan
from orchestrator.errors import Conflict, NotFound, OrchestratorError, ToolError
from orchestrator.log import kv
from orchestrator.quotas import loopfs
from orchestrator.quotas.model import (
    MIB,
    DiskUsage,
    Limits,
    MechanismChoice,
    MemberUsage,
    QuotaMechanism,
    Volume,
    anyone_may_be_over,
    choose_mechanism,
    free_pct,
    group_volume,
    member_share,
    members_of,
    needs_stop,
    no_space_message,
    over_share_message,
    share_volume,
    shared_no_space_message,
    user_volume,
    watermark_problem,
)
from orchestrator.quotas.member_files import Removal, remove_member_files
from orchestrator.quotas.scan import scan_usage, usage_by_owner
from orchestrator.quotas.volumes import LoopVolumes, VolumeRefused
from orchestrator.settings import DiskQuotaSettings
from orchestrator.startup_checks import StartupRefused

log = logging.getLogger(__name__)

# The container tools that only write: refused for an over-quota user in scan mode (shell stays,
# so the user can delete; a shell that writes is stopped again by the next scan).
WRITING_TOOLS = frozenset({"write_file", "write_bytes", "edit_file"})
# A shared place's no_space answer reuses a per-owner measure this young.
NO_SPACE_REMEASURE_S = 1.0


class HostDiskLow(OrchestratorError):
    """The data filesystem is below its free-space watermark."""

    status_code = 507
    code = "host_disk_low"


class OverQuota(OrchestratorError):
    """A host write for a user the usage scan found over its quota."""

    status_code = 507
    code = "no_space"


class QuotaChangeRefused(Conflict):
    code = "quota_change_refused"


@dataclass(frozen=True)
class HealthView:
    mechanism: str
    reason: str
    min_free_disk_pct: float
    host_free_pct: float
    watermark_problem: str | None
    over_quota_users: tuple[int, ...]
    over_share: dict[str, tuple[int, ...]]  # shared volume -> the members over their share there


@dataclass(frozen=True)
class SharedMembers:
    """A shared place's usage and each of its file owners against a member's share."""

    usage: DiskUsage
    members: list[MemberUsage]
    partial: bool  # the walk stopped at its bound: figures are lower bounds
    measured_at: float  # time.monotonic()


class DiskQuotas:
    def __init__(
        self,
        settings: DiskQuotaSettings,
        *,
        sandbox_uid: Callable[[int], int],
        stop_sandbox: Callable[[int], None] = lambda _user_id: None,
        loop_problem: Callable[[], str | None] = loopfs.loop_problem,
    ) -> None:
        self.settings = settings
        self.layout = settings.layout
        self._sandbox_uid = sandbox_uid
        self.is_root = os.geteuid() == 0
        try:
            self.choice: MechanismChoice = choose_mechanism(
                settings.mechanism, is_root=self.is_root, loop_problem=loop_problem() if self.is_root else None
            )
        except ValueError as exc:  # `loop` asked for where it cannot work: `serve` says so in one line
            raise StartupRefused(f"{exc}; use ORCH_DISK_QUOTA=scan or auto") from None
        self.loop = LoopVolumes(self.layout) if self.mechanism is QuotaMechanism.LOOP else None
        self.user_limits = Limits(settings.user_disk_quota_mb, settings.user_inode_quota)
        self.shared_limits = Limits(settings.shared_disk_quota_mb, settings.shared_inode_quota)
        self._over: set[int] = set()
        self._scanned: dict[int, DiskUsage] = {}
        self._over_lock = threading.Lock()
        # Shared volume key -> the members found over their share there (their writes refused).
        self._over_share: dict[str, frozenset[int]] = {}
        self._members: dict[str, SharedMembers] = {}
        # Shared volume key -> member -> its usage when the round last stopped its sandbox.
        self._stopped_at: dict[str, dict[int, MemberUsage]] = {}
        # Stops a user's sandbox: over quota (scan), before an offline grow (loop).
        self.stop_sandbox = stop_sandbox

    @property
    def mechanism(self) -> QuotaMechanism:
        return self.choice.mechanism

    # --- start and stop ---------------------------------------------------------------------

    def start(self) -> None:
        """Log the mechanism; with loop images adopt the mounted ones, mount the others, and
        give share/ and every existing group workspace their image (before any sandbox of this
        run mounts them)."""
        log.info(
            "disk quotas %s",
            kv(
                mechanism=self.mechanism.value,
                reason=self.choice.reason,
                user_disk_mb=self.user_limits.disk_mb,
                user_inodes=self.user_limits.inodes,
                min_free_disk_pct=self.settings.min_free_disk_pct,
            ),
        )
        if self.loop is None:
            return
        for key in self.loop.image_keys():
            volume = self._volume_of_key(key)
            if volume is not None:
                self.loop.ensure(volume, self._limits(volume), create=False, owner_ok=self._owner_check(volume))
        self._ensure_loop(share_volume(self.layout), create=True)
        for group in self._groups_on_disk():
            self._ensure_loop(group_volume(self.layout, group), create=True)

    def close(self) -> None:
        # Kept mounted by default: sandboxes (containers) may outlive this process, and the next
        # start adopts the mounts (docs/disk-quotas.md).
        if self.loop is not None and self.settings.unmount_on_close:
            count = self.loop.unmount_all()
            log.info("disk images unmounted %s", kv(mounts=count))

    # --- the hook of UserDirectories -------------------------------------------------------

    def prepare(self, plan: MountPlan, *, sandbox_start: bool) -> None:
        try:
            self.check_watermark()
        except HostDiskLow as exc:
            if sandbox_start:  # what the model sees as the tool's answer (a host write: the 507)
                raise ToolError(exc.code, f"The sandbox was not started: {exc.message}. The tool did not run.") from None
            raise
        if self.mechanism is QuotaMechanism.SCAN and not sandbox_start and plan.user_id in self._over:
            raise OverQuota(self._over_message(plan.user_id))
        if self.loop is None:
            return
        # A user's own image is made (and its data migrated) only when its sandbox starts: then
        # no sandbox of that user holds the old directories.
        self._ensure_loop(user_volume(self.layout, plan.user_id), create=sandbox_start)
        self._ensure_loop(share_volume(self.layout), create=not os.path.lexists(self.layout.share_dir))
        for mount in plan.mounts:
            if mount.purpose.startswith("group:"):
                channel, _, chat = mount.purpose.removeprefix("group:").partition("/")
                group = GroupRef(channel, chat)
                # A new workspace gets its image at once; an old one was given its image at start.
                self._ensure_loop(group_volume(self.layout, group), create=not os.path.lexists(mount.host_path))

    def ensure_socket_fs(self, user_id: int) -> None:
        """With loop images, the user's socket directory is a tiny tmpfs of its own: it is
        writable by the sandbox and outside its image (it must work when the image is full)."""
        if self.loop is None:
            return
        uid = ids.user_id(user_id)
        sandbox_uid = self._sandbox_uid(uid)
        self.loop.ensure_socket_fs(self.layout.socket_dir(uid), sandbox_uid, sandbox_uid)

    def check_host_write(self, user_id: int) -> None:
        self.check_watermark()
        if self.mechanism is QuotaMechanism.SCAN and user_id in self._over:
            raise OverQuota(self._over_message(user_id))

    def check_watermark(self) -> None:
        problem = self.watermark_refusal()
        if problem is not None:
            raise HostDiskLow(problem)

    def watermark_refusal(self) -> str | None:
        """Why a host write is refused now (None: enough is free); a refusal is logged."""
        problem = watermark_problem(self.host_free_pct(), self.settings.min_free_disk_pct)
        if problem is not None:
            log.error("host disk watermark: refused %s", kv(data_dir=self.layout.root, problem=problem))
        return problem

    def host_free_pct(self) -> float:
        return free_pct(os.statvfs(self.layout.root))

    # --- usage ------------------------------------------------------------------------------

    def usage(self, user_id: int) -> DiskUsage | None:
        """A user's disk and inode usage against its quota (None: nothing known yet, or off)."""
        uid = ids.user_id(user_id)
        if self.loop is not None:
            return self.loop.usage(user_volume(self.layout, uid).key)
        if self.mechanism is QuotaMechanism.SCAN:
            return self._scanned.get(uid) or self._scan_user(uid)
        return None

    def all_usage(self) -> list[DiskUsage]:
        """Every volume's usage (loop: each mounted image; scan: each user and each shared place
        of the last round)."""
        if self.loop is not None:
            found = [self.loop.usage(key) for key in self.loop.image_keys()]
            return [u for u in found if u is not None]
        shared = [self._members[key].usage for key in sorted(self._members)]
        return [self._scanned[uid] for uid in sorted(self._scanned)] + shared

    def image_mb(self, volume_key: str) -> int | None:
        """The size of a volume's image (its configured quota), None without loop images."""
        return self.loop.size_mb(volume_key) if self.loop is not None and self.loop.usage(volume_key) else None

    def set_disk_limit(self, user_id: int, disk_mb: int) -> tuple[DiskUsage, bool]:
        """Grow a user's image; returns its usage and whether it grew online (else its sandbox
        was stopped for the resize and starts again at the next call)."""
        uid = ids.user_id(user_id)
        if self.loop is None:
            raise QuotaChangeRefused(
                f"per-user limits change only with loop images (in force: {self.mechanism.value}); "
                "set ORCH_USER_DISK_QUOTA_MB for everyone"
            )
        volume = user_volume(self.layout, uid)
        key = volume.key
        if self.loop.usage(key) is None:
            raise NotFound(f"user {uid} has no mounted disk image yet (it is made when its sandbox first starts)")
        try:
            online = self.loop.grow(volume, disk_mb, stop_users=lambda: self.stop_sandbox(uid))
        except VolumeRefused as exc:
            raise QuotaChangeRefused(exc.reason, field="disk_mb") from None
        if not online:
            self._ensure_loop(volume, create=False)  # mounted and bound again, grown
        usage = self.loop.usage(key)
        assert usage is not None
        return usage, online

    def remove_user_volume(self, user_id: int) -> bool:
        """A purged user's image, unmounted and deleted (loop images only); False when there was none."""
        if self.loop is None:
            return False
        return self.loop.remove(user_volume(self.layout, ids.user_id(user_id)))

    def group_of_volume(self, key: str) -> GroupRef | None:
        """The chat a `group-...` volume belongs to (its name is a digest), None for another key
        or a group no longer on disk."""
        if not key.startswith("group-"):
            return None
        return next((g for g in self._groups_on_disk() if group_volume(self.layout, g).key == key), None)

    def explain_no_space(self, user_id: int, error: ToolError) -> ToolError:
        """A sandbox answered no_space: the same error, its message saying whose quota is full
        (in a shared place: who holds it and who can free it)."""
        shared = self._shared_volume_at(error.details.get("path"))
        if shared is not None:
            # A walk per failed write, at most one a second per place: members failing in a loop
            # against a full place cannot keep the host walking it.
            recent = self._members.get(shared.key)
            fresh = recent is not None and time.monotonic() - recent.measured_at < NO_SPACE_REMEASURE_S
            found = recent if fresh else self.members(shared)
            if found is None:
                return error
            holders = [m.as_dict() for m in found.members[:10]]
            message = shared_no_space_message(error.message, found.usage, found.members, user_id)
            return ToolError(error.code, message, **error.details, quota=found.usage.as_dict(), holders=holders)
        usage = self._own_usage(user_id)
        if usage is None:
            return error
        return ToolError(error.code, no_space_message(error.message, usage), **error.details, quota=usage.as_dict())

    def _own_usage(self, user_id: int) -> DiskUsage | None:
        if self.loop is None:
            return self._scanned.get(user_id) if self.mechanism is QuotaMechanism.SCAN else None
        return self.loop.usage(user_volume(self.layout, user_id).key)

    def _shared_volume_at(self, path: object) -> Volume | None:
        """The shared volume (share/, a group workspace) an absolute path a tool named lies in."""
        if not isinstance(path, str) or not path.startswith("/"):
            return None
        shown = Path(os.path.normpath(path))
        if shown == self.layout.share_dir or self.layout.share_dir in shown.parents:
            return share_volume(self.layout)
        if self.layout.groups_root in shown.parents:
            parts = shown.relative_to(self.layout.groups_root).parts
            try:
                return group_volume(self.layout, GroupRef(parts[0], parts[1]))
            except (IndexError, ValueError):
                return None
        return None

    # --- shared places: each member's share ---------------------------------------------------

    def shared_volume(self, key: str) -> Volume:
        """share/ or a group workspace by its volume key (as `GET /v1/admin/disk` lists them)."""
        volume = self._volume_of_key(key)
        if volume is None or volume.user_id is not None:
            raise NotFound(f"no shared place {key!r} (share, or group-... as GET /v1/admin/disk lists them)")
        return volume

    def members(self, volume: Volume) -> SharedMembers | None:
        """Each file owner's usage of a shared place against a member's share, measured now (a
        walk bounded by the place's inode quota); members over their share are recorded, so
        their writes there are refused. None when the place is not there (loop: not mounted)."""
        place = volume.places[0].layout_path
        if self.loop is not None:
            usage = self.loop.usage(volume.key)
            if usage is None:
                return None
        owners, partial = usage_by_owner(self.layout.root, place, max_entries=self.shared_limits.inodes + 1)
        if self.loop is None:
            usage = DiskUsage(
                volume=volume.key,
                mechanism=self.mechanism,
                bytes_used=sum(o.bytes_used for o in owners.values()),
                bytes_limit=self.shared_limits.disk_mb * MIB,
                inodes_used=sum(o.inodes_used for o in owners.values()),
                inodes_limit=self.shared_limits.inodes,
                partial=partial,
            )
        share = member_share(usage, self.settings.shared_member_share_pct)
        found = SharedMembers(usage, members_of(owners, share, self._user_of_uid), partial, time.monotonic())
        with self._over_lock:
            self._members[volume.key] = found
            over = frozenset(m.user_id for m in found.members if m.over_share and m.user_id is not None)
            self._over_share[volume.key] = over
            # A member found under its share (it deleted, or an admin freed it) starts afresh.
            stopped_at = self._stopped_at.get(volume.key, {})
            self._stopped_at[volume.key] = {user: usage for user, usage in stopped_at.items() if user in over}
        return found

    def shared_round(self) -> list[int]:
        """Measure every shared place by owner; stop the sandbox of each member found over its
        share, unless it was stopped at this usage already (its writes there are refused until
        it is under). Returns them. On loop images a place holding less than one share in all
        is not walked."""
        stopped = []
        for volume in self._shared_volumes():
            if self.loop is not None:
                usage = self.loop.usage(volume.key)
                share_pct = self.settings.shared_member_share_pct
                if usage is None or not anyone_may_be_over(usage, member_share(usage, share_pct)):
                    with self._over_lock:
                        self._over_share.pop(volume.key, None)
                    self._stopped_at.pop(volume.key, None)
                    continue
            found = self.members(volume)
            if found is None:
                continue
            last = self._stopped_at.get(volume.key, {})
            stopped_at: dict[int, MemberUsage] = {}  # members under their share are forgotten
            for member in found.members:
                if member.user_id is None or not member.over_share:
                    continue
                if not needs_stop(member, last.get(member.user_id)):
                    stopped_at[member.user_id] = last[member.user_id]
                    continue
                stopped_at[member.user_id] = member
                log.error(
                    "shared place: a member is over its share, writes there refused, stopping the sandbox %s",
                    kv(volume=volume.key, user=member.user_id, usage=member.summary(), of=found.usage.summary()),
                )
                self.stop_sandbox(member.user_id)
                log.info("shared place: sandbox stopped %s", kv(volume=volume.key, user=member.user_id))
                stopped.append(member.user_id)
            self._stopped_at[volume.key] = stopped_at
        return stopped

    def free_member(self, volume: Volume, user_id: int) -> tuple[Removal, SharedMembers | None]:
        """Remove every file of `user_id` from a shared place (admin), its sandbox stopped
        first so it writes nothing meanwhile; the place is measured again afterwards."""
        uid = ids.user_id(user_id)
        if not self.is_root:
            raise QuotaChangeRefused("a member's files in a shared place are told apart by owner, which needs a root orchestrator")
        self.stop_sandbox(uid)
        place = volume.places[0].layout_path
        try:
            place_fd = open_below(self.layout.root, place.relative_to(self.layout.root).parts)
        except (UnsafePath, OSError) as exc:
            raise NotFound(f"the shared place {volume.key} cannot be opened: {exc}") from None
        if place_fd is None:
            raise NotFound(f"the shared place {volume.key} does not exist yet")
        with closing_fd(place_fd):
            removal = remove_member_files(place_fd, self._sandbox_uid(uid), max_entries=2 * self.shared_limits.inodes + 2)
        log.info(
            "shared place: a member's files removed %s",
            kv(volume=volume.key, user=uid, removed=removal.removed, kept_dirs=removal.kept_dirs, complete=removal.complete),
        )
        return removal, self.members(volume)

    def _user_of_uid(self, uid: int) -> int | None:
        user_id = uid - self.settings.sandbox_uid_base
        return user_id if self.is_root and 0 < user_id <= self.settings.max_user_id else None

    def _shared_volumes(self) -> list[Volume]:
        return [share_volume(self.layout), *(group_volume(self.layout, g) for g in self._groups_on_disk())]

    # --- the scan fallback ------------------------------------------------------------------

    def refuse_write(self, user_id: int, tool: str, arguments: dict[str, object] | None = None) -> None:
        """Scan mode: an over-quota user's writing tools answer no_space until it is under. Any
        mechanism: so do a member's writes into a shared place where it is over its share."""
        if tool not in WRITING_TOOLS:
            return
        if user_id in self._over:
            raise ToolError("no_space", self._over_message(user_id))
        if self._over_share and arguments is not None:
            volume = self._shared_volume_at(arguments.get("path"))
            if volume is not None and user_id in self._over_share.get(volume.key, ()):
                member = next((m for m in self._members[volume.key].members if m.user_id == user_id), None)
                if member is not None:
                    raise ToolError("no_space", over_share_message(volume.key, member), quota=member.as_dict())

    def _over_message(self, user_id: int) -> str:
        usage = self._scanned.get(user_id)
        summary = usage.summary() if usage is not None else "over the limit"
        return (
            f"The disk quota of user {user_id} is exceeded ({summary} used); writes are refused until "
            "files are deleted (the shell still works for that)."
        )

    def scan_round(self) -> list[int]:
        """Scan every user's places; stop the sandbox of each one over its quota. Returns them."""
        stopped = []
        for uid in self._users_on_disk():
            usage = self._scan_user(uid)
            with self._over_lock:
                was_over = uid in self._over
                if usage.over_quota:
                    self._over.add(uid)
                else:
                    self._over.discard(uid)
            if usage.over_quota and not was_over:
                log.error("disk quota exceeded: writes refused, stopping the sandbox %s", kv(user=uid, usage=usage.summary()))
                self.stop_sandbox(uid)
                # Said once it is true: a stop takes seconds on a loaded host.
                log.info("disk quota exceeded: sandbox stopped %s", kv(user=uid))
                stopped.append(uid)
            elif was_over and not usage.over_quota:
                log.info("disk quota: back under the limit %s", kv(user=uid, usage=usage.summary()))
        return stopped

    def _scan_user(self, uid: int) -> DiskUsage:
        volume = user_volume(self.layout, uid)
        usage = scan_usage(
            self.layout.root,
            [p.layout_path for p in volume.places],
            volume=volume.key,
            bytes_limit=self.user_limits.disk_mb * MIB,
            inodes_limit=self.user_limits.inodes,
            max_entries=self.user_limits.inodes + 1,
        )
        self._scanned[uid] = usage
        return usage

    # --- health -----------------------------------------------------------------------------

    def health(self) -> HealthView:
        free = self.host_free_pct()
        return HealthView(
            mechanism=self.mechanism.value,
            reason=self.choice.reason,
            min_free_disk_pct=self.settings.min_free_disk_pct,
            host_free_pct=round(free, 2),
            watermark_problem=watermark_problem(free, self.settings.min_free_disk_pct),
            over_quota_users=tuple(sorted(self._over)),
            over_share={key: tuple(sorted(users)) for key, users in self._over_share.items() if users},
        )

    # --- helpers ----------------------------------------------------------------------------

    def _ensure_loop(self, volume: Volume, *, create: bool) -> None:
        assert self.loop is not None
        self.loop.ensure(volume, self._limits(volume), create=create, owner_ok=self._owner_check(volume))

    def _limits(self, volume: Volume) -> Limits:
        return self.user_limits if volume.user_id is not None else self.shared_limits

    def _owner_check(self, volume: Volume) -> Callable[[int], bool]:
        """Whose files the migration copies: the volume user's own (or, for a shared volume,
        any sandbox uid's); anyone else's file there is a hard link a sandbox made, left out."""
        if not self.is_root:
            own = os.geteuid()
            return lambda uid: uid == own
        if volume.user_id is not None:
            mine = self._sandbox_uid(volume.user_id)
            return lambda uid: uid == mine
        ranges = self.settings.sandbox_id_ranges
        return lambda uid: any(r.first <= uid <= r.last for r in ranges)

    def _volume_of_key(self, key: str) -> Volume | None:
        if key.startswith("user-") and key[5:].isdigit():
            return user_volume(self.layout, int(key[5:]))
        if key == "share":
            return share_volume(self.layout)
        group = self.group_of_volume(key)
        return group_volume(self.layout, group) if group is not None else None

    def _groups_on_disk(self) -> list[GroupRef]:
        groups = []
        try:
            channels = os.listdir(self.layout.groups_root)
        except FileNotFoundError:
            return []
        for channel in sorted(channels):
            try:
                chats = os.listdir(self.layout.group_channel_dir(channel))
            except (OSError, ValueError):
                continue
            for chat in sorted(chats):
                try:
                    groups.append(GroupRef(channel, chat))
                except ValueError:
                    continue
        return groups

    def _users_on_disk(self) -> list[int]:
        found: set[int] = set()
        for root in (self.layout.runtime_root, self.layout.uploads_root, self.layout.users_root,
                     self.layout.deps_root, self.layout.tmp_root):
            try:
                names = os.listdir(root)
            except FileNotFoundError:
                continue
            found.update(int(n) for n in names if n.isdigit() and 0 < int(n) <= self.settings.max_user_id)
        return sorted(found)
