"""A session's skill links `runtime/{uid}/{sid}/skills/{name}`.

The directory belongs to the sandbox user, who can rename or replace anything in it while the
host works there. So the host never follows a symlink on the way: it opens each component
from `runtime/` with O_NOFOLLOW and then works only relative to the directory's descriptor
(symlinkat, renameat, unlinkat, readlinkat). The worst a sandbox can do is break its own links.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from mounts import ids
from mounts.fs.atomic_write import replace_symlink_at
from mounts.fs.nofollow import UnsafePath, closing_fd, open_below, remove_file_at
from mounts.layout import DataLayout
from mounts.skillstore.link_plan import plan_link_changes

TEMP_LINK_PREFIX = ".link-"

PrepareDir = Callable[[int, str], None]


class LinksDirUnavailable(Exception):
    """The session's skills directory is missing or is not a plain directory."""


def _default_prepare(layout: DataLayout) -> PrepareDir:
    def prepare(user_id: int, session_id: str) -> None:
        layout.session_skills_dir(user_id, session_id).mkdir(mode=0o700, parents=True, exist_ok=True)

    return prepare


class SessionLinker:
    def __init__(self, layout: DataLayout, prepare: PrepareDir | None = None) -> None:
        self.layout = layout
        # Creates `runtime/{uid}/{sid}/skills/` when missing (the orchestrator passes the
        # function that also gives it to the sandbox user).
        self._prepare = prepare or _default_prepare(layout)

    def managed_roots(self, user_id: int) -> tuple[str, str]:
        return (str(self.layout.user_views_dir(user_id)), str(self.layout.userskills_dir(user_id)))

    def link_path(self, user_id: int, session_id: str, name: str) -> str:
        return str(self.layout.session_skill_link(user_id, session_id, name))

    @contextmanager
    def _skills_dir(self, user_id: int, session_id: str, *, create: bool) -> Iterator[int]:
        root = self.layout.runtime_root
        path = self.layout.session_skills_dir(user_id, session_id)
        for attempt in (1, 2):
            try:
                fd = open_below(root, path.relative_to(root).parts)
            except FileNotFoundError:
                fd = None  # runtime/ itself is missing
            except UnsafePath as exc:
                raise LinksDirUnavailable(f"a component of the session's skills directory is not a directory: {exc}") from None
            if fd is None:
                if create and attempt == 1:
                    self._prepare(user_id, session_id)
                    continue
                raise LinksDirUnavailable(f"{path} is missing")
            with closing_fd(fd):
                yield fd
            return

    @staticmethod
    def _links(dir_fd: int) -> dict[str, str]:
        links = {}
        with os.scandir(dir_fd) as it:
            for entry in it:
                if entry.is_symlink():
                    try:
                        links[entry.name] = os.readlink(entry.name, dir_fd=dir_fd)
                    except FileNotFoundError:
                        pass
        return links

    def read(self, user_id: int, session_id: str) -> dict[str, str]:
        """The symlinks now in the session's skills directory (name -> target)."""
        try:
            with self._skills_dir(user_id, session_id, create=False) as fd:
                return {k: v for k, v in self._links(fd).items() if not k.startswith(TEMP_LINK_PREFIX)}
        except LinksDirUnavailable:
            return {}

    def verify(self, user_id: int, session_id: str, expected: Mapping[str, str]) -> bool:
        """Whether every expected link is in place (the cheap check of a warm sync)."""
        try:
            with self._skills_dir(user_id, session_id, create=False) as fd:
                for name, target in expected.items():
                    if os.readlink(name, dir_fd=fd) != target:
                        return False
                    # ...and it still leads to a directory (a view or a personal skill).
                    if not stat.S_ISDIR(os.stat(name, dir_fd=fd).st_mode):
                        return False
        except (LinksDirUnavailable, OSError):
            return False
        return True

    def apply(self, user_id: int, session_id: str, desired: Mapping[str, str]) -> dict[str, str]:
        """Make the managed links match `desired` (name -> absolute target).

        Returns name -> problem for links that could not be made; the others are in place.
        Managed links not in `desired` are removed; other symlinks and directories the sandbox
        put there stay (a skill's name is reserved: a plain file under it is replaced).
        """
        problems: dict[str, str] = {}
        with self._skills_dir(user_id, session_id, create=True) as fd:
            existing = self._links(fd)
            for name in [n for n in existing if n.startswith(TEMP_LINK_PREFIX)]:
                remove_file_at(fd, name)  # a killed run's temporary link
                existing.pop(name)
            changes = plan_link_changes(desired, existing, self.managed_roots(user_id))
            for name in changes.remove:
                remove_file_at(fd, name)
            for name, target in changes.create:
                try:
                    self._replace_link(fd, name, target)
                except OSError as exc:
                    problems[name] = f"cannot link {name}: {exc.strerror or exc}"
        return problems

    @staticmethod
    def _replace_link(dir_fd: int, name: str, target: str) -> None:
        # Over a directory the sandbox made there the rename fails (EISDIR): it is left alone.
        replace_symlink_at(dir_fd, name, target, temp=f"{TEMP_LINK_PREFIX}{ids.token(secrets.token_hex(8))}")

