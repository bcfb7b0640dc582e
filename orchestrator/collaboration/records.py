"""The four records of the mailbox, as read from the store."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from orchestrator.collaboration.states import ContinuationState, DeliveryState, RequestState


class Direction(str, Enum):
    WORK = "work"  # to the target: a request or a supplement to work on
    CONTINUATION = "continuation"  # back to the source: replies and clarifications


class MessageKind(str, Enum):
    REQUEST = "request"
    PROGRESS = "progress"
    CLARIFICATION = "clarification"
    SUPPLEMENT = "supplement"
    REPLY = "reply"


class Side(str, Enum):
    SOURCE = "source"
    TARGET = "target"


@dataclass(frozen=True)
class Scope:
    """A continuation scope: one per (source session, work generation)."""

    scope_id: str
    source_session_id: str
    generation: str  # the id of the user run that began this piece of work
    state: ContinuationState
    reason: str | None
    version: int
    continuation_count: int
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class Request:
    seq: int
    request_id: str
    scope_id: str
    source_session_id: str
    source_run_id: str
    generation: str
    target_session_id: str
    state: RequestState
    reason: str | None
    continuation: ContinuationState
    continuation_reason: str | None
    clarification_count: int
    progress_count: int
    op_key: str
    body_hash: str
    version: int
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class Message:
    message_id: str
    request_id: str
    seq: int
    sender: Side
    sender_session_id: str
    sender_run_id: str
    kind: MessageKind
    body: str
    op_key: str
    body_hash: str
    created_at: str


@dataclass(frozen=True)
class Delivery:
    seq: int  # FIFO order within the receiving session
    delivery_id: str
    session_id: str  # who receives it
    direction: Direction
    request_id: str | None  # work deliveries carry one request; continuations merge a scope's
    scope_id: str
    state: DeliveryState
    reason: str | None
    version: int
    run_id: str | None
    claimed_at: str | None
    claim_expires_at: str | None
    outcome: str | None
    created_at: str
    updated_at: str
