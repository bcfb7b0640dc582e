"""The chat record store: `sessions/actor-{owner}/{scope}/session-{sha256}/chat/`.

Files: `owner.json` (the original id, owner and scope, checked on every access),
`messages.json`, `transcript.json`, and `deleted.json` (the tombstone). Every access walks
the path below the data root on directory fds without following symlinks (`mounts.fs.nofollow`),
so a symlink planted anywhere on the path or among the files is refused. Directories are
0700 and files 0600 from creation. Writes to one session are serialized by a lock per
session: a thread lock inside this process plus `flock` on the chat directory across
processes; each file is replaced atomically (temp + rename in the directory fd), so readers
never see a half-written file and need no lock.

Callers pass a `ChatKey` built from the session index row, never from client input: who may
see a session is decided before this module is asked to open anything.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from mounts.layout import DataLayout
from orchestrator.sessions.chat_records import (
    ChatMessage,
    NewMessage,
    Turn,
    append_records,
    decode_transcript,
    decode_window,
)
from orchestrator.errors import NotFound, OrchestratorError
from orchestrator.log import kv
from mounts.fs.atomic_write import FILE_MODE, TEMP_SUFFIX, replace_file_at
from mounts.fs.lock import holding
from mounts.fs.nofollow import (
    DIR_MODE,
    UnsafePath,
    closing_fd,
    entry_exists,
    open_below,
    open_dir_at,
    open_dirs,
    open_root,
    read_file_at,
    remove_file_at,
)
from mounts.fs.tree_removal import remove_tree_at

log = logging.getLogger(__name__)
T = TypeVar("T")

OWNER_FILE = "owner.json"
MESSAGES_FILE = "messages.json"
TRANSCRIPT_FILE = "transcript.json"
DELETED_FILE = "deleted.json"
CHAT_FILES = frozenset({OWNER_FILE, MESSAGES_FILE, TRANSCRIPT_FILE, DELETED_FILE})
# What a deleted session keeps: who it belonged to and that it is deleted (no reuse, no re-import).
KEPT_AFTER_DELETION = frozenset({OWNER_FILE, DELETED_FILE})


class ChatStorageRefused(OrchestratorError):
    """The chat path or a record is not what it must be (a planted symlink, FIFO, hard link,
    or an owner record naming another session). Nothing was followed or changed."""

    status_code = 500
    code = "chat_storage_refused"


class SessionIndexRow(Protocol):
    session_id: str
    owner_user_id: int
    project_id: str | None


@dataclass(frozen=True)
class ChatKey:
    """Where a session's records live; built from the trusted session index only."""

    session_id: str
    owner_user_id: int
    project_id: str | None

    @classmethod
    def of(cls, record: SessionIndexRow) -> ChatKey:
        return cls(record.session_id, record.owner_user_id, record.project_id)

    def owner_document(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "owner_user_id": self.owner_user_id, "project_id": self.project_id}


@dataclass(frozen=True)
class AppendResult:
    appended: int
    message_count: int
    last_seq: int
    transcript_turns: int


@dataclass(frozen=True)
class StorageProblem:
    path: str  # relative to the data root
    problem: str


