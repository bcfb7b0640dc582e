"""Files the host writes into a user's own directories (a published artifact, a dump of the
session's user messages), owned by that user's sandbox uid so their sandbox can use them.

The user owns those directories and may have planted symlinks in them: the directory is
opened one component at a time with O_NOFOLLOW from the data root, and the file is written
with `mounts.fs.atomic_write.replace_file_at` relative to that descriptor: created with O_EXCL
under a temporary name, handed to the user's uid with `fchown` (never a path-based chown),
fsynced and renamed into place. A large file (`publish_artifact`'s copy) is streamed into a
spool file of the same directory instead (`spooled`), committed the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mounts.fs.atomic_write import Owner, replace_file_at
from mounts.fs.nofollow import UnsafePath, closing_fd, open_below
from mounts.fs.spool import FileSpool, spool_at
from mounts.layout import DataLayout
from orchestrator.users.dirs import UserDirectories


class UserFileWriter:
    def __init__(self, layout: DataLayout, directories: UserDirectories) -> None:
        self._layout = layout
        self._directories = directories

    def write_new(self, user_id: int, directory: Path, name: str, data: bytes, *, mode: int) -> Path:
        """Write `directory/name` (a directory below the data root that exists and belongs to
        `user_id`). Raises `UnsafePath` when a component is not a plain directory."""
        with closing_fd(self._open_dir(directory)) as dir_fd:
            replace_file_at(dir_fd, name, data, mode=mode, owner=self._owner(user_id))
        return directory / name

    @contextmanager
    def spooled(self, directory: Path, *, head_bytes: int) -> Iterator[FileSpool]:
        """A spool in `directory` (as for `write_new`) to stream a new file into; it becomes a
        file of the user with `commit`, and is removed if it was not."""
        with closing_fd(self._open_dir(directory)) as dir_fd, spool_at(dir_fd, head_bytes) as spool:
            yield spool

    def commit(self, user_id: int, spool: FileSpool, directory: Path, name: str, *, mode: int) -> Path:
        """The spool handed to the user's sandbox uid and renamed to `directory/name`."""
        spool.commit_at(name, mode=mode, owner=self._owner(user_id))
        return directory / name

    def _open_dir(self, directory: Path) -> int:
        parts = directory.relative_to(self._layout.root).parts
        dir_fd = open_below(self._layout.root, parts)
        if dir_fd is None:
            raise UnsafePath(str(directory), "does not exist")
        return dir_fd

    def _owner(self, user_id: int) -> Owner | None:
        if not self._directories.chown:
            return None
        uid = self._directories.sandbox_uid(user_id)
        return (uid, uid)
