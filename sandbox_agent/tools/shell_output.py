"""What a `shell` call's output becomes in its answer, and where the full output is kept.

A model gets one bounded budget of text for stdout and stderr together (`shell_output_cap_bytes`).
A stream that does not fit keeps its head and its tail (builds and tests fail at the end)
around a marker naming the omitted byte count and the spool file; output that is not text is
reported as binary (its size), never decoded into replacement characters.

A stream longer than half the budget is spooled in full (up to a cap) into the session's
`shell-output/` directory, which the host plans and names in the call's context; the agent
writes it as the sandbox's own uid, opened no-follow on the directory's fd. Old spool files
are rotated so a session's spool stays bounded. Output that fits is never written to disk.

The deciders (`share_budget`, `is_binary`, `render`, `rotation_victims`) are pure.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

HEAD_SHARE = 4  # a cut stream shows its first quarter and its last three quarters
BINARY_SAMPLE = 8192
SPOOL_MAX_FILES = 64  # per session, whatever their size
SPOOL_NAME = re.compile(r"\d{8}T\d{6}\.\d{6}-[0-9a-f]{8}\.(stdout|stderr)")
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


# --- deciding --------------------------------------------------------------------------------


def share_budget(sizes: Sequence[int], budget: int) -> list[int]:
    """How many bytes of each stream the answer may show: all of them when they fit together;
    else the smaller streams keep what fits in an equal share and the rest go to the others."""
    shares = [0] * len(sizes)
    left, pending = budget, sorted(range(len(sizes)), key=lambda i: sizes[i])
    while pending:
        even = left // len(pending)
        index = pending.pop(0)
        shares[index] = min(sizes[index], even) if pending else min(sizes[index], left)
        left -= shares[index]
    return shares


def is_binary(sample: bytes) -> bool:
    """A NUL byte (like git and grep), or more than one byte in eight that is not UTF-8."""
    if b"\x00" in sample:
        return True
    text = sample.decode("utf-8", "replace")
    if text.endswith("\ufffd"):  # a character cut at the end of the sample is not a sign
        text = text.rstrip("\ufffd")
    return text.count("\ufffd") * 8 > max(len(sample), 1)


def _decode_head(data: bytes) -> str:
    return data.decode("utf-8", "ignore") if _cut_inside_char(data) else data.decode("utf-8", "replace")


def _cut_inside_char(data: bytes) -> bool:
    tail = data[-3:]
    return any(byte & 0xC0 == 0xC0 for byte in tail) or (bool(tail) and tail[-1] & 0x80 != 0)


def _decode_tail(data: bytes) -> str:
    start = 0
    while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:  # continuation bytes of a cut character
        start += 1
    return data[start:].decode("utf-8", "replace")


@dataclass(frozen=True)
class Shown:
    text: str
    binary: bool
    cut: bool


def omitted_marker(omitted: int, spool_path: str | None) -> str:
    where = f"; the full output is in {spool_path}" if spool_path else ""
    return f"\n[... {omitted} bytes omitted{where} ...]\n"


def render(head: bytes, tail: bytes, total: int, share: int, spool_path: str | None) -> Shown:
    """The answer's text of one stream: `head` is its first bytes, `tail` its last (they
    overlap or touch when the stream is short), `total` its length, `share` its budget."""
    if total == 0:
        return Shown("", False, False)
    if is_binary(head[:BINARY_SAMPLE]):
        where = f"; the full output is in {spool_path}" if spool_path else ""
        return Shown(f"[binary output: {total} bytes, not shown{where}]", True, True)
    if total <= share:
        whole = head if total <= len(head) else head + tail[len(tail) - (total - len(head)) :]
        return Shown(whole[:total].decode("utf-8", "replace"), False, False)
    # The marker is inside the share, however long the spool's path: what is shown of the
    # output gives way to it (its count has at most as many digits as `total`).
    shown = max(0, share - len(omitted_marker(total, spool_path).encode()))
    head_bytes = shown // HEAD_SHARE
    tail_bytes = shown - head_bytes
    first, last = head[:head_bytes], tail[len(tail) - tail_bytes :] if tail_bytes else b""
    omitted = total - len(first) - len(last)
    return Shown(_decode_head(first) + omitted_marker(omitted, spool_path) + _decode_tail(last), False, True)


@dataclass(frozen=True)
class SpoolEntry:
    name: str
    size: int


def rotation_victims(entries: Sequence[SpoolEntry], *, room: int, max_bytes: int, max_files: int) -> list[str]:
    """The oldest spool files to remove so that one more file of up to `room` bytes keeps the
    session within `max_bytes` and `max_files` (names start with their UTC time, so by name
    is by age)."""
    ordered = sorted(entries, key=lambda entry: entry.name)
    total = sum(entry.size for entry in ordered)
    victims = []
    while ordered and (len(ordered) + 1 > max_files or total + room > max_bytes):
        oldest = ordered.pop(0)
        victims.append(oldest.name)
        total -= oldest.size
    return victims


# --- doing -----------------------------------------------------------------------------------


class SpoolDir:
    """The session's `shell-output/` directory for one call, opened (no-follow, by the
    PathSandbox) on first need and shared by the call's two readers."""

    def __init__(self, opener, max_bytes: int) -> None:  # type: ignore[no-untyped-def]
        self._opener = opener  # () -> (dir fd, path the model sees) or None
        self.max_bytes = max_bytes
        self.file_max = max(1, max_bytes // 2)
        self._lock = threading.Lock()
        self._opened: tuple[int, str] | None = None
        self._failed = False
        self._stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f".{int(time.time() * 1e6) % 1_000_000:06d}"
        self._token = secrets.token_hex(4)

    def create(self, stream: str) -> tuple[int, str] | None:
        """A new spool file for `stream` (fd, path), after rotating old ones; None when the
        directory is missing or unusable (the answer then says the full output was not kept)."""
        with self._lock:
            if self._opened is None and not self._failed:  # _failed also once closed
                self._opened = self._opener()
                self._failed = self._opened is None
            if self._opened is None:
                return None
            dir_fd, dir_path = self._opened
            self._rotate(dir_fd)
            name = f"{self._stamp}-{self._token}.{stream}"
            try:
                fd = os.open(name, _CREATE, 0o600, dir_fd=dir_fd)
            except OSError:
                return None
            return fd, f"{dir_path.rstrip('/')}/{name}"

    def _rotate(self, dir_fd: int) -> None:
        entries = []
        try:
            with os.scandir(dir_fd) as listing:
                for entry in listing:
                    if SPOOL_NAME.fullmatch(entry.name):
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        entries.append(SpoolEntry(entry.name, st.st_size if stat.S_ISREG(st.st_mode) else 0))
        except OSError:
            return
        for name in rotation_victims(entries, room=self.file_max, max_bytes=self.max_bytes, max_files=SPOOL_MAX_FILES):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass  # a concurrent call of the session removed it first

    def close(self) -> None:
        """After the call; a reader still blocked on its pipe then spools nothing more."""
        with self._lock:
            self._failed = True
            if self._opened is not None:
                os.close(self._opened[0])
                self._opened = None


class StreamReader(threading.Thread):
    """Drains one pipe to EOF: keeps its head and a rolling tail, counts every byte and,
    once the stream is longer than `spool_after`, writes all of it to a spool file."""

    def __init__(
        self,
        stream: IO[bytes],
        name: str,
        keep: int,
        spool_after: int,
        spool: SpoolDir | None,
        on_chunk: Callable[[str, bytes], None] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.on_chunk = on_chunk  # a streamed call: every chunk as it is read
        self.stream = stream
        self.name_ = name
        self.keep = keep
        self.spool_after = spool_after
        self.spool = spool
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.eof = False  # reached the end of the pipe: nothing of the output was lost
        self.spool_path: str | None = None
        self.spooled = 0
        self._spool_fd: int | None = None
        self._spool_done = spool is None

    def run(self) -> None:
        try:
            while chunk := self.stream.read1(65536):  # type: ignore[attr-defined]
                self._take(chunk)
            self.eof = True
        except (OSError, ValueError):
            pass
        finally:
            if self._spool_fd is not None:
                os.close(self._spool_fd)
                self._spool_fd = None

    def _take(self, chunk: bytes) -> None:
        if self.on_chunk is not None:
            self.on_chunk(self.name_, chunk)
        if len(self.head) < self.keep:
            self.head += chunk[: self.keep - len(self.head)]
        self.tail += chunk
        if len(self.tail) > self.keep:
            del self.tail[: len(self.tail) - self.keep]
        self.total += len(chunk)
        if not self._spool_done and self.total > self.spool_after:
            self._spool_start(chunk)
        elif self._spool_fd is not None:
            self._spool_write(chunk)

    def _spool_start(self, chunk: bytes) -> None:
        assert self.spool is not None
        self._spool_done = True
        created = self.spool.create(self.name_)
        if created is None:
            return
        self._spool_fd, self.spool_path = created
        # What came before this chunk is still whole in `head` (spool_after < keep).
        self._spool_write(bytes(self.head[: self.total - len(chunk)]) + chunk)

    def _spool_write(self, data: bytes) -> None:
        assert self._spool_fd is not None
        data = data[: max(0, self.spool.file_max - self.spooled)] if self.spool else b""
        try:
            while data:
                written = os.write(self._spool_fd, data)
                self.spooled += written
                data = data[written:]
        except OSError:  # the disk or the user's quota is full: keep what is there
            data = b""
        if self.spool is None or self.spooled >= self.spool.file_max:
            os.close(self._spool_fd)
            self._spool_fd = None
