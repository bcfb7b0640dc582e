"""Files the host writes into a user's own directories (a published artifact, a dump of the
session's user messages), owned by that user's sandbox uid so their sandbox can use them.

The user owns those directories and may have planted symlinks in them: the directory is
opened one component at a time with O_NOFOLLOW from the data root, the file is created with
O_EXCL under a temporary name relative to that descriptor, handed to the user's uid with
`fchown` (never a path-based chown), and renamed into place.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from mounts.layout import DataLayout
from mounts.fs.nofollow import UnsafePath, closing_fd, open_dirs, open_root, remove_file_at
from orchestrator.users.dirs import UserDirectories

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UserFileWriter:
    def __init__(self, layout: DataLayout, directories: UserDirectories) -> None:
        self._layout = layout
        self._directories = directories

    def write_new(self, user_id: int, directory: Path, name: str, data: bytes, *, mode: int) -> Path:
        """Write `directory/name` (a directory below the data root that exists and belongs to
        `user_id`). Raises `UnsafePath` when a component is not a plain directory."""
        parts = directory.relative_to(self._layout.root).parts
        with closing_fd(open_root(self._layout.root)) as root_fd:
            dir_fd = open_dirs(root_fd, parts)
        if dir_fd is None:
            raise UnsafePath(str(directory), "does not exist")
        with closing_fd(dir_fd):
            temp = f".{name}.{secrets.token_hex(6)}.tmp"
            fd = os.open(temp, _CREATE_FLAGS, 0o600, dir_fd=dir_fd)
            try:
                with closing_fd(fd):
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    if self._directories.chown:
                        uid = self._directories.sandbox_uid(user_id)
                        os.fchown(fd, uid, uid)
                    os.fchmod(fd, mode)
                    os.fsync(fd)
                os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                remove_file_at(dir_fd, temp)
                raise
        return directory / name