class ChatStore:
    def __init__(self, layout: DataLayout, *, transcript_turns: int) -> None:
        self._layout = layout
        self._transcript_turns = transcript_turns
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
        self._locks_guard = threading.Lock()

    # paths and guards -----------------------------------------------------------------
    def chat_dir(self, key: ChatKey) -> str:
        return str(self._layout.session_chat_dir(key.owner_user_id, key.project_id, key.session_id))

    def _parts(self, key: ChatKey) -> tuple[str, ...]:
        path = self._layout.session_chat_dir(key.owner_user_id, key.project_id, key.session_id)
        return path.relative_to(self._layout.root).parts

    @contextmanager
    def _guard(self, key: ChatKey) -> Iterator[None]:
        try:
            yield
        except UnsafePath as exc:
            log.warning(
                "chat storage refused %s",
                kv(session=key.session_id, owner=key.owner_user_id, component=exc.component, reason=exc.reason),
            )
            raise ChatStorageRefused(
                f"the chat records of session {key.session_id} are not accessible: {exc.component} {exc.reason}"
            ) from None

    @contextmanager
    def _open_chat_dir(self, key: ChatKey, *, create: bool) -> Iterator[int | None]:
        fd = open_below(self._layout.root, self._parts(key), create=create)
        if fd is None:
            yield None
            return
        with closing_fd(fd):
            yield fd

    @contextmanager
    def _locked(self, key: ChatKey, dir_fd: int) -> Iterator[None]:
        with self._locks_guard:
            lock = self._locks.get(key.session_id)
            if lock is None:
                lock = threading.Lock()
                self._locks[key.session_id] = lock
        with lock:
            # flock serializes against other processes (a CLI, a cleanup subprocess); it is
            # released when the directory fd closes, even if this process is killed.
            with holding(dir_fd):
                yield

    def _check_owner(self, key: ChatKey, dir_fd: int, *, write_missing: bool) -> None:
        raw = read_file_at(dir_fd, OWNER_FILE)
        if raw is None:
            if write_missing:
                replace_file_at(dir_fd, OWNER_FILE, json.dumps(key.owner_document()).encode())
            return
        try:
            found = json.loads(raw)
        except ValueError:
            found = None
        if not isinstance(found, dict) or any(found.get(k) != v for k, v in key.owner_document().items()):
            raise UnsafePath(OWNER_FILE, "names another session or owner; refused")

    # writes --------------------------------------------------------------------------
    def init(self, key: ChatKey) -> None:
        """Create the chat directory with `owner.json`; idempotent for the same session."""
        with self._guard(key), self._open_chat_dir(key, create=True) as fd:
            assert fd is not None
            with self._locked(key, fd):
                self._check_owner(key, fd, write_missing=True)

    def append(self, key: ChatKey, new: Sequence[NewMessage], *, at: str) -> AppendResult:
        """Append messages and rewrite the transcript; refused once the session is deleted."""
        with self._guard(key), self._open_chat_dir(key, create=True) as fd:
            assert fd is not None
            with self._locked(key, fd):
                self._check_owner(key, fd, write_missing=True)
                if entry_exists(fd, DELETED_FILE):
                    # A late write that lost the race with a delete (the index said live).
                    raise NotFound(f"session {key.session_id} not found")
                self._drop_stale_temps(fd)
                try:
                    records = append_records(
                        key.session_id,
                        read_file_at(fd, MESSAGES_FILE),
                        new,
                        at=at,
                        turns_kept=self._transcript_turns,
                    )
                except (ValueError, KeyError, TypeError, IndexError):
                    raise UnsafePath(MESSAGES_FILE, "is not a valid chat record; refused") from None
                replace_file_at(fd, MESSAGES_FILE, records.messages_json)
                replace_file_at(fd, TRANSCRIPT_FILE, records.transcript_json)
        return AppendResult(
            appended=records.appended,
            message_count=records.message_count,
            last_seq=records.last_seq,
            transcript_turns=records.transcript_turns,
        )

    def mark_deleted(self, key: ChatKey, *, deleted_at: str, actor: str) -> None:
        """Write the tombstone `deleted.json` (idempotent: a second call keeps the first)."""
        with self._guard(key), self._open_chat_dir(key, create=True) as fd:
            assert fd is not None
            with self._locked(key, fd):
                self._check_owner(key, fd, write_missing=True)
                if read_file_at(fd, DELETED_FILE) is None:
                    document = {**key.owner_document(), "deleted_at": deleted_at, "actor": actor}
                    replace_file_at(fd, DELETED_FILE, json.dumps(document).encode())

    def remove_records(self, key: ChatKey) -> int:
        """Remove everything in the chat directory but the owner record and the tombstone."""
        with self._guard(key), self._open_chat_dir(key, create=False) as fd:
            if fd is None:
                return 0
            with self._locked(key, fd):
                self._check_owner(key, fd, write_missing=False)
                if not entry_exists(fd, DELETED_FILE):
                    raise UnsafePath(DELETED_FILE, "is missing; records are only removed after the tombstone")
                removed = 0
                for name in sorted(os.listdir(fd)):
                    if name not in KEPT_AFTER_DELETION:
                        removed += remove_tree_at(fd, name)
                return removed

    @staticmethod
    def _drop_stale_temps(dir_fd: int) -> None:
        # Under the session lock no other writer is mid-write here: any temp file is a crash leftover.
        for name in os.listdir(dir_fd):
            if name.startswith(".") and name.endswith(TEMP_SUFFIX):
                remove_file_at(dir_fd, name)

    # reads ----------------------------------------------------------------------------
    def _read(self, key: ChatKey, name: str) -> bytes | None:
        """A record of a live session; None when there is none (or the session is deleted)."""
        with self._guard(key), self._open_chat_dir(key, create=False) as fd:
            if fd is None:
                return None
            self._check_owner(key, fd, write_missing=False)
            if entry_exists(fd, DELETED_FILE):
                return None
            return read_file_at(fd, name)

    def messages(self, key: ChatKey) -> list[ChatMessage]:
        return self.message_window(key, None)[0]

    def message_window(self, key: ChatKey, last: int | None) -> tuple[list[ChatMessage], int]:
        """The last `last` messages (all when None), oldest first, and how many there are in all."""
        with self._guard(key):
            raw = self._read(key, MESSAGES_FILE)
            return _decoded(MESSAGES_FILE, raw, lambda data: decode_window(data, last), ([], 0))

    def transcript(self, key: ChatKey) -> list[Turn]:
        with self._guard(key):
            return _decoded(TRANSCRIPT_FILE, self._read(key, TRANSCRIPT_FILE), decode_transcript, [])

    def entries(self, key: ChatKey) -> list[str]:
        """Names in the chat directory (for operators and tests); [] when it does not exist."""
        with self._guard(key), self._open_chat_dir(key, create=False) as fd:
            return [] if fd is None else sorted(os.listdir(fd))

    # the start-up check -----------------------------------------------------------------
    def check(self) -> list[StorageProblem]:
        """Report every entry under `sessions/` whose type, mode or owner is wrong.

        Directories must be 0700 and files 0600, owned by this process's user; symlinks and
        special files must not exist. Nothing is followed and nothing is changed.
        """
        problems: list[StorageProblem] = []
        euid = os.geteuid()
        sessions_rel = self._layout.sessions_root.relative_to(self._layout.root).parts
        with closing_fd(open_root(self._layout.root)) as root:
            try:
                top = open_dirs(root, sessions_rel)
            except UnsafePath as exc:
                return [StorageProblem("/".join(sessions_rel), exc.reason)]
            if top is None:
                return []
        stack = [("/".join(sessions_rel), top)]
        problems.extend(_mode_problems(stack[0][0], os.fstat(top), euid))
        while stack:
            rel, fd = stack.pop()
            with closing_fd(fd):
                for name in sorted(os.listdir(fd)):
                    path = f"{rel}/{name}"
                    try:
                        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    problems.extend(_mode_problems(path, info, euid))
                    if stat.S_ISDIR(info.st_mode):
                        try:
                            child = open_dir_at(fd, name)
                        except (UnsafePath, OSError) as exc:
                            problems.append(StorageProblem(path, f"cannot be opened: {exc}"))
                            continue
                        if child is not None:
                            stack.append((path, child))
        return problems


