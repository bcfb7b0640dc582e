"""Files a bot uploads from the chat into a sandbox (`PUT /v1/runs/{run_id}/files/incoming/{name}`).

Two places, chosen by the route's `scope`:
- `personal` (default): `runtime/{uid}/{sid}/incoming/` of the run's runtime user. The
  directory is the sandbox's own (its uid, 0700), so it may hold anything that user's shell
  planted: the host (root) reaches it from the data root on directory fds with O_NOFOLLOW,
  creates the file under a temporary name with O_CREAT|O_EXCL|O_NOFOLLOW, chowns it to the
  sandbox uid (0600) and renames it into place with RENAME_NOREPLACE. A symlink planted at the
  name is never followed or replaced: the upload takes the next free name (`x-2.png`).
- `group`: the group chat's own files, `groups/{channel}/{chat_id}/chat-files/{YYYY-MM-DD}/`
  (the date in UTC). These belong to the chat, not to one member: `chat-files/` and its date
  directories are root-owned with the workspace's gid, 2750, files 0640, so every member's
  sandbox reads them and none can change, remove or plant anything in them. The workspace
  itself is writable by members, so one may squat the name `chat-files` before the chat's
  first group upload (a directory of its own, a symlink, a file): the host moves such an
  entry aside (renameat on the workspace's fd, never following it) to
  `chat-files.planted-{time}-{hex}`, where its owner still sees and can remove it, and makes
  its own directory in its place.

The body is streamed to disk; more than the cap is a 413 and leaves nothing behind. The
answer is the path to hand the model (sandboxes see the data dir at the same absolute path).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path

from mounts.fs.nofollow import UnsafePath, closing_fd, open_dirs, open_root, remove_file_at
from mounts.fs.rename_swap import rename_noreplace
from mounts.layout import DataLayout, GroupRef
from mounts.plan import plan_mounts
from orchestrator.errors import Conflict, InvalidInput, OrchestratorError
from orchestrator.log import kv
from orchestrator.runs.records import RunRecord
from orchestrator.users.dirs import UserDirectories
from orchestrator.users.group_gids import GroupGids

log = logging.getLogger(__name__)

NAME_MAX_BYTES = 200
MAX_RENAMES = 100  # `name-2` ... `name-100`, then the upload is refused
RECLAIM_ATTEMPTS = 3  # a squatted shared directory moved aside this often, then refused
CHAT_FILES = "chat-files"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UploadScope(str, Enum):
    PERSONAL = "personal"
    GROUP = "group"


class UploadTooLarge(OrchestratorError):
    status_code = 413
    code = "payload_too_large"  # the code of the request guard's 413 too


class InsufficientStorage(OrchestratorError):
    status_code = 507
    code = "insufficient_storage"


_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def _no_room(exc: OSError) -> InsufficientStorage:
    # The sandbox shares the filesystem (and may have filled it on purpose): a refusal the bot
    # can tell its user, not an internal error. The temporary file is removed by `abort`.
    return InsufficientStorage(f"no room for the upload on the data filesystem ({exc.strerror}); nothing was written")


class UnsafeUploadDirectory(Conflict):
    code = "unsafe_directory"


class NoFreeName(Conflict):
    code = "already_exists"


def upload_name(value: str) -> str:
    """One path segment a model can type: printable, no separator, no control character, not
    `.`/`..` nor dot-led (hidden, and the temporary names are), at most NAME_MAX_BYTES."""
    problem = None
    if not value or value in (".", ".."):
        problem = "must not be empty, '.' or '..'"
    elif value.startswith("."):
        problem = "must not start with '.'"
    elif "/" in value or "\\" in value:
        problem = "must be one path segment (no '/' or '\\')"
    elif any(not ch.isprintable() for ch in value):
        problem = "must not contain control or other non-printable characters"
    else:
        try:
            if len(value.encode("utf-8")) > NAME_MAX_BYTES:
                problem = f"must be at most {NAME_MAX_BYTES} bytes in UTF-8"
        except UnicodeEncodeError:
            problem = "must be valid Unicode text"
    if problem is not None:
        raise InvalidInput(f"the file name {problem}", field="name")
    return value


def candidate_names(name: str) -> list[str]:
    """`name`, then `stem-2.ext`, `stem-3.ext`, ... (pure)."""
    stem, dot, ext = name.rpartition(".")
    if not stem:  # no extension (or only a leading dot, which upload_name refuses)
        stem, dot, ext = name, "", ""
    names = [name]
    for n in range(2, MAX_RENAMES + 1):
        names.append(f"{stem}-{n}{dot}{ext}")
    return names


@dataclass(frozen=True)
class Destination:
    """Where an upload goes: the directory (below the data root), and the file's owner and mode."""

    directory: Path
    uid: int | None  # None: leave as created (not root)
    gid: int | None
    mode: int
    # group scope: the directories below the group workspace, created root:gid 2750
    shared_parts: tuple[str, ...] = ()


