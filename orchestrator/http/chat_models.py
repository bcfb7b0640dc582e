"""Bodies of the chat-record and session-list endpoints. Unknown fields are refused."""

from __future__ import annotations

from pydantic import BaseModel, Field

from orchestrator.http.openapi import ABSOLUTE_CAP
from orchestrator.sessions.chat_records import NewMessage, Role, ToolCallSummary
from orchestrator.sessions.chat_store import AppendResult
from orchestrator.http.models import Body, FromRecord, SessionOut, UserIdInt

MESSAGE_CONTENT_MAX = 100_000
MESSAGES_PER_REQUEST_MAX = 200
TOOL_CALLS_PER_MESSAGE_MAX = 100
MESSAGES_READ_DEFAULT = 50
MESSAGES_READ_MAX = 500
_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"


class MessageToolCallIn(Body):
    name: str = Field(..., min_length=1, max_length=200, pattern=_PRINTABLE)
    status: str = Field(..., min_length=1, max_length=40, pattern=_PRINTABLE)


class MessageIn(Body):
    role: Role
    content: str = Field(..., max_length=MESSAGE_CONTENT_MAX)
    tool_calls: list[MessageToolCallIn] = Field(default_factory=list, max_length=TOOL_CALLS_PER_MESSAGE_MAX)
    # Stored as said: a past speaker need not be a user of this instance (no ORCH_MAX_USER_ID).
    speaker_user_id: UserIdInt | None = Field(None, json_schema_extra={ABSOLUTE_CAP: True})

    def new(self) -> NewMessage:
        return NewMessage(
            role=self.role,
            content=self.content,
            tool_calls=tuple(ToolCallSummary(c.name, c.status) for c in self.tool_calls),
            speaker_user_id=self.speaker_user_id,
        )


class MessagesIn(Body):
    messages: list[MessageIn] = Field(..., min_length=1, max_length=MESSAGES_PER_REQUEST_MAX)


class AppendOut(BaseModel):
    session_id: str
    appended: int
    message_count: int
    last_seq: int
    transcript_turns: int

    @classmethod
    def of(cls, session_id: str, result: AppendResult) -> AppendOut:
        return cls(session_id=session_id, **result.__dict__)


class MessageToolCallOut(FromRecord):
    name: str
    status: str


class MessageOut(FromRecord):
    seq: int
    at: str
    role: Role
    content: str
    tool_calls: list[MessageToolCallOut]
    speaker_user_id: int | None


class MessagesOut(BaseModel):
    session_id: str
    total: int
    messages: list[MessageOut]


class SessionListOut(FromRecord):
    owner_user_id: int | None  # None: a group's sessions, whoever owns them
    project_id: str | None
    sessions: list[SessionOut]


class DeletedOut(BaseModel):
    session_id: str
    deleted: bool
    cleanup_done: bool
