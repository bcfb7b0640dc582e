"""The output of one background process: a bounded ring file plus an in-memory index of which
stream (stdout, stderr, or the PTY) each byte range came from.

Cursors are byte offsets into the process's whole output since it started: they only grow, so
a reader that passes back the `next` cursor it was given never sees a byte twice and never
misses one that is still in the ring. Past the cap the oldest bytes are overwritten; a read
from a cursor older than the ring's start says how many bytes were dropped.

The deciders (`decode_run`, `runs_between`) are pure; `Ring` is the one that touches a file.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass

# A run is a stretch of bytes of one stream; alternating streams make many. Past this many the
# oldest runs are dropped with their bytes, so the index stays bounded like the file.
MAX_RUNS = 16384
_REPLACEMENT = "\ufffd"
_REPLACEMENT_BYTES = _REPLACEMENT.encode()


@dataclass(frozen=True)
class Run:
    stream: str
    start: int  # cursor of its first byte
    end: int  # cursor after its last byte


@dataclass(frozen=True)
class Decoded:
    text: str
    used: int  # bytes consumed: a character cut at the end is left for the next read
    replaced: int  # invalid bytes shown as U+FFFD


def decode_run(data: bytes, *, final: bool) -> Decoded:
    """UTF-8 text of `data` that never splits a character: up to 3 trailing bytes of an
    incomplete sequence stay unread (`used` < len) unless `final`; invalid bytes are replaced
    and counted."""
    cut = len(data)
    if not final:
        for back in range(1, min(4, len(data) + 1)):
            byte = data[-back]
            if byte & 0xC0 == 0x80:
                continue  # a continuation byte: look further back for its lead
            if byte >= 0xC0:
                need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
                if need > back:
                    cut = len(data) - back  # its sequence is not complete yet
            break
    text = data[:cut].decode("utf-8", "replace")
    replaced = text.count(_REPLACEMENT) - data[:cut].count(_REPLACEMENT_BYTES)
    return Decoded(text, cut, max(0, replaced))


def runs_between(runs: list[Run], since: int, until: int) -> list[Run]:
    """The parts of `runs` that lie within [since, until), in order."""
    picked = []
    for run in runs:
        start, end = max(run.start, since), min(run.end, until)
        if start < end:
            picked.append(Run(run.stream, start, end))
    return picked


@dataclass(frozen=True)
class Chunk:
    stream: str
    cursor: int
    data: bytes


@dataclass(frozen=True)
class Slice:
    chunks: list[Chunk]
    start: int  # the first cursor read (past `since` when bytes were dropped)
    dropped: int  # bytes between `since` and `start` that the ring no longer holds
    total: int  # every byte written so far


class Ring:
    """A file of at most `cap` bytes (written at `cursor % cap`) and the run index. Thread-safe;
    `changed` is notified on every append and on `close_writer` (long polls wait on it)."""

    def __init__(self, fd: int, cap: int) -> None:
        self._fd = fd
        self.cap = cap
        self.total = 0
        self._runs: deque[Run] = deque()
        self._floor = 0  # cursors below it were dropped (overwritten, or their run evicted)
        self.changed = threading.Condition()
        self._write_lock = threading.Lock()
        self.closed = False

    @property
    def start(self) -> int:
        return max(self._floor, self.total - self.cap)

    def append(self, stream: str, data: bytes) -> None:
        if not data:
            return
        # One writer at a time (stdout and stderr have a thread each): two appends must never
        # take the same offset. Readers only wait for `changed`, never for a write.
        with self._write_lock:
            self._append(stream, data)

    def _append(self, stream: str, data: bytes) -> None:
        if len(data) > self.cap:  # only its end can be kept
            skipped = len(data) - self.cap
            with self.changed:
                self.total += skipped
                self._floor = max(self._floor, self.total)
            data = data[skipped:]
        offset = self.total  # only writers move it, and this is the only one now
        position = offset % self.cap
        first = data[: self.cap - position]
        try:
            os.pwrite(self._fd, first, position)
            if len(first) < len(data):
                os.pwrite(self._fd, data[len(first) :], 0)
        except OSError:
            pass  # a full disk loses bytes, not the process; the cursor still moves on
        with self.changed:
            self.total = offset + len(data)
            last = self._runs[-1] if self._runs else None
            if last is not None and last.stream == stream and last.end == offset:
                self._runs[-1] = Run(stream, last.start, self.total)
            else:
                self._runs.append(Run(stream, offset, self.total))
            while self._runs and (self._runs[0].end <= self.total - self.cap or len(self._runs) > MAX_RUNS):
                evicted = self._runs.popleft()
                self._floor = max(self._floor, evicted.end)
            self.changed.notify_all()

    def read(self, since: int, max_bytes: int) -> Slice:
        with self.changed:
            total, start = self.total, max(since, self.start)
            runs = runs_between(list(self._runs), start, min(total, start + max_bytes))
        chunks = []
        for run in runs:
            data = self._read_range(run.start, run.end)
            chunks.append(Chunk(run.stream, run.start, data))
        # A writer may have overwritten what was just read: drop what fell out meanwhile.
        with self.changed:
            floor = self.start
        if chunks and chunks[0].cursor < floor:
            chunks = [
                Chunk(c.stream, max(c.cursor, floor), c.data[max(0, floor - c.cursor) :])
                for c in chunks
                if c.cursor + len(c.data) > floor
            ]
            start = max(start, floor)
        return Slice(chunks, start, max(0, start - since), total)

    def _read_range(self, start: int, end: int) -> bytes:
        parts = []
        while start < end:
            position = start % self.cap
            size = min(end - start, self.cap - position)
            try:
                data = os.pread(self._fd, size, position)
            except OSError:
                data = b""
            if len(data) < size:  # a hole from a failed write: zeros, as the file would hold
                data += b"\x00" * (size - len(data))
            parts.append(data)
            start += size
        return b"".join(parts)

    def close_writer(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    def wait(self, since: int, timeout_s: float) -> None:
        """Until there is output after `since`, the writer closed (the process ended and its
        output was read to the end), or the timeout."""
        with self.changed:
            self.changed.wait_for(lambda: self.total > since or self.closed, timeout_s)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
