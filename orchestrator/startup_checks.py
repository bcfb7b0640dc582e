"""Checks the service makes before it opens anything (docs/decisions.md, "Refusing to start").

- A lost state DB is not a fresh install: a data dir that holds users' state (homes, groups,
  sessions, runtime dirs, ...) but no valid `state/orchestrator.sqlite3` is refused, since an
  empty DB would hand out ids (group gids) that files on disk still carry.
- The data dir may not sit inside a directory that anyone but root and the orchestrator can
  write (such as /tmp): a sandbox uid could then rename or replace the path the host resolves
  as root.

Each check is a pure decider over what was looked up, plus a thin function that looks.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mounts.layout import DataLayout


class StartupRefused(RuntimeError):
    """The service must not start on this data dir; the message says why and what to do."""

    code = "startup_refused"


# Directories that only hold what users and groups made through a running service: any entry
# there means an old install. Not skills/, userskills/ or share/: an operator may seed those.
STATE_DIRS = ("users", "groups", "sessions", "runtime", "uploads", "deps", "outbox")
SQLITE_HEADER = b"SQLite format 3\x00"


def lost_state_problem(db: Path, header: bytes | None, populated: Sequence[str]) -> str | None:
    """`header`: the DB file's first 16 bytes (None: no file); `populated`: state dirs with entries."""
    if header == SQLITE_HEADER or not populated:
        return None
    what = "is missing" if header is None else ("is empty" if header == b"" else "is not an SQLite database")
    return (
        f"{db} {what} but the data dir holds state ({', '.join(populated)}): refusing to start as a fresh "
        "install, which would hand out ids that files on disk still carry; restore the DB from a backup "
        "(or move the data dir away to really start fresh)"
    )


def check_state_present(layout: DataLayout) -> None:
    db = layout.state_db
    try:
        with open(db, "rb") as f:
            header: bytes | None = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        header = None
    populated = [name for name in STATE_DIRS if _has_entries(layout.root / name)]
    problem = lost_state_problem(db, header, populated)
    if problem is not None:
        raise StartupRefused(problem)


def _has_entries(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is not None
    except (FileNotFoundError, NotADirectoryError):
        return False


@dataclass(frozen=True)
class PathOwner:
    path: str
    uid: int
    gid: int
    mode: int
    is_link: bool


@dataclass(frozen=True)
class IdRange:
    first: int
    last: int

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.first <= value <= self.last


def unsafe_ancestor_problem(
    chain: Iterable[PathOwner], *, own_gid: int, as_root: bool, sandbox_ids: Sequence[IdRange]
) -> str | None:
    """The first directory on the data dir's path that someone untrusted could change, if any."""
    for entry in chain:
        if entry.is_link:
            continue  # a symlink's own mode means nothing; its directory and target are checked
        sandbox_owned = any(entry.uid in ids for ids in sandbox_ids)
        sandbox_group = any(entry.gid in ids for ids in sandbox_ids)
        if entry.mode & stat.S_IWOTH:
            why = "is writable by every user"
        elif sandbox_owned:
            why = f"is owned by sandbox uid {entry.uid}"
        elif entry.mode & stat.S_IWGRP and (sandbox_group or entry.gid not in (0, own_gid)):
            why = f"is writable by group {entry.gid}"
        elif as_root and entry.uid != 0:
            why = f"is owned by uid {entry.uid}, not root"
        else:
            continue
        return (
            f"the data dir's ancestor {entry.path} {why}: a sandbox could swap the paths the orchestrator "
            "uses; put ORCH_DATA_DIR in a directory only root and the orchestrator can write (not /tmp)"
        )
    return None


def path_chain(data_dir: Path) -> list[PathOwner]:
    """Every existing directory from / to the data dir, as named and as resolved (no-follow)."""
    named = Path(os.path.abspath(data_dir))
    paths: list[Path] = []
    for candidate in (named, Path(os.path.realpath(named))):
        paths += [*reversed(candidate.parents), candidate]
    chain, seen = [], set()
    for path in paths:
        if path in seen:
            continue
        seen.add(path)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        chain.append(PathOwner(str(path), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), stat.S_ISLNK(st.st_mode)))
    return chain


def check_data_dir_location(data_dir: Path, *, sandbox_ids: Sequence[IdRange]) -> None:
    problem = unsafe_ancestor_problem(
        path_chain(data_dir), own_gid=os.getegid(), as_root=os.geteuid() == 0, sandbox_ids=sandbox_ids
    )
    if problem is not None:
        raise StartupRefused(problem)
