"""What a session's chat records hold, as values: messages, turns, the transcript.

Pure: building a transcript from messages, and (de)serializing both, never touches disk.
`messages.json` keeps every message appended; `transcript.json` is derived from it on every
append: the last N turns, user and assistant text with tool calls as name + status, tool
results left out (they are bulky and rarely worth searching).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

RECORD_VERSION = 1


class Role(str, Enum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True)
class ToolCallSummary:
    name: str
    status: str


@dataclass(frozen=True)
class NewMessage:
    """A message as a client appends it (the body of POST .../messages)."""

    role: Role
    content: str
    tool_calls: tuple[ToolCallSummary, ...] = ()
    speaker_user_id: int | None = None


@dataclass(frozen=True)
class ChatMessage:
    seq: int  # 1-based position in the session, never reused
    at: str
    role: Role
    content: str
    tool_calls: tuple[ToolCallSummary, ...] = ()
    speaker_user_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at,
            "role": self.role.value,
            "content": self.content,
            "tool_calls": [{"name": c.name, "status": c.status} for c in self.tool_calls],
            "speaker_user_id": self.speaker_user_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChatMessage:
        return cls(
            seq=int(data["seq"]),
            at=str(data["at"]),
            role=Role(data["role"]),
            content=str(data["content"]),
            tool_calls=tuple(ToolCallSummary(str(c["name"]), str(c["status"])) for c in data.get("tool_calls", ())),
            speaker_user_id=data.get("speaker_user_id"),
        )


@dataclass(frozen=True)
class Turn:
    """One exchange: a user message and what followed it, up to the next user message."""

    number: int  # 1-based, counted from the start of the session
    messages: tuple[ChatMessage, ...]


def stamp(new: Sequence[NewMessage], *, next_seq: int, at: str) -> list[ChatMessage]:
    return [
        ChatMessage(
            seq=next_seq + i,
            at=at,
            role=m.role,
            content=m.content,
            tool_calls=m.tool_calls,
            speaker_user_id=m.speaker_user_id,
        )
        for i, m in enumerate(new)
    ]


def split_turns(messages: Sequence[ChatMessage]) -> list[Turn]:
    """A turn starts at every user message (and at the first message, whatever its role)."""
    turns: list[list[ChatMessage]] = []
    for message in messages:
        if not turns or message.role is Role.USER:
            turns.append([])
        turns[-1].append(message)
    return [Turn(number=i + 1, messages=tuple(t)) for i, t in enumerate(turns)]


def transcript_of(messages: Sequence[ChatMessage], turns_kept: int) -> list[Turn]:
    """The last `turns_kept` turns, tool results left out."""
    kept = split_turns(messages)[-turns_kept:]
    return [Turn(t.number, tuple(m for m in t.messages if m.role is not Role.TOOL)) for t in kept]


@dataclass(frozen=True)
class AppendedRecords:
    """The new contents of both files after an append, and what to tell the client."""

    messages_json: bytes
    transcript_json: bytes
    appended: int
    message_count: int
    last_seq: int
    transcript_turns: int


def append_records(
    session_id: str, current: bytes | None, new: Sequence[NewMessage], *, at: str, turns_kept: int
) -> AppendedRecords:
    """Append `new` to the stored `messages.json` bytes and derive the transcript.

    Works on the stored dicts and only turns the transcript's tail into values: decoding and
    re-encoding every message of a long session would dominate an append's cost.
    """
    stored: list[dict[str, Any]] = json.loads(current)["messages"] if current is not None else []
    next_seq = int(stored[-1]["seq"]) + 1 if stored else 1
    stamped = stamp(new, next_seq=next_seq, at=at)
    stored.extend(m.to_json() for m in stamped)
    starts = [i for i, m in enumerate(stored) if i == 0 or m["role"] == Role.USER.value]
    kept = starts[-turns_kept:]
    tail = [ChatMessage.from_json(m) for m in stored[kept[0] :]] if kept else []
    offset = len(starts) - len(kept)
    turns = [Turn(t.number + offset, t.messages) for t in transcript_of(tail, turns_kept)]
    document = {"version": RECORD_VERSION, "session_id": session_id, "messages": stored}
    return AppendedRecords(
        messages_json=json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode(),
        transcript_json=encode_transcript(session_id, turns, turns_kept),
        appended=len(stamped),
        message_count=len(stored),
        last_seq=int(stored[-1]["seq"]) if stored else 0,
        transcript_turns=len(turns),
    )


def encode_messages(session_id: str, messages: Sequence[ChatMessage]) -> bytes:
    document = {"version": RECORD_VERSION, "session_id": session_id, "messages": [m.to_json() for m in messages]}
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def decode_messages(data: bytes) -> list[ChatMessage]:
    return decode_window(data, None)[0]


def decode_window(data: bytes, last: int | None) -> tuple[list[ChatMessage], int]:
    """The last `last` messages (all when None) and the total; the rest never become values."""
    stored = json.loads(data)["messages"]
    window = stored if last is None else stored[-last:] if last > 0 else []
    return [ChatMessage.from_json(m) for m in window], len(stored)


def encode_transcript(session_id: str, turns: Sequence[Turn], turns_kept: int) -> bytes:
    document = {
        "version": RECORD_VERSION,
        "session_id": session_id,
        "turns_kept": turns_kept,
        "turns": [{"turn": t.number, "messages": [m.to_json() for m in t.messages]} for t in turns],
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def decode_transcript(data: bytes) -> list[Turn]:
    document = json.loads(data)
    return [
        Turn(number=int(t["turn"]), messages=tuple(ChatMessage.from_json(m) for m in t["messages"]))
        for t in document["turns"]
    ]
