"""Response bodies of the collaboration endpoints."""

from __future__ import annotations

from pydantic import BaseModel

from orchestrator.collaboration import delivery_text
from orchestrator.collaboration.coordinator import InboxItem, RequestView
from orchestrator.http.models import FromRecord


class MessageOut(FromRecord):
    # Read off a `Message` (`model_validate`); its enums (sender, kind) answer as their values.
    message_id: str
    request_id: str
    seq: int
    sender: str
    sender_session_id: str
    kind: str
    body: str
    created_at: str


class DeliveryStateOut(FromRecord):
    # Read off a `Delivery` (`model_validate`); its enums (direction, state) answer as their values.
    delivery_id: str
    session_id: str
    direction: str
    state: str
    reason: str | None
    run_id: str | None
    outcome: str | None
    created_at: str
    updated_at: str


class InboxDeliveryOut(BaseModel):
    delivery_id: str
    session_id: str
    direction: str
    request_ids: list[str]
    claim_expires_at: str
    messages: list[MessageOut]
    context: str  # the text to give the agent of the run that handles it

    @classmethod
    def of(cls, item: InboxItem) -> InboxDeliveryOut:
        d = item.delivery
        return cls(
            delivery_id=d.delivery_id,
            session_id=d.session_id,
            direction=d.direction.value,
            request_ids=sorted(item.requests),
            claim_expires_at=d.claim_expires_at or "",
            messages=[MessageOut.model_validate(m) for m in item.messages],
            context=delivery_text.render(d.direction, item.requests, item.messages),
        )


class InboxOut(BaseModel):
    delivery: InboxDeliveryOut | None


class CollaborationOut(BaseModel):
    request_id: str
    role: str  # outgoing: this session asked; incoming: this session was asked
    source_session_id: str
    target_session_id: str
    generation: str
    state: str
    reason: str | None
    delivery_state: str | None  # of the newest delivery that carries this request
    continuation: str
    continuation_reason: str | None
    clarification_count: int
    messages: list[MessageOut]
    deliveries: list[DeliveryStateOut]
    created_at: str
    updated_at: str

    @classmethod
    def of(cls, view: RequestView, session_id: str) -> CollaborationOut:
        r = view.request
        return cls(
            request_id=r.request_id,
            role="outgoing" if r.source_session_id == session_id else "incoming",
            source_session_id=r.source_session_id,
            target_session_id=r.target_session_id,
            generation=r.generation,
            state=r.state.value,
            reason=r.reason,
            delivery_state=view.delivery_state.value if view.delivery_state else None,
            continuation=r.continuation.value,
            continuation_reason=r.continuation_reason,
            clarification_count=r.clarification_count,
            messages=[MessageOut.model_validate(m) for m in view.messages],
            deliveries=[DeliveryStateOut.model_validate(d) for d in view.deliveries],
            created_at=r.created_at,
            updated_at=r.updated_at,
        )


class CollaborationListOut(BaseModel):
    collaborations: list[CollaborationOut]
    next_before: int | None  # pass as `before` for the next (older) page


class StopOut(BaseModel):
    collaboration: CollaborationOut
    cancelled_run_ids: list[str]