def personal_destination(layout: DataLayout, user_id: int, session_id: str, sandbox_uid: int | None) -> Destination:
    return Destination(layout.incoming_dir(user_id, session_id), sandbox_uid, sandbox_uid, 0o600)


def group_destination(layout: DataLayout, group: GroupRef, gid: int | None, now: datetime) -> Destination:
    day = now.astimezone(timezone.utc).strftime("%Y-%m-%d")
    return Destination(layout.group_dir(group), 0 if gid is not None else None, gid, 0o640, (CHAT_FILES, day))


class IncomingUpload:
    """One upload in progress: `write` chunks, then `commit` (or `abort`)."""

    def __init__(self, layout: DataLayout, destination: Destination, name: str, max_bytes: int) -> None:
        self._destination = destination
        self._name = upload_name(name)
        self._max = max_bytes
        self.size = 0
        self._dir_fd = _open_destination(layout, destination)
        self._temp = f".upload-{secrets.token_hex(8)}.tmp"
        self._placed = False
        try:
            self._fd = os.open(self._temp, _CREATE, 0o600, dir_fd=self._dir_fd)
        except OSError as exc:
            os.close(self._dir_fd)
            if exc.errno in _NO_ROOM:  # no inode left: the sandbox filled it with files
                raise _no_room(exc) from None
            raise
        except BaseException:
            os.close(self._dir_fd)
            raise

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self._max:
            raise UploadTooLarge(f"the upload is larger than {self._max} bytes (ORCH_UPLOAD_MAX_BYTES)")
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            if exc.errno in _NO_ROOM:
                raise _no_room(exc) from None
            raise

    def commit(self) -> Path:
        """Owner, mode, fsync, then the first free name; the path the model is handed."""
        d = self._destination
        if d.uid is not None and d.gid is not None:
            os.fchown(self._fd, d.uid, d.gid)
        os.fchmod(self._fd, d.mode)
        try:
            os.fsync(self._fd)  # delayed allocation: a full disk may show only here
        except OSError as exc:
            if exc.errno in _NO_ROOM:
                raise _no_room(exc) from None
            raise
        os.close(self._fd)
        self._fd = -1
        try:
            for candidate in candidate_names(self._name):
                try:
                    rename_noreplace(self._dir_fd, self._temp, candidate)
                except FileExistsError:
                    continue  # taken: by an earlier upload, or by whatever the sandbox planted
                self._placed = True  # the temporary name is free again: whatever appears there is not ours
                return d.directory.joinpath(*d.shared_parts, candidate)
            raise NoFreeName(f"{self._name} and {MAX_RENAMES - 1} numbered variants exist already")
        finally:
            self.abort()

    def abort(self) -> None:
        """Remove the temporary file (after a commit there is none) and close everything.

        In `personal` scope the directory is the sandbox's: while the body streamed, its shell
        may have moved the temporary file away and put a directory (or anything) at its name.
        Such an entry is the sandbox's own and stays; it never turns the caller's answer into
        a 500 nor keeps the directory's descriptor open."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._dir_fd < 0:
            return
        try:
            if not self._placed:
                remove_file_at(self._dir_fd, self._temp)
        except OSError as exc:
            log.warning("upload temporary name not removed %s", kv(name=self._temp, error=exc.strerror))
        finally:
            os.close(self._dir_fd)
            self._dir_fd = -1


def _open_destination(layout: DataLayout, destination: Destination) -> int:
    parts = destination.directory.relative_to(layout.root).parts
    try:
        with closing_fd(open_root(layout.root)) as root_fd:
            fd = open_dirs(root_fd, parts)
    except UnsafePath as exc:
        raise UnsafeUploadDirectory(f"{destination.directory} is not a plain directory ({exc}); nothing was written") from None
    if fd is None:
        raise UnsafeUploadDirectory(f"{destination.directory} does not exist; nothing was written")
    for part in destination.shared_parts:
        fd = _shared_dir(fd, part, destination)  # closes the parent, also when it raises
    return fd


def quarantine_name(name: str, now: datetime) -> str:
    """Where a planted `name` is moved aside (pure): next to it, visible to its owner."""
    return f"{name}.planted-{now.astimezone(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


def planted_problem(st: os.stat_result, *, uid: int | None, created: bool) -> str | None:
    """Why the directory opened at a shared part's name is not the host's own (None: it is),
    judged on its open descriptor (pure). Not root (`uid` None): any directory will do."""
    if uid is None:
        return None
    if st.st_uid != uid:
        return f"it belongs to uid {st.st_uid}"
    if not created and st.st_mode & 0o022:
        return f"it is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _shared_dir(parent_fd: int, name: str, destination: Destination) -> int:
    """`name` below `parent_fd` as a root-owned (when root), group-readable directory: made if
    missing. Anything else at the name (a member of the group workspace squatting it with a
    directory, a symlink or a file) is renamed aside within the workspace, never followed nor
    written into, and a fresh directory made in its place. Closes `parent_fd`."""
    with closing_fd(parent_fd):
        for _ in range(RECLAIM_ATTEMPTS):
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)  # 0700 until its owner and mode are set below
                created = True
            except FileExistsError:
                created = False
            try:
                fd = os.open(name, _DIR, dir_fd=parent_fd)
            except FileNotFoundError:
                continue  # removed by its owner between the two: make it again
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                _move_aside(parent_fd, name, "it is not a directory")
                continue
            problem = planted_problem(os.fstat(fd), uid=destination.uid, created=created)
            if problem is None:
                return _claimed(fd, destination)
            os.close(fd)
            _move_aside(parent_fd, name, problem)
    raise UnsafeUploadDirectory(
        f"{name} in the group workspace was planted again each of {RECLAIM_ATTEMPTS} times it was moved aside; "
        "nothing was written"
    )


def _move_aside(parent_fd: int, name: str, problem: str) -> None:
    # renameat on the parent's fd moves the entry itself: a symlink is moved, never followed.
    aside = quarantine_name(name, datetime.now(timezone.utc))
    try:
        rename_noreplace(parent_fd, name, aside)
    except FileNotFoundError:
        return  # gone already: the next attempt makes the directory
    log.warning("planted upload directory moved aside %s", kv(name=name, moved_to=aside, problem=problem))


def _claimed(fd: int, destination: Destination) -> int:
    """The host's own directory, given the chat's owner, group and mode (on its descriptor)."""
    try:
        st = os.fstat(fd)
        if destination.uid is not None and destination.gid is not None and (st.st_uid, st.st_gid) != (destination.uid, destination.gid):
            os.fchown(fd, destination.uid, destination.gid)
        if stat.S_IMODE(st.st_mode) != 0o2750:
            os.fchmod(fd, 0o2750)
    except BaseException:
        os.close(fd)
        raise
    return fd


class IncomingFiles:
    """Starts uploads for a run: picks and prepares the destination of the scope."""

    def __init__(self, layout: DataLayout, directories: UserDirectories, group_gids: GroupGids, max_bytes: int) -> None:
        self._layout = layout
        self._directories = directories
        self._group_gids = group_gids
        self.max_bytes = max_bytes

    def begin(self, run: RunRecord, group: GroupRef | None, name: str, scope: UploadScope) -> IncomingUpload:
        name = upload_name(name)
        user = run.runtime_user_id
        self._directories.check_host_write(user)
        if scope is UploadScope.PERSONAL:
            self._directories.ensure_session_runtime(user, run.session_id, is_owner=user == run.owner_user_id)
            sandbox_uid = self._directories.sandbox_uid(user) if self._directories.chown else None
            destination = personal_destination(self._layout, user, run.session_id, sandbox_uid)
        else:
            if group is None:
                raise InvalidInput("scope=group needs a run of a group chat's session", field="scope")
            gid = self._group_gids.gid_of(group) if self._directories.chown else None
            # The workspace with its policy, as the member's sandbox would get it.
            plan = plan_mounts(self._layout, user, [group], {group: gid} if gid is not None else None)
            self._directories.ensure_sandbox_dirs(plan)
            destination = group_destination(self._layout, group, gid, datetime.now(timezone.utc))
        return IncomingUpload(self._layout, destination, name, self.max_bytes)
