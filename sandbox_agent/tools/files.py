"""read_file, write_file, edit_file, read_bytes: all on file descriptors from the PathSandbox."""

from __future__ import annotations

import base64
import binascii
import errno
import mimetypes
import os
import secrets
import stat
from typing import Any

from sandbox_agent.errors import AgentToolError
from sandbox_agent.path_sandbox import READ_FLAGS, WriteTarget, os_error
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.output import looks_binary
from sandbox_agent.wire import EditFileArgs, ReadBytesArgs, ReadBytesResult, ReadFileArgs, WriteBytesArgs, WriteFileArgs

_SNIFF = 8192
_CHUNK = 1 << 20


def _binary_error(path: str, size: int) -> AgentToolError:
    return AgentToolError(
        "binary_file",
        f"This is a binary file ({size} bytes); read_file returns text only. Use read_bytes for its bytes: {path}",
        path,
    )


def _count_lines(fh: Any) -> int:
    """Lines in the whole file, counted at C speed (a last line without newline counts)."""
    fh.seek(0)
    newlines = 0
    last = b""
    while chunk := fh.read(_CHUNK):
        newlines += chunk.count(b"\n")
        last = chunk
    return newlines + (1 if last and not last.endswith(b"\n") else 0)


def read_file(ctx: ToolContext, args: ReadFileArgs) -> dict[str, Any]:
    offset = args.offset or 1
    limit = args.limit or ctx.limits.read_file_default_lines
    cap = ctx.limits.output_cap_bytes
    with ctx.sandbox.open_file(args.path, ctx.cwd) as opened:
        size = os.fstat(opened.fd).st_size
        with open(opened.fd, "rb", closefd=False) as fh:
            if looks_binary(fh.read(_SNIFF)):
                raise _binary_error(opened.path, size)
            fh.seek(0)
            lines: list[bytes] = []
            used = 0
            capped = stopped = False
            lineno = 0
            for lineno, line in enumerate(fh, 1):
                if lineno < offset:
                    continue
                if len(lines) >= limit:
                    stopped = True
                    break
                if used + len(line) > cap:
                    if not lines:  # one huge line: show its start rather than nothing
                        lines.append(line[:cap])
                    capped = stopped = True
                    break
                lines.append(line)
                used += len(line)
            total = _count_lines(fh) if stopped else lineno
        content = b"".join(lines).decode("utf-8", "replace")
        end = offset + len(lines) - 1
        result: dict[str, Any] = {
            "path": opened.path,
            "content": content,
            "start_line": offset,
            "end_line": end if lines else None,
            "total_lines": total,
            "size": size,
            "truncated": capped or end < total,
        }
        if capped or end < total:
            more = f"; call read_file again with offset={end + 1} for more" if end < total else ""
            cap_note = f" (output cap of {cap} bytes reached)" if capped else ""
            result["note"] = f"Showing lines {offset}-{end} of {total}{cap_note}{more}."
            if end < total:
                result["next_offset"] = end + 1
        elif offset > total:
            result["note"] = f"The file has only {total} lines."
        return result


def replaceable(existing: os.stat_result | None, dir_mode: int | None, euid: int) -> bool:
    """Whether a write may rename over the final name: not when it is another uid's file in a
    sticky directory (`share/`, a group workspace), where only its owner may replace it."""
    if existing is None or existing.st_uid == euid:
        return True
    return dir_mode is None or not dir_mode & stat.S_ISVTX


def _write_into(target: WriteTarget, data: bytes) -> None:
    existing = target.existing
    # The directory's mode is asked only for another uid's file (a shared place), not on the
    # common path of writing one's own files.
    dir_mode = os.fstat(target.dir_fd).st_mode if existing is not None and existing.st_uid != os.geteuid() else None
    if replaceable(existing, dir_mode, os.geteuid()):
        _replace(target, data)
    else:
        _overwrite(target, data)


