"""Creating a user's directories on the host (the imperative side of SPEC §2 / §13).

When the orchestrator runs as root, a user's read-write directories belong to that user's
own unprivileged sandbox uid (base + user id), so the operating system keeps users apart,
not only the PathSandbox.
"""

from __future__ import annotations

import os
from pathlib import Path

from mounts.layout import COMPACTION_SUBDIR, RUNTIME_SUBDIRS, DataLayout


class UserDirectories:
    def __init__(self, layout: DataLayout, uid_base: int) -> None:
        self.layout = layout
        self.uid_base = uid_base
        self.chown = os.geteuid() == 0

    def sandbox_uid(self, user_id: int) -> int:
        return self.uid_base + user_id

    def _private_dir(self, path: Path, user_id: int) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        if self.chown:
            uid = self.sandbox_uid(user_id)
            stat = path.stat()
            if stat.st_uid != uid or stat.st_gid != uid:
                os.chown(path, uid, uid)
        os.chmod(path, 0o700)
        return path

    def ensure_session_runtime(self, user_id: int, session_id: str, *, is_owner: bool) -> Path:
        """`runtime/{uid}/{sid}/` with its subdirectories; `compaction/` only for the owner (D6)."""
        self._private_dir(self.layout.runtime_user_dir(user_id), user_id)
        workdir = self._private_dir(self.layout.runtime_dir(user_id, session_id), user_id)
        for sub in RUNTIME_SUBDIRS:
            self._private_dir(workdir / sub, user_id)
        if is_owner:
            self._private_dir(workdir / COMPACTION_SUBDIR, user_id)
        return workdir

    def ensure_uploads(self, user_id: int) -> Path:
        path = self._private_dir(self.layout.uploads_dir(user_id), user_id)
        # Uploads are served publicly by the orchestrator, not by other sandboxes.
        return path
