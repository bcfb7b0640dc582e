"""A large `read_bytes` through the HTTP tool route, never held whole (docs/lifecycle.md).

The order is spool, verify, then stream:

1. the agent's raw answer (at least `STREAM_MIN_BYTES`) is copied from its socket into an
   unlinked temp file of the host's state directory in pieces (`ReadBytesSpool`, the agent
   client's `RawSpool`), once a transfer slot is free and its announced length is charged to
   the user's host copies (`orchestrator/quotas/host_copies.py`; refused past the budget);
2. the client checks that exactly the announced bytes arrived (a short body or a size that
   disagrees with the result header is `agent_error`, and nothing was answered yet);
3. only then the route answers, streaming the JSON `{"ok":true,"result":{...,
   "content_base64":"..."}}` from the file, base64-encoded on the fly in 3-byte-aligned
   pieces: byte for byte what `JSONResponse` renders for the whole result.

The slot is held until the answer has been sent (or the spool was dropped); smaller answers
take today's path (read whole, no slot).
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from mounts.fs.spool import SpoolWriteFailed
from orchestrator.errors import ToolError
from orchestrator.quotas.host_copies import ChargedWrites, HostCopies, HostCopyRefused
from orchestrator.tools.call_records import not_kept_body, too_large_to_keep
from orchestrator.tools.transfer_slots import TransferSlots
from sandbox_agent.wire import ReadBytesResult

STREAM_MIN_BYTES = 1024 * 1024  # smaller answers are read whole, as before (the warm path)
ENCODE_PIECE = 3 * 256 * 1024  # bytes encoded at a time: a multiple of 3, so no padding mid-stream
TOOL = "read_bytes"


def json_frame(path: str, size: int, media_type: str) -> tuple[bytes, bytes]:
    """What comes before and after the base64 text in the answer, rendered exactly as
    `JSONResponse` renders `{"ok": true, "result": ReadBytesResult.model_dump(mode="json")}`."""
    result = {"path": path, "size": size, "media_type": media_type, "content_base64": ""}
    text = json.dumps({"ok": True, "result": result}, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
    assert text.endswith('""}}')
    return text[:-3].encode("utf-8"), b'"}}'


def base64_length(size: int) -> int:
    return 4 * ((size + 2) // 3)


class ReadBytesSpool:
    """The `RawSpool` of one call: takes the user's transfer slot when a large answer comes
    (waiting at most the slots' wait), and hands out an empty unlinked temp file per attempt.
    `close()` gives both back; it is idempotent."""

    def __init__(self, slots: TransferSlots, user_id: int, directory: Path, copies: HostCopies) -> None:
        self.min_bytes = STREAM_MIN_BYTES
        self._slots = slots
        self._user_id = user_id
        self._directory = directory
        self._slot = False
        # The announced length is charged to the user's host copies before a byte is written.
        self._charged = ChargedWrites(copies, user_id)
        self.file: BinaryIO | None = None

    async def open(self, length: int) -> BinaryIO:
        if not self._slot:
            await self._slots.take_async(self._user_id, TOOL)
            self._slot = True
        self._charged(length - self._charged.charged)  # HostCopyRefused: nothing written yet
        try:
            if self.file is None:
                # Unlinked at once: a crash leaves nothing on disk; the slots bound how many exist.
                # Unbuffered: the answer is read back by descriptor (pread), so a write buffer's
                # bytes (an agent's last small piece) would be missing from it.
                self.file = tempfile.TemporaryFile(dir=self._directory, prefix=".read-bytes-", buffering=0)  # type: ignore[assignment]
            else:  # a retried attempt starts over
                self.file.seek(0)
                self.file.truncate()
        except OSError as exc:
            raise SpoolWriteFailed(exc) from exc
        assert self.file is not None
        return _Guarded(self.file)

    def close(self) -> None:
        file, self.file = self.file, None
        if file is not None:
            file.close()
        self._charged.settle(kept_as=None)
        if self._slot:
            self._slot = False
            self._slots.give_back(self._user_id)


class _Guarded:
    """The spool file as the client's sink: a failed write (a full disk) is `SpoolWriteFailed`,
    never an OSError the client would take for a broken agent connection."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        try:
            while view:  # an unbuffered write may take fewer bytes than given
                view = view[self._file.write(view) :]
        except OSError as exc:
            raise SpoolWriteFailed(exc) from exc
        return len(data)


def spool_failed(exc: SpoolWriteFailed, *, tool: str = TOOL) -> ToolError:
    """A transfer whose spool could not be written (a full disk or quota, or the user's
    host-copy budget refused it): it did nothing."""
    if isinstance(exc, HostCopyRefused):
        return exc.tool_error(tool)
    return ToolError(
        "no_space" if exc.no_space else "internal_error",
        f"{tool} did not run to the end: the file's bytes could not be written on the way ({exc}). "
        "Nothing was sent or kept; free some space or try a smaller file.",
    )


@dataclass
class StreamedReadBytes:
    """A verified read_bytes result whose bytes are in the spool's file; owns the spool."""

    path: str
    size: int
    media_type: str
    spool: ReadBytesSpool
    _head: bytes = field(init=False, repr=False)
    _tail: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._head, self._tail = json_frame(self.path, self.size, self.media_type)

    @classmethod
    def of(cls, result: ReadBytesResult, spool: ReadBytesSpool) -> StreamedReadBytes:
        return cls(result.path, result.size, result.media_type, spool)

    def summary(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "media_type": self.media_type}

    def content_length(self) -> int:
        return len(self._head) + base64_length(self.size) + len(self._tail)

    def pieces(self) -> list[int]:
        """The offsets of the pieces `encoded_piece` reads."""
        return list(range(0, self.size, ENCODE_PIECE))

    def head(self) -> bytes:
        return self._head

    def tail(self) -> bytes:
        return self._tail

    def encoded_piece(self, offset: int) -> bytes:
        """The base64 of the spool's bytes at `offset` (blocking: a worker thread). A spool
        shorter than its verified size (it cannot be: it was counted as it was written)
        would make the answer shorter than its Content-Length, which a client detects."""
        assert self.spool.file is not None
        data = os.pread(self.spool.file.fileno(), min(ENCODE_PIECE, self.size - offset), offset)
        return base64.b64encode(data)

    def recorded_body(self, max_bytes: int) -> dict[str, Any]:
        """What a `tool_call_id` repeat gets: the whole body when it fits the record's cap
        (read back once, at most `max_bytes`), else the `result_not_kept` answer."""
        if self.content_length() > max_bytes:
            return not_kept_body("ok", too_large_to_keep(max_bytes))
        assert self.spool.file is not None
        data = os.pread(self.spool.file.fileno(), self.size, 0)
        content = base64.b64encode(data).decode("ascii")
        return {"ok": True, "result": {**self.summary(), "content_base64": content}}

    def close(self) -> None:
        self.spool.close()