def _overwrite(target: WriteTarget, data: bytes) -> None:
    """Write another member's file in a sticky shared directory in place (it keeps its owner
    and mode; the group's write bit allows it). Not atomic: a reader may see it half-written."""
    assert target.existing is not None
    try:
        fd = os.open(target.name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=target.dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # swapped for a link or a FIFO meanwhile
            raise AgentToolError("conflict", f"The file changed while it was being written; retry: {target.path}", target.path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (target.existing.st_dev, target.existing.st_ino):
            raise AgentToolError("conflict", f"The file changed while it was being written; retry: {target.path}", target.path)
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _replace(target: WriteTarget, data: bytes) -> None:
    """Write to a temporary name in the target directory, then rename over the final name:
    readers never see a half-written file, and a symlink swapped in at the final name is
    replaced, not followed. A hard-linked file gets a new inode (the other name keeps its data)."""
    temp = f".{secrets.token_hex(8)}.tmp"
    mode = stat.S_IMODE(target.existing.st_mode) if target.existing is not None else 0o666
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=target.dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if target.existing is not None:
                os.fchmod(fd, mode)  # keep the old permissions despite the umask
        finally:
            os.close(fd)
        os.rename(temp, target.name, src_dir_fd=target.dir_fd, dst_dir_fd=target.dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=target.dir_fd)
        except OSError:
            pass
        raise


def _encode(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise AgentToolError("invalid_arguments", f"`{what}` is not valid UTF-8 text.") from None


def write_file(ctx: ToolContext, args: WriteFileArgs) -> dict[str, Any]:
    return _write(ctx, args.path, _encode(args.content, "content"))


def write_bytes(ctx: ToolContext, args: WriteBytesArgs) -> dict[str, Any]:
    """write_file for bytes that are not text (images, archives), given as base64."""
    try:
        # Line breaks and spaces (as `base64` wraps its output) are not errors; anything else is.
        data = base64.b64decode("".join(args.content_base64.split()), validate=True)
    except (binascii.Error, ValueError):
        raise AgentToolError("invalid_arguments", "`content_base64` is not valid base64.") from None
    return _write(ctx, args.path, data)


def _write(ctx: ToolContext, path: str, data: bytes) -> dict[str, Any]:
    if len(data) > ctx.limits.read_bytes_max:
        raise AgentToolError(
            "too_large", f"The content is {len(data)} bytes; the limit is {ctx.limits.read_bytes_max}.", None
        )
    with ctx.sandbox.write_target(path, ctx.cwd) as target:
        try:
            _write_into(target, data)
        except OSError as exc:
            raise os_error(exc, target.path) from None
        return {"path": target.path, "bytes_written": len(data), "created": target.existing is None}


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def edit_file(ctx: ToolContext, args: EditFileArgs) -> dict[str, Any]:
    with ctx.sandbox.write_target(args.path, ctx.cwd, create_parents=False) as target:
        path = target.path
        if target.existing is None:
            raise AgentToolError("not_found", f"No such file: {path}. Use write_file to create it.", path)
        try:
            fd = os.open(target.name, READ_FLAGS | os.O_NOFOLLOW, dir_fd=target.dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise AgentToolError("conflict", f"The file changed while it was being edited; retry: {path}", path) from None
            raise os_error(exc, path) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise AgentToolError("not_a_regular_file", f"This is not a regular file: {path}", path)
            if st.st_size > ctx.limits.read_bytes_max:
                raise AgentToolError(
                    "too_large", f"The file is {st.st_size} bytes; edit_file handles up to {ctx.limits.read_bytes_max}.", path
                )
            with open(fd, "rb", closefd=False) as fh:
                raw = fh.read()
        finally:
            os.close(fd)
        if looks_binary(raw[:_SNIFF]):
            raise _binary_error(path, len(raw))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise AgentToolError("binary_file", f"The file is not UTF-8 text; edit_file cannot change it: {path}", path) from None
        first = text.find(args.old)
        if first < 0:
            raise AgentToolError(
                "no_match",
                f"The text to replace was not found in {path}. Read the file again and copy the exact text, "
                "including whitespace and line breaks.",
                path,
            )
        second = text.find(args.old, first + 1)
        if second >= 0:
            positions = [first, second]
            while len(positions) < 10 and (nxt := text.find(args.old, positions[-1] + 1)) >= 0:
                positions.append(nxt)
            count = text.count(args.old)
            lines = ", ".join(str(_line_of(text, p)) for p in positions)
            raise AgentToolError(
                "ambiguous_match",
                f"The text to replace occurs {count} times in {path} (at lines {lines}"
                f"{', ...' if count > len(positions) else ''}). Include more surrounding text in `old` so it "
                "matches exactly once.",
                path,
                occurrences=count,
            )
        updated = text[:first] + args.new + text[first + len(args.old) :]
        try:
            _write_into(target, _encode(updated, "new"))
        except OSError as exc:
            raise os_error(exc, path) from None
        return {"path": path, "replacements": 1, "line": _line_of(text, first)}


def read_bytes(ctx: ToolContext, args: ReadBytesArgs) -> ReadBytesResult:
    cap = ctx.limits.read_bytes_max
    with ctx.sandbox.open_file(args.path, ctx.cwd) as opened:
        size = os.fstat(opened.fd).st_size
        if size > cap:
            raise AgentToolError("too_large", f"The file is {size} bytes; read_bytes returns at most {cap}: {opened.path}", opened.path)
        with open(opened.fd, "rb", closefd=False) as fh:
            data = fh.read(cap + 1)
        if len(data) > cap:  # it grew while we read
            raise AgentToolError("too_large", f"The file is larger than {cap} bytes: {opened.path}", opened.path)
        media_type = mimetypes.guess_type(opened.path)[0] or "application/octet-stream"
        return ReadBytesResult(path=opened.path, size=len(data), media_type=media_type, data=data)