def _decoded(name: str, raw: bytes | None, decode: Callable[[bytes], T], empty: T) -> T:
    if raw is None:
        return empty
    try:
        return decode(raw)
    except (ValueError, KeyError, TypeError):
        raise UnsafePath(name, "is not a valid chat record; refused") from None


def _mode_problems(path: str, info: os.stat_result, euid: int) -> list[StorageProblem]:
    mode = info.st_mode
    found = stat.S_IMODE(mode)
    if stat.S_ISLNK(mode):
        return [StorageProblem(path, "is a symlink (it would be refused, never followed)")]
    if stat.S_ISDIR(mode):
        expected = DIR_MODE
    elif stat.S_ISREG(mode):
        expected = FILE_MODE
    else:
        return [StorageProblem(path, "is a special file (FIFO, socket or device)")]
    problems = []
    if found != expected:
        problems.append(StorageProblem(path, f"has mode {found:04o}, expected {expected:04o}"))
    if info.st_uid != euid:
        problems.append(StorageProblem(path, f"is owned by uid {info.st_uid}, expected {euid}"))
    if stat.S_ISREG(mode) and info.st_nlink != 1:
        problems.append(StorageProblem(path, f"has {info.st_nlink} hard links, expected 1"))
    if stat.S_ISREG(mode) and path.rsplit("/", 1)[-1].endswith(TEMP_SUFFIX):
        problems.append(StorageProblem(path, "is a temporary file left by an interrupted write"))
    return problems
