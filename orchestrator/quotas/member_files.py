"""Removing one member's files from a shared place (share/, a group workspace), as root, below a
directory every member's sandbox can write.

Only directory-fd operations, never a path: each directory is opened with O_NOFOLLOW and checked
to be the inode that was listed, each entry is lstat()ed and unlinked at its directory's fd (a
planted symlink is removed as a link, its target untouched). The walk descends into every
directory (a member's files may sit in another's directory) and removes the member's own
directories once empty; one still holding others' files is kept. It is the usage scan's walk
(`scan.Walk`): it never leaves the place's filesystem, holds open only the directories on the
current path and stops after `max_entries` or below MAX_DEPTH levels.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from mounts.fs.nofollow import remove_file_at
from orchestrator.quotas.scan import Walk


@dataclass(frozen=True)
class Removal:
    removed: int  # entries (files, links, directories) of the member removed
    kept_dirs: int  # the member's directories kept: they still hold others' files
    complete: bool  # False: stopped at its bound or a nesting deeper than MAX_DEPTH


def remove_member_files(place_fd: int, uid: int, *, max_entries: int) -> Removal:
    """Remove every entry owned by `uid` below the directory `place_fd` (not the place itself)."""
    walk = Walk(max_entries)
    removed = kept = 0
    for dir_fd, name, st, left in walk.entries(place_fd):
        if st.st_uid != uid:
            continue
        if not stat.S_ISDIR(st.st_mode):
            removed += int(remove_file_at(dir_fd, name))  # a link is unlinked, never followed
        elif left:
            try:
                os.rmdir(name, dir_fd=dir_fd)
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                kept += 1  # still holds another member's files
    return Removal(removed=removed, kept_dirs=kept, complete=not walk.partial)
