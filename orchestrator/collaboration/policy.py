"""Pure decisions of the collaboration rules (docs/collaboration.md): who may contact whom, which side
may send which message kind, operation keys, work generations, and what a claim does.

Nothing here touches a database or the clock; the coordinator gathers the facts and applies
the answer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from orchestrator.collaboration.records import Direction, MessageKind, Request, Side
from orchestrator.collaboration.states import ContinuationState, RequestEvent, RequestState, weakest
from orchestrator.identity import Trigger
from orchestrator.settings import CollaborationSettings

# A run with one of these triggers and no delivery is new work by a user: it begins a new
# work generation on its session, which makes older generations receive-only.
NEW_WORK_TRIGGERS = frozenset(
    {Trigger.GROUP_MESSAGE, Trigger.PRIVATE_MESSAGE, Trigger.WEB, Trigger.WECHAT, Trigger.OPENAPI}
)
# These continue the work of the latest user run (same generation).
SAME_WORK_TRIGGERS = frozenset({Trigger.RETRY, Trigger.CRASH_RECOVERY})

TARGET_KINDS = frozenset({MessageKind.PROGRESS, MessageKind.CLARIFICATION, MessageKind.REPLY})
SOURCE_KINDS = frozenset({MessageKind.SUPPLEMENT})
# Kinds that travel back to the source and may start a continuation run there.
TO_SOURCE_KINDS = frozenset({MessageKind.CLARIFICATION, MessageKind.REPLY})

_EVENT_FOR_KIND = {
    MessageKind.PROGRESS: RequestEvent.PROGRESS,
    MessageKind.CLARIFICATION: RequestEvent.CLARIFIED,
    MessageKind.SUPPLEMENT: RequestEvent.SUPPLEMENTED,
    MessageKind.REPLY: RequestEvent.REPLIED,
}


@dataclass(frozen=True)
class CollaborationLimits:
    queue_max: int = 20  # pending work deliveries per target session
    clarifications_max: int = 3  # per request
    continuations_max: int = 5  # automatic continuation runs per scope (source work generation)
    merge_max: int = 10  # messages merged into one continuation delivery
    progress_max: int = 20  # progress notes per request
    message_max_chars: int = 16_000
    claim_timeout_s: float = 120.0  # a claim not started by then becomes `review`

    @classmethod
    def from_settings(cls, settings: CollaborationSettings) -> CollaborationLimits:
        return cls(**settings.model_dump())  # progress_max is no setting: its default stays


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SessionFacts:
    session_id: str
    owner_user_id: int
    project_id: str | None


def body_hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def op_key(tool: str, run_id: str, tool_call_id: str | None, digest: str) -> str:
    """The operation key of a tool call, bound to (run, tool_call_id).

    Without a tool_call_id the key is the body within the run: a retried identical call is
    the same operation, and so is a model repeating itself word for word in one run.
    """
    if tool_call_id is not None:
        return f"{tool}:{run_id}:call:{tool_call_id}"
    return f"{tool}:{run_id}:body:{digest}"


def same_operation(stored_hash: str, new_hash: str, what: str, key_id: str) -> Refusal | None:
    if stored_hash == new_hash:
        return None
    return Refusal(
        "conflict",
        f"this tool call id was already used for a different {what} ({key_id}); "
        "use a new tool call id for a new operation",
        {"existing_id": key_id},
    )


def too_large(message: str, limits: CollaborationLimits) -> Refusal | None:
    if len(message) <= limits.message_max_chars:
        return None
    return Refusal(
        "too_large",
        f"message has {len(message)} characters; the limit is {limits.message_max_chars}: "
        "send a summary and point to files instead",
        {"limit": limits.message_max_chars},
    )


def cross_project_allowed(
    source_project: str | None, target_project: str | None, source_allows: bool, target_allows: bool
) -> bool:
    return source_project == target_project or (source_allows and target_allows)


def check_contact(
    *,
    source: SessionFacts,
    runtime_user_id: int,
    handling_inbound_request: bool,
    target_id: str,
    target: SessionFacts | None,
    cross_project_ok: bool,
) -> Refusal | None:
    """Whether this run may ask `target_id` for help. Facts about the caller first, so that a
    refusal about the target never reveals more than "not found"."""
    if runtime_user_id != source.owner_user_id:
        # Like cross-session reading: a group member's run must not push work into
        # the owner's other sessions, which would run with the owner's identity.
        return Refusal(
            "forbidden",
            "contact_session acts for the session owner, and this run acts for another member; "
            "ask the owner to start the collaboration",
        )
    if handling_inbound_request:
        return Refusal(
            "forbidden",
            "this run is handling a collaboration request: answer it with reply_to_collaboration; "
            "it cannot be forwarded to a third session",
        )
    if target_id == source.session_id:
        return Refusal("invalid_arguments", "a session cannot contact itself", {"field": "target"})
    if target is None or target.owner_user_id != source.owner_user_id:
        return Refusal("not_found", f"no session {target_id} that this session can contact", {"field": "target"})
    if not cross_project_ok:
        # The refusal names neither project (their names are not the asker's to know).
        return Refusal(
            "forbidden", "collaboration with sessions of another project is turned off", {"field": "target"}
        )
    return None


def side_of(session_id: str, request: Request) -> Side | None:
    if session_id == request.target_session_id:
        return Side.TARGET
    if session_id == request.source_session_id:
        return Side.SOURCE
    return None


def check_reply(
    *, side: Side, kind: MessageKind, request: Request, runtime_user_id: int, owner_user_id: int,
    limits: CollaborationLimits,
) -> Refusal | None:
    if runtime_user_id != owner_user_id:
        return Refusal(
            "forbidden",
            "reply_to_collaboration acts for the session owner, and this run acts for another member",
        )
    if side is Side.TARGET and kind not in TARGET_KINDS:
        return Refusal(
            "forbidden",
            "the asked session answers with kind progress, clarification or reply; supplement is for the asker",
            {"field": "kind"},
        )
    if side is Side.SOURCE and kind not in SOURCE_KINDS:
        return Refusal(
            "forbidden",
            "the asking session adds information with kind supplement; progress, clarification and "
            "reply are for the asked session",
            {"field": "kind"},
        )
    if request.state not in (RequestState.PENDING, RequestState.PROCESSING, RequestState.AWAITING_INPUT):
        return Refusal(
            "request_closed",
            f"request {request.request_id} is {request.state.value}"
            + (f" ({request.reason})" if request.reason else "")
            + "; nothing more can be sent on it",
            {"state": request.state.value},
        )
    if kind is MessageKind.SUPPLEMENT and request.continuation is ContinuationState.REVOKED:
        return Refusal("request_closed", f"request {request.request_id} was stopped", {"state": request.state.value})
    if kind is MessageKind.CLARIFICATION and request.clarification_count >= limits.clarifications_max:
        return Refusal(
            "limit_reached",
            f"request {request.request_id} already had {limits.clarifications_max} clarifications: "
            "reply with what you have and say what is missing",
            {"limit": limits.clarifications_max},
        )
    if kind is MessageKind.PROGRESS and request.progress_count >= limits.progress_max:
        return Refusal(
            "limit_reached",
            f"request {request.request_id} already has {limits.progress_max} progress notes",
            {"limit": limits.progress_max},
        )
    return None


def event_for(kind: MessageKind) -> RequestEvent:
    return _EVENT_FOR_KIND[kind]


def queue_full(queued: int, limits: CollaborationLimits, target_id: str) -> Refusal | None:
    if queued < limits.queue_max:
        return None
    return Refusal(
        "queue_full",
        f"session {target_id} already has {queued} requests waiting (the limit is {limits.queue_max}); "
        "try again after it has worked through some",
        {"limit": limits.queue_max},
    )


def generation_for(
    *, trigger: Trigger, run_id: str, delivery_generation: str | None, latest_work_run_id: str | None
) -> str:
    """The work generation a run belongs to: the id of the user run that began the work.

    A continuation run inherits the generation of the scope it continues; retry and crash
    recovery continue the latest user run; any other run is its own piece of work.
    """
    if delivery_generation is not None:
        return delivery_generation
    if trigger in SAME_WORK_TRIGGERS and latest_work_run_id is not None:
        return latest_work_run_id
    return run_id


@dataclass(frozen=True)
class ClaimDecision:
    claim: bool
    reason: str | None = None  # why the delivery is cancelled (claim=False)
    request_event: RequestEvent | None = None  # what the cancel does to a work delivery's request
    keep: tuple[str, ...] = ()  # continuation: messages still allowed to start work
    drop: tuple[str, ...] = ()  # continuation: messages that are only received (stored, not delivered)


def decide_work_claim(
    *, request_state: RequestState, target_alive: bool, source_alive: bool, cross_project_ok: bool
) -> ClaimDecision:
    """Re-check a queued work delivery right before a bot gets it (target, scope, rights)."""
    if request_state not in (RequestState.PENDING, RequestState.AWAITING_INPUT):
        return ClaimDecision(False, reason=f"request_{request_state.value}")
    if not target_alive:
        return ClaimDecision(False, reason="target_unavailable", request_event=RequestEvent.PARTY_UNAVAILABLE)
    if not source_alive:
        return ClaimDecision(False, reason="source_unavailable", request_event=RequestEvent.PARTY_UNAVAILABLE)
    if not cross_project_ok:
        return ClaimDecision(False, reason="cross_project_disabled", request_event=RequestEvent.PARTY_UNAVAILABLE)
    return ClaimDecision(True)


def decide_continuation_claim(
    *, scope_state: ContinuationState, source_alive: bool, permissions: dict[str, ContinuationState]
) -> ClaimDecision:
    """`permissions`: each carried message's request continuation. Only messages whose request
    and scope are both still active may start a run; the others stay stored and visible."""
    if not source_alive:
        return ClaimDecision(False, reason="source_unavailable", drop=tuple(permissions))
    keep = tuple(m for m, state in permissions.items() if weakest(scope_state, state) is ContinuationState.ACTIVE)
    drop = tuple(m for m in permissions if m not in keep)
    if not keep:
        worst = weakest(scope_state, *permissions.values()) if permissions else scope_state
        return ClaimDecision(False, reason=worst.value if worst is not ContinuationState.ACTIVE else "empty", drop=drop)
    return ClaimDecision(True, keep=keep, drop=drop)


def direction_of_kind(kind: MessageKind) -> Direction | None:
    """Where a new message travels: supplements to the target, answers back to the source."""
    if kind is MessageKind.SUPPLEMENT:
        return Direction.WORK
    if kind in TO_SOURCE_KINDS:
        return Direction.CONTINUATION
    return None  # progress is stored and starts nothing
