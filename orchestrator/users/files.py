"""Files the host writes into a user's own directories (a published artifact, a dump of the
session's user messages), owned by that user's sandbox uid so their sandbox can use them.

The user owns those directories and may have planted symlinks in them: the directory is
opened one component at a time with O_NOFOLLOW from the data root, and the file is written
with `mounts.fs.atomic_write.replace_file_at` relative to that descriptor: created with O_EXCL
under a temporary name, handed to the user's uid with `fchown` (never a path-based chown),
fsynced and renamed into place.
"""

from __future__ import annotations

from pathlib import Path

from mounts.fs.atomic_write import replace_file_at
from mounts.fs.nofollow import UnsafePath, closing_fd, open_below
from mounts.layout import DataLayout
from orchestrator.users.dirs import UserDirectories


class UserFileWriter:
    def __init__(self, layout: DataLayout, directories: UserDirectories) -> None:
        self._layout = layout
        self._directories = directories

    def write_new(self, user_id: int, directory: Path, name: str, data: bytes, *, mode: int) -> Path:
        """Write `directory/name` (a directory below the data root that exists and belongs to
        `user_id`). Raises `UnsafePath` when a component is not a plain directory."""
        parts = directory.relative_to(self._layout.root).parts
        dir_fd = open_below(self._layout.root, parts)
        if dir_fd is None:
            raise UnsafePath(str(directory), "does not exist")
        owner = None
        if self._directories.chown:
            uid = self._directories.sandbox_uid(user_id)
            owner = (uid, uid)
        with closing_fd(dir_fd):
            replace_file_at(dir_fd, name, data, mode=mode, owner=owner)
        return directory / name
