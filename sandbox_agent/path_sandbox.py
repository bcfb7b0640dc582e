"""PathSandbox: every path of every tool is resolved *and opened* in one step
against the allowed roots, and the tools then work on the file descriptor.

How a path is resolved:
1. It is joined with the cwd (not normalized: `..` stays a real step) and split into
   components; empty and `.` components are dropped.
2. The allowed root whose components are a prefix of the path is chosen (component-wise, so
   `uploads/1` never matches `uploads/10`). Each root is held open as an O_PATH fd.
3. Fast path: `openat2(root_fd, rest, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: the kernel
   follows symlinks and `..` but refuses anything that would leave the root, with no window
   between check and open.
4. When that fails because a symlink leaves the root (EXDEV/ELOOP), or the kernel has no
   openat2, a walk resolves component by component with O_NOFOLLOW on held directory fds,
   reads link targets with readlinkat, re-roots absolute targets into the allowed root that
   contains them (a session's `skills/x` link into `skill-views/{uid}/x`), refuses `..`
   above a root and gives up after 40 links. `..` never touches the disk: it pops a held fd.
5. A link found in a *shared* root (`share/`, a group workspace: every member can plant one)
   may only resolve within that same root: the kernel's RESOLVE_BENEATH from that root's fd
   does exactly this, and the walk refuses to re-root such a link or to climb out of the root
   with it (`symlink_escape`). The user's own links (in private roots) may cross roots.

Never a string prefix check on a realpath: that is raced by swapping a symlink between the
check and the open (CVE-2018-15664). Writes are allowed only when the directory the object
finally lands in belongs to a read-write root.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from sandbox_agent import syscalls
from sandbox_agent.diagnostics import diagnose, shared_link_escape
from sandbox_agent.errors import AgentToolError
from sandbox_agent.names import unescape_path
from sandbox_agent.wire import TOOL_PATH_MAX

MAX_SYMLINK_HOPS = 40  # like the kernel's limit
MAX_RACE_RETRIES = 64  # a component that keeps flipping between link and directory
NAME_MAX = 255
PATH_BYTES_MAX = TOOL_PATH_MAX - 1  # PATH_MAX counts the terminating NUL
QUOTED_PATH_MAX = 200  # characters of a refused argument quoted back; longer ones are cut

_RESOLVE = syscalls.RESOLVE_BENEATH | syscalls.RESOLVE_NO_MAGICLINKS
# EXDEV: a step would leave the root (absolute link, `..`, link outside); ELOOP: too many links
# or a magic link; EAGAIN: a concurrent rename made `..` unsafe; ENAMETOOLONG: the rest below
# the root is longer than PATH_MAX (a relative argument near the limit joined with the cwd),
# which the walk opens name by name. The walk decides them all.
_WALK_ERRNOS = frozenset({errno.EXDEV, errno.ELOOP, errno.EAGAIN, errno.ENAMETOOLONG})

READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: opening a FIFO must not hang
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
PATH_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC

Resolver = Literal["auto", "openat2", "walk"]


def is_shared_purpose(purpose: str) -> bool:
    """Roots every member's sandbox can write (the mount plan's `share` and `group:...`)."""
    return purpose == "share" or purpose.startswith("group:")


@dataclass(frozen=True)
class Root:
    path: str
    writable: bool
    purpose: str = ""

    @property
    def shared(self) -> bool:
        return is_shared_purpose(self.purpose)


class _Escape(Exception):
    """Resolution left every allowed root; `at` is where (lexically normalized)."""

    def __init__(self, at: str) -> None:
        super().__init__(at)
        self.at = at


class _SharedLinkEscape(Exception):
    """A link found in shared root `root` points out of it (to `target`)."""

    def __init__(self, root: Root, target: str) -> None:
        super().__init__(target)
        self.root = root
        self.target = target


def stays_beneath(depth: int, target_parts: list[str]) -> bool:
    """Whether a relative link target, met `depth` directories below its root, stays in it
    (`..` is lexical in the walk: it pops a held directory)."""
    for part in target_parts:
        depth = depth - 1 if part == ".." else depth + 1
        if depth < 0:
            return False
    return True


class Opened:
    """An open fd inside an allowed root; `path` is how the model should see it."""

    __slots__ = ("fd", "root", "_parts", "_path", "given")

    def __init__(self, fd: int, root: Root, parts: list[str], given: str) -> None:
        self.fd = fd
        self.root = root
        self._parts = parts
        self._path: str | None = None
        self.given = given  # the path argument as resolved (the unescaped form when that one was found)

    @property
    def path(self) -> str:
        if self._path is None:  # computed on demand: not part of the hot resolve-and-open path
            self._path = shown_path(self._parts)
        return self._path

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Opened:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@dataclass
class WriteTarget:
    """Where a write lands: a held directory fd in a read-write root and a final name that is
    not a symlink (links at the final name were followed while resolving)."""

    dir_fd: int
    name: str
    root: Root
    path: str
    existing: os.stat_result | None

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def __enter__(self) -> WriteTarget:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _split(path: str) -> list[str]:
    parts = path.split("/")
    if "" in parts or "." in parts:
        return [p for p in parts if p and p != "."]
    return parts


def quoted(path: str) -> str:
    """How a refusal names a path argument it could not resolve: as sent, cut with `...`
    when long (a name that is not UTF-8 is escaped on the wire, sandbox_agent/names.py)."""
    return path if len(path) <= QUOTED_PATH_MAX else path[:QUOTED_PATH_MAX] + "..."


def shown_path(parts: list[str]) -> str:
    """How a path is quoted back to the model: absolute and lexically normalized."""
    return posixpath.normpath("/" + "/".join(parts))


class PathSandbox:
    def __init__(
        self,
        roots: Iterable[Root],
        *,
        data_root: str,
        user_id: int,
        resolver: Resolver = "auto",
    ) -> None:
        self.data_root = posixpath.normpath(data_root)
        self.user_id = user_id
        if resolver == "openat2" and not syscalls.OPENAT2_AVAILABLE:
            raise RuntimeError("resolver 'openat2' requested but this kernel has no openat2(2)")
        self.use_openat2 = resolver != "walk" and syscalls.OPENAT2_AVAILABLE
        self.roots: list[Root] = []
        self._root_fds: list[int | None] = []
        self._by_parts: dict[tuple[str, ...], int] = {}
        for root in roots:
            if not root.path.startswith("/"):
                raise ValueError(f"allowed root must be absolute: {root.path!r}")
            norm = posixpath.normpath(root.path)
            key = tuple(_split(norm))
            if key in self._by_parts:
                raise ValueError(f"allowed root listed twice: {norm}")
            self._by_parts[key] = len(self.roots)
            self.roots.append(Root(norm, root.writable, root.purpose))
            try:
                self._root_fds.append(os.open(norm, PATH_DIR_FLAGS))
            except OSError:
                self._root_fds.append(None)  # a missing root answers not_found, it is not fatal
        self._lengths = sorted({len(k) for k in self._by_parts}, reverse=True)
        # A root that contains the data root (a sandbox's /tmp when the data dir lives below
        # /tmp) must not claim paths inside the data root: there only the plan's own roots
        # count, so a foreign path is diagnosed, not looked up in the wrong place.
        self._data_parts = _split(self.data_root)
        self._ancestors_of_data = {
            i for key, i in self._by_parts.items() if len(key) < len(self._data_parts) and list(key) == self._data_parts[: len(key)]
        }

    @property
    def resolver(self) -> str:
        return "openat2" if self.use_openat2 else "walk"

    def close(self) -> None:
        for i, fd in enumerate(self._root_fds):
            if fd is not None:
                os.close(fd)
                self._root_fds[i] = None

    # --- parsing ------------------------------------------------------------------------

    def parse(self, path: object, cwd: str) -> tuple[list[str], bool]:
        """(components, trailing slash) of a tool's path argument. Every refusal names the
        argument it refused (`quoted`), so the model sees which of its paths was wrong."""
        if not isinstance(path, str) or path == "":
            shown = path if isinstance(path, str) else None
            raise AgentToolError("invalid_arguments", "The path is empty; give a file or directory path.", shown)
        if "\x00" in path:
            raise AgentToolError("invalid_arguments", "The path contains a NUL byte, which no file name can.", quoted(path))
        raw = path if path.startswith("/") else f"{cwd}/{path}"
        if len(path) > 63 or not raw.isascii():  # short ASCII cannot break the byte limits below
            try:
                size = len(path.encode("utf-8", "surrogateescape"))
                parts = _split(raw)
                names = [len(part.encode("utf-8", "surrogateescape")) for part in parts]
            except UnicodeEncodeError:
                # A lone surrogate that stands for no byte of a name (JSON's "\ud800").
                raise AgentToolError("invalid_arguments", "The path is not valid UTF-8.", quoted(path)) from None
            if size > PATH_BYTES_MAX:  # what open(2) refuses (ENAMETOOLONG); relative: from the cwd
                raise AgentToolError(
                    "invalid_arguments",
                    f"The path is {size} bytes long; the longest path the kernel opens is {PATH_BYTES_MAX} bytes.",
                    quoted(path),
                )
            for part, length in zip(parts, names):
                if length > NAME_MAX:
                    raise AgentToolError(
                        "invalid_arguments",
                        f"A name in the path is longer than {NAME_MAX} bytes: {part[:60]}...",
                        quoted(path),
                    )
        else:
            parts = _split(raw)
        return parts, raw.endswith(("/", "/.", "/.."))

    def shown(self, path: object, cwd: str) -> str:
        return shown_path(self.parse(path, cwd)[0])

    # --- resolution -----------------------------------------------------------------------

    def _find_root(self, parts: list[str]) -> tuple[int, int] | None:
        for n in self._lengths:
            if n <= len(parts):
                index = self._by_parts.get(tuple(parts[:n]))
                if index is not None:
                    if index in self._ancestors_of_data and parts[: len(self._data_parts)] == self._data_parts:
                        return None
                    return index, n
        return None

    def _root_fd(self, index: int) -> int:
        fd = self._root_fds[index]
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, "allowed root is missing", self.roots[index].path)
        return fd

    def open_parts(self, parts: list[str], flags: int) -> tuple[int, int]:
        """(root index, fd) of `parts` opened with `flags`, following symlinks inside the roots."""
        found = self._find_root(parts)
        if found is None:
            raise _Escape(posixpath.normpath("/" + "/".join(parts)))
        index, n = found
        root_fd = self._root_fd(index)
        if self.use_openat2:
            rest = "/".join(parts[n:]) or "."
            fd = syscalls.openat2_raw(root_fd, rest.encode("utf-8", "surrogateescape"), flags, _RESOLVE)
            if fd >= 0:
                return index, fd
            err = -fd
            if err == errno.ENOSYS:  # e.g. a seccomp profile that predates openat2
                self.use_openat2 = False
            elif err not in _WALK_ERRNOS:
                raise OSError(err, os.strerror(err))
        return self._walk(index, parts[n:], flags)

    def _readlink(self, dir_fd: int, name: str) -> str | None:
        """The link's target, or None when `name` is not a symlink (anymore)."""
        try:
            return os.readlink(name, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return None
            raise

    def _changed(self, dir_fd: int, name: str) -> bool:
        """After a failed open and a readlink that found no link: True when `name` is now a
        directory or a link, i.e. a concurrent rename swapped it and the step must be retried."""
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return False
        return stat.S_ISDIR(mode) or stat.S_ISLNK(mode)

    def _walk(self, index: int, rest: list[str], flags: int) -> tuple[int, int]:
        pending = rest[::-1]  # a stack: the next component is last
        held: list[int] = []  # directories below the current root, innermost last
        hops = retries = 0
        want_path = bool(flags & os.O_PATH)
        try:
            while True:
                cur = held[-1] if held else self._root_fd(index)
                if not pending:
                    return index, os.open(".", flags, dir_fd=cur)
                part = pending.pop()
                if part == "..":
                    if not held:
                        beyond = "/".join(reversed(pending))
                        raise _Escape(posixpath.normpath(f"{self.roots[index].path}/../{beyond}"))
                    os.close(held.pop())
                    continue
                target: str | None
                if pending:  # an intermediate component: a directory, or a link to follow
                    try:
                        held.append(os.open(part, PATH_DIR_FLAGS | os.O_NOFOLLOW, dir_fd=cur))
                        continue
                    except NotADirectoryError:
                        target = self._readlink(cur, part)
                        if target is None and not self._changed(cur, part):
                            raise
                elif want_path:
                    fd = os.open(part, (flags & ~os.O_DIRECTORY) | os.O_NOFOLLOW, dir_fd=cur)
                    mode = os.fstat(fd).st_mode
                    if not stat.S_ISLNK(mode):
                        if flags & os.O_DIRECTORY and not stat.S_ISDIR(mode):
                            os.close(fd)
                            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
                        return index, fd
                    os.close(fd)
                    target = self._readlink(cur, part)
                else:
                    try:
                        return index, os.open(part, flags | os.O_NOFOLLOW, dir_fd=cur)
                    except OSError as exc:
                        # O_NOFOLLOW on a symlink: ELOOP, or ENOTDIR together with O_DIRECTORY.
                        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                            raise
                        target = self._readlink(cur, part)
                        if target is None and not self._changed(cur, part):
                            raise
                if target is None:
                    # Swapped between our two looks (a link became a directory or back): look
                    # again. An adversary can keep winning only so long.
                    retries += 1
                    if retries > MAX_RACE_RETRIES:
                        raise OSError(errno.EAGAIN, "the path kept changing while it was resolved")
                    pending.append(part)
                    continue
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                target_parts = _split(target)
                if not pending and target.endswith(("/", "/.", "/..")):
                    # `link -> file/` names a directory, as openat2 and the kernel have it;
                    # splitting the target into names would drop that.
                    flags |= os.O_DIRECTORY
                root = self.roots[index]
                if root.shared and not self._stays_in(index, len(held), target, target_parts):
                    raise _SharedLinkEscape(root, target)
                if target.startswith("/"):
                    found = self._find_root(target_parts)
                    if found is None:
                        beyond = "/".join(reversed(pending))
                        raise _Escape(posixpath.normpath(f"{target}/{beyond}"))
                    for fd in held:
                        os.close(fd)
                    held.clear()
                    index, n = found
                    pending.extend(reversed(target_parts[n:]))
                else:
                    pending.extend(reversed(target_parts))
        finally:
            for fd in held:
                os.close(fd)

    def _stays_in(self, index: int, depth: int, target: str, target_parts: list[str]) -> bool:
        """Whether a link met `depth` directories below root `index` resolves within it."""
        if not target.startswith("/"):
            return stays_beneath(depth, target_parts)
        found = self._find_root(target_parts)
        return found is not None and found[0] == index and stays_beneath(0, target_parts[found[1] :])

    # --- errors ---------------------------------------------------------------------------

    def refusal(self, exc: BaseException, shown: str) -> AgentToolError:
        """The structured error for a failed resolution (identity diagnostics for escapes)."""
        if isinstance(exc, AgentToolError):
            return exc
        if isinstance(exc, _Escape):
            diagnosis = diagnose(shown, exc.at, self.data_root, self.user_id)
            return AgentToolError(diagnosis.code, diagnosis.message, shown)
        if isinstance(exc, _SharedLinkEscape):
            diagnosis = shared_link_escape(shown, exc.root.path, exc.root.purpose, exc.target)
            return AgentToolError(diagnosis.code, diagnosis.message, shown, link_target=exc.target)
        if isinstance(exc, OSError):
            return os_error(exc, shown)
        raise exc

    # --- public operations -------------------------------------------------------------

    def open_file(self, path: object, cwd: str, *, unescape: bool = True) -> Opened:
        """A regular file, opened for reading."""
        parts, trailing = self.parse(path, cwd)
        try:
            index, fd = self.open_parts(parts, READ_FLAGS | (os.O_DIRECTORY if trailing else 0))
        except (OSError, _Escape, _SharedLinkEscape) as exc:
            if unescape and (retried := _retry_unescaped(self.open_file, exc, path, cwd)) is not None:
                return retried
            raise self.refusal(exc, shown_path(parts)) from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            shown = shown_path(parts)
            if stat.S_ISDIR(mode):
                raise AgentToolError("is_a_directory", f"This is a directory, not a file (use list_dir): {shown}", shown)
            raise AgentToolError("not_a_regular_file", f"This is not a regular file: {shown}", shown)
        return Opened(fd, self.roots[index], parts, path)  # type: ignore[arg-type] - parse checked it is a str

    def open_dir(self, path: object, cwd: str, *, unescape: bool = True) -> Opened:
        """A directory, opened for listing."""
        parts, _ = self.parse(path, cwd)
        try:
            index, fd = self.open_parts(parts, DIR_FLAGS)
        except (OSError, _Escape, _SharedLinkEscape) as exc:
            if unescape and (retried := _retry_unescaped(self.open_dir, exc, path, cwd)) is not None:
                return retried
            raise self.refusal(exc, shown_path(parts)) from None
        return Opened(fd, self.roots[index], parts, path)  # type: ignore[arg-type]

    def write_target(self, path: object, cwd: str, *, create_parents: bool = True) -> WriteTarget:
        alternative = unescape_path(path) if isinstance(path, str) else None
        if alternative is None:
            return self._write_target(path, cwd, create_parents)
        # The escaped form of a listed name: the literal path wins when it exists; else the
        # unescaped one when it (or at least its directory) does.
        literal = self._write_target_or_none(path, cwd)
        if literal is not None and literal.existing is not None:
            return literal
        other = self._write_target_or_none(alternative, cwd)
        if other is not None and (other.existing is not None or literal is None):
            if literal is not None:
                literal.close()
            return other
        if other is not None:
            other.close()
        return literal if literal is not None else self._write_target(path, cwd, create_parents)

    def _write_target_or_none(self, path: str, cwd: str) -> WriteTarget | None:
        try:
            return self._write_target(path, cwd, False)
        except AgentToolError as exc:
            if exc.code == "not_found":
                return None
            raise

    def _write_target(self, path: object, cwd: str, create_parents: bool) -> WriteTarget:
        parts, trailing = self.parse(path, cwd)
        shown = shown_path(parts)
        confine: int | None = None  # the shared root a followed final link was found in
        link = ""
        try:
            for _ in range(MAX_SYMLINK_HOPS + 1):
                found = self._find_root(parts)
                if trailing or not parts or parts[-1] == ".." or (found is not None and found[1] == len(parts)):
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
                index, dir_fd = self._open_dir(parts[:-1], create_parents, confine)
                name = parts[-1]
                try:
                    existing: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    existing = None
                if existing is not None and stat.S_ISLNK(existing.st_mode):
                    # Follow a final symlink like open(2) would, through the same rules (a dangling
                    # link pointing outside must not create a file there: CVE-2025-53109).
                    link = os.readlink(name, dir_fd=dir_fd)
                    os.close(dir_fd)
                    target_parts = _split(link)
                    if self.roots[index].shared:
                        # Item 7: judged before anything is created where it points.
                        if link.startswith("/") and not self._stays_in(index, 0, link, target_parts):
                            raise _SharedLinkEscape(self.roots[index], link)
                        confine = index
                    parts = target_parts if link.startswith("/") else parts[:-1] + target_parts
                    trailing = link.endswith("/")
                    continue
                if existing is not None and stat.S_ISDIR(existing.st_mode):
                    os.close(dir_fd)
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
                root = self.roots[index]
                if not root.writable:
                    os.close(dir_fd)
                    raise read_only(shown, root)
                return WriteTarget(dir_fd, name, root, shown, existing)
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
        except _Escape as exc:
            if confine is not None:  # a link in a shared root led there
                raise self.refusal(_SharedLinkEscape(self.roots[confine], link), shown) from None
            raise self.refusal(exc, shown) from None
        except (OSError, _SharedLinkEscape) as exc:
            raise self.refusal(exc, shown) from None

    def _open_dir(self, parts: list[str], create: bool, confine: int | None = None) -> tuple[int, int]:
        """A directory for a write; `confine`: it must be in that root (else _Escape), and
        nothing is created anywhere else."""
        try:
            index, fd = self.open_parts(parts, PATH_DIR_FLAGS)
            return self._confined(index, fd, confine, parts)
        except FileNotFoundError:
            if not create:
                raise
        # Find the deepest existing ancestor, then create downwards; each new level is
        # re-resolved from scratch, so a link swapped in meanwhile is judged like any other.
        found = self._find_root(parts)
        if found is None:
            raise _Escape(posixpath.normpath("/" + "/".join(parts)))
        depth = len(parts) - 1
        while True:
            if depth < found[1]:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
            try:
                index, fd = self._confined(*self.open_parts(parts[:depth], PATH_DIR_FLAGS), confine, parts)
                break
            except FileNotFoundError:
                depth -= 1
        try:
            for j in range(depth, len(parts)):
                if not self.roots[index].writable:
                    raise read_only("/" + "/".join(parts[: j + 1]), self.roots[index])
                try:
                    os.mkdir(parts[j], 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                os.close(fd)
                fd = -1
                index, fd = self._confined(*self.open_parts(parts[: j + 1], PATH_DIR_FLAGS), confine, parts)
            return index, fd
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise

    def _confined(self, index: int, fd: int, confine: int | None, parts: list[str]) -> tuple[int, int]:
        if confine is not None and index != confine:
            os.close(fd)
            raise _Escape(shown_path(parts))
        return index, fd


def _retry_unescaped(opener: Callable[..., Opened], exc: BaseException, path: object, cwd: str) -> Opened | None:
    """`opener` of the unescaped form of a path that was not found but holds the `\\xNN`
    escapes of a listed name that is not UTF-8 (sandbox_agent/names.py); None otherwise."""
    if not isinstance(exc, FileNotFoundError) or not isinstance(path, str):
        return None
    alternative = unescape_path(path)
    if alternative is None:
        return None
    try:
        return opener(alternative, cwd, unescape=False)
    except AgentToolError:
        return None


def read_only(shown: str, root: Root) -> AgentToolError:
    return AgentToolError(
        "read_only",
        f"This location is read-only ({root.purpose or 'read-only mount'} at {root.path}); "
        f"write somewhere in your working directory instead: {shown}",
        shown,
    )


_OS_CODES = {
    errno.ENOENT: ("not_found", "No such file or directory: {}"),
    errno.ENOTDIR: ("not_a_directory", "A component of the path is not a directory: {}"),
    errno.EISDIR: ("is_a_directory", "This is a directory, not a file: {}"),
    # What open() says of a Unix socket (and of a device without a driver).
    errno.ENXIO: ("not_a_regular_file", "This is not a regular file (a socket or a device): {}"),
    errno.ELOOP: ("symlink_loop", f"Too many levels of symbolic links (more than {MAX_SYMLINK_HOPS}): {{}}"),
    errno.ENAMETOOLONG: ("invalid_arguments", "The path or a name in it is too long: {}"),
    errno.EACCES: ("permission_denied", "Permission denied: {}"),
    errno.EPERM: ("permission_denied", "Operation not permitted: {}"),
    errno.EROFS: ("read_only", "This file system is read-only: {}"),
    errno.ENOSPC: ("no_space", "No space left on the device while writing: {}"),
    errno.EDQUOT: ("no_space", "Disk quota exceeded while writing: {}"),
    errno.EEXIST: ("already_exists", "It already exists: {}"),
    errno.EAGAIN: ("conflict", "The path kept changing while it was being resolved (a concurrent rename); try again: {}"),
    errno.ENOTEMPTY: ("not_empty", "The directory is not empty: {}"),
}


def os_error(exc: OSError, shown: str) -> AgentToolError:
    code, template = _OS_CODES.get(exc.errno or 0, ("io_error", f"{exc.strerror or exc}: {{}}"))
    return AgentToolError(code, template.format(shown), shown)
