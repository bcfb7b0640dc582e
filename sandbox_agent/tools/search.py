"""list_dir, glob_search and grep_search.

Trees are walked on directory fds from the PathSandbox. A real subdirectory is re-resolved
through the sandbox when it is visited, and a symlink is followed only through the sandbox
too, so a session's `skills/x` link into the user's skill view is searched while a link (or
a swap) pointing outside the roots is skipped. (dev, inode) pairs guard against loops.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import regex

from sandbox_agent.errors import AgentToolError
from sandbox_agent.glob_pattern import Glob, GlobError, compile_glob
from sandbox_agent.path_sandbox import READ_FLAGS, PathSandbox, quoted, shown_path
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.output import looks_binary
from sandbox_agent.wire import GlobSearchArgs, GrepSearchArgs, ListDirArgs

MAX_DEPTH = 64
GREP_LINE_CHARS = 400


def _entry_type(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return "symlink"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    if entry.is_file(follow_symlinks=False):
        return "file"
    return "other"


def list_dir(ctx: ToolContext, args: ListDirArgs) -> dict[str, Any]:
    cap = ctx.limits.list_max_entries
    with ctx.sandbox.open_dir(args.path, ctx.cwd) as opened:
        with os.scandir(opened.fd) as it:
            raw = sorted(it, key=lambda e: e.name)
        entries: list[dict[str, Any]] = []
        for entry in raw[:cap]:
            kind = _entry_type(entry)
            item: dict[str, Any] = {"name": entry.name, "type": kind}
            try:
                if kind == "file":
                    item["size"] = entry.stat(follow_symlinks=False).st_size
                elif kind == "symlink":
                    item["target"] = os.readlink(entry.name, dir_fd=opened.fd)
            except OSError:
                pass  # vanished meanwhile: listed without details
            entries.append(item)
        return {
            "path": opened.path,
            "entries": entries,
            "total": len(raw),
            "truncated": len(raw) > cap,
        }


@dataclass
class _FileRef:
    rel: str  # relative to the walk's base, through links as the model would name it
    walk_path: str  # absolute, not normalized: re-resolving it repeats the same physical steps
    dir_fd: int  # the parent directory, open while the entry is being handled
    name: str
    via_link: bool

    @property
    def shown(self) -> str:
        return shown_path([p for p in self.walk_path.split("/") if p])

    def open(self, sandbox: PathSandbox) -> int:
        """A read fd of the file (regular files only), or -1 when it is gone or not allowed."""
        if self.via_link:
            try:
                opened = sandbox.open_file(self.walk_path, "/")
            except AgentToolError:
                return -1
            return opened.fd  # Opened.close is not needed: the caller closes the fd
        try:
            fd = os.open(self.name, READ_FLAGS | os.O_NOFOLLOW, dir_fd=self.dir_fd)
        except OSError:
            return -1
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return -1
        return fd


@dataclass
class _WalkStats:
    entries: int = 0
    exhausted: bool = False  # the entry budget ran out


def _walk_files(
    sandbox: PathSandbox, base_walk_path: str, *, max_depth: int | None, budget: int, stats: _WalkStats
) -> Iterator[_FileRef]:
    visited: set[tuple[int, int]] = set()
    depth_limit = MAX_DEPTH if max_depth is None else min(max_depth, MAX_DEPTH)
    stack: list[tuple[str, str, int]] = [(base_walk_path, "", 0)]
    while stack:
        walk_path, rel, depth = stack.pop()
        try:
            opened = sandbox.open_dir(walk_path, "/")
        except AgentToolError:
            continue  # vanished, swapped to something outside the roots, or unreadable
        with opened:
            st = os.fstat(opened.fd)
            key = (st.st_dev, st.st_ino)
            if key in visited:
                continue
            visited.add(key)
            try:
                with os.scandir(opened.fd) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                continue
            subdirs: list[tuple[str, str, int]] = []
            for entry in entries:
                stats.entries += 1
                if stats.entries > budget:
                    stats.exhausted = True
                    return
                child_walk = f"{walk_path}/{entry.name}"
                child_rel = f"{rel}/{entry.name}" if rel else entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if depth < depth_limit:
                            subdirs.append((child_walk, child_rel, depth + 1))
                    elif entry.is_symlink():
                        # Judge the link through the sandbox: a directory inside the roots is
                        # walked, a file is searched, anything else is skipped.
                        try:
                            with sandbox.open_dir(child_walk, "/"):
                                if depth < depth_limit:
                                    subdirs.append((child_walk, child_rel, depth + 1))
                        except AgentToolError as exc:
                            if exc.code == "not_a_directory":
                                yield _FileRef(child_rel, child_walk, opened.fd, entry.name, via_link=True)
                    elif entry.is_file(follow_symlinks=False):
                        yield _FileRef(child_rel, child_walk, opened.fd, entry.name, via_link=False)
                except OSError:
                    continue
            stack.extend(reversed(subdirs))


def _base(ctx: ToolContext, path: str | None) -> tuple[str, str]:
    """(walk path, shown path) of a search base, checked to be a directory inside the roots."""
    with ctx.sandbox.open_dir(path or ".", ctx.cwd) as opened:
        raw = opened.given  # the unescaped form when that is the one that was found
        joined = raw if raw.startswith("/") else f"{ctx.cwd}/{raw}"
        return joined.rstrip("/") or "/", opened.path


def _glob(pattern: str, *, name_only: bool) -> Glob:
    try:
        return compile_glob(pattern, name_only_when_plain=name_only)
    except GlobError as exc:
        # The glob names paths: its refusal carries it as `path`, like any refused path argument.
        raise AgentToolError("invalid_arguments", f"Invalid glob {pattern!r}: {exc}", quoted(pattern)) from None


def glob_search(ctx: ToolContext, args: GlobSearchArgs) -> dict[str, Any]:
    glob = _glob(args.pattern, name_only=False)
    walk_path, shown = _base(ctx, args.path)
    cap = ctx.limits.glob_max_results
    stats = _WalkStats()
    matches: list[str] = []
    more = False
    for ref in _walk_files(
        ctx.sandbox, walk_path, max_depth=glob.max_depth, budget=ctx.limits.walk_max_entries, stats=stats
    ):
        if glob.matches(ref.rel):
            if len(matches) >= cap:
                more = True
                break
            matches.append(ref.shown)
    result: dict[str, Any] = {
        "pattern": args.pattern,
        "path": shown,
        "matches": matches,
        "truncated": more or stats.exhausted,
    }
    if more:
        result["note"] = f"Only the first {cap} matches are shown; narrow the pattern or the path."
    elif stats.exhausted:
        result["note"] = f"Stopped after visiting {ctx.limits.walk_max_entries} entries; narrow the path."
    return result


def _compile_regex(pattern: str) -> regex.Pattern[str]:
    try:
        return regex.compile(pattern)  # VERSION0: the syntax of Python's `re`
    except (regex.error, ValueError) as exc:
        raise AgentToolError("invalid_arguments", f"Invalid regular expression {pattern!r}: {exc}") from None


class _Deadline:
    """The time limit of one grep_search call, over its walk and every match attempt."""

    def __init__(self, pattern: str, seconds: float) -> None:
        self.pattern = pattern
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self, shown: str) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise self.expired(shown)
        return left

    def expired(self, shown: str) -> AgentToolError:
        return AgentToolError(
            "timeout",
            f"grep_search stopped at its time limit of {self.seconds:g} s while searching {shown}. "
            f"The regular expression {self.pattern!r} is probably backtracking catastrophically "
            "(nested or overlapping repetition such as (a+)+ or (a|aa)+); simplify it, or search "
            "a narrower path or glob.",
            shown,
            timeout_s=self.seconds,
        )


def _grep_fd(fd: int, pattern: regex.Pattern[str], max_bytes: int, deadline: _Deadline, shown: str) -> Iterator[tuple[int, str]] | None:
    """Matching (line number, line) of a readable file, or None when it is binary or too big."""
    st = os.fstat(fd)
    if st.st_size > max_bytes:
        return None
    with open(fd, "rb", closefd=False) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes or looks_binary(data[:8192]):
        return None
    text = data.decode("utf-8", "replace")

    def matching() -> Iterator[tuple[int, str]]:
        # `regex` releases the GIL while matching and stops at `timeout` (stdlib `re` does
        # neither: one bad pattern would freeze every other call of this agent, /health too).
        for n, line in enumerate(text.splitlines(), 1):
            try:
                found = pattern.search(line, timeout=deadline.remaining(shown))
            except TimeoutError:
                raise deadline.expired(shown) from None
            if found:
                yield n, line

    return matching()


def grep_search(ctx: ToolContext, args: GrepSearchArgs) -> dict[str, Any]:
    pattern = _compile_regex(args.pattern)
    name_glob = _glob(args.glob, name_only=True) if args.glob else None
    limits = ctx.limits
    deadline = _Deadline(args.pattern, limits.grep_timeout_s)
    matches: list[dict[str, Any]] = []
    used = 0
    files = 0
    full = False
    stats = _WalkStats()

    def search(fd: int, shown: str) -> bool:
        """Add a file's matches; False once a cap is reached."""
        nonlocal used, files
        found = _grep_fd(fd, pattern, limits.grep_max_file_bytes, deadline, shown)
        if found is None:
            return True
        files += 1
        for lineno, line in found:
            text = line if len(line) <= GREP_LINE_CHARS else line[:GREP_LINE_CHARS] + "..."
            used += len(text) + len(shown) + 16
            if len(matches) >= limits.grep_max_matches or used > limits.output_cap_bytes:
                return False
            matches.append({"path": shown, "line": lineno, "text": text})
        return True

    raw = args.path or "."
    try:
        with ctx.sandbox.open_file(raw, ctx.cwd) as single:  # a single file?
            full = not search(single.fd, single.path)
            shown = single.path
    except AgentToolError as exc:
        if exc.code != "is_a_directory":
            raise
        walk_path, shown = _base(ctx, args.path)
        for ref in _walk_files(
            ctx.sandbox,
            walk_path,
            max_depth=None if name_glob is None else name_glob.max_depth,
            budget=limits.walk_max_entries,
            stats=stats,
        ):
            if name_glob is not None and not name_glob.matches(ref.rel):
                continue
            deadline.remaining(ref.shown)  # the walk counts too
            fd = ref.open(ctx.sandbox)
            if fd < 0:
                continue
            try:
                if not search(fd, ref.shown):
                    full = True
                    break
            finally:
                os.close(fd)
    result: dict[str, Any] = {
        "pattern": args.pattern,
        "path": shown,
        "matches": matches,
        "files_searched": files,
        "truncated": full or stats.exhausted,
    }
    if full:
        result["note"] = (
            f"Stopped at {len(matches)} matches (caps: {limits.grep_max_matches} matches, "
            f"{limits.output_cap_bytes} bytes); narrow the pattern, path or glob."
        )
    elif stats.exhausted:
        result["note"] = f"Stopped after visiting {limits.walk_max_entries} entries; narrow the path."
    return result
