"""The collaboration coordinator: requests, answers,
the inbox claim, the delivery ↔ run link, stop, listing and restart recovery.

It gathers facts (mailbox rows, sessions, runs, project switches), asks `states`/`policy` what
they mean, and writes the answer in one mailbox transaction.

Lock order (two SQLite files): a transaction on the orchestrator database may open a mailbox
transaction inside it (the start guard), never the reverse. Whatever has to end a run
(stop, recovery) does it after its mailbox transaction committed.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from orchestrator import audit
from orchestrator.clock import now_iso
from orchestrator.collaboration import policy
from orchestrator.collaboration.facts import Facts
from orchestrator.collaboration.inbox_signals import InboxSignals
from orchestrator.collaboration.policy import ClaimDecision, CollaborationLimits, Refusal, SessionFacts
from orchestrator.collaboration.records import Delivery, Direction, Message, MessageKind, Request, Scope, Side
from orchestrator.collaboration.states import (
    ContinuationEvent,
    ContinuationState,
    DeliveryEvent,
    DeliveryState,
    RequestEvent,
    RequestState,
    next_continuation_state,
    next_delivery_state,
    next_request_state,
    weakest,
)
from orchestrator.collaboration.store import Mailbox
from orchestrator.crash_points import crash_point
from orchestrator.errors import Conflict, InvalidInput, NotFound, ToolError
from orchestrator.log import kv, run_logger
from orchestrator.runs.records import RunRecord, RunStatus
from orchestrator.sessions.records import SessionRecord
from orchestrator.state_store import StateStore, Transaction

log = logging.getLogger(__name__)

DELIVERY_ID = re.compile(r"cd-[0-9a-f]{24}")
REQUEST_ID = re.compile(r"cr-[0-9a-f]{24}")


def _new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def _tool_error(refusal: Refusal) -> ToolError:
    return ToolError(refusal.code, refusal.message, **refusal.details)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class InboxItem:
    """A claimed delivery, as handed to a chat bot."""

    delivery: Delivery
    messages: list[Message]
    requests: dict[str, Request]


@dataclass(frozen=True)
class RequestView:
    request: Request
    messages: list[Message]
    deliveries: list[Delivery]

    @property
    def delivery_state(self) -> DeliveryState | None:
        return self.deliveries[-1].state if self.deliveries else None


@dataclass(frozen=True)
class StopResult:
    view: RequestView
    cancelled_run_ids: list[str]


@dataclass(frozen=True)
class RecoveryReport:
    review: list[str]  # deliveries whose start was uncertain: marked, never replayed
    settled: list[str]  # linked deliveries whose run had ended while nobody listened
    cancelled_runs: list[str]  # runs created for a start that was never confirmed to the bot


class CollaborationService:
    def __init__(
        self,
        *,
        mailbox: StateStore,
        state: StateStore,
        end_run: Callable[[str], None],
        limits: CollaborationLimits,
        signals: InboxSignals | None = None,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._mailbox = mailbox
        self._state = state
        self._end_run = end_run
        self.limits = limits
        self.signals = signals or InboxSignals()
        self._clock = clock

    # facts ------------------------------------------------------------------------------
    def _facts(self) -> Facts:
        return Facts.fresh(self._state)

    @staticmethod
    def _generation_of(facts: Facts, run: RunRecord, delivery_scope: Scope | None) -> str:
        latest = None
        if run.trigger in policy.SAME_WORK_TRIGGERS:
            previous = facts.latest_user_run(run.session_id, before=run.started_at)
            latest = previous.run_id if previous else None
        return policy.generation_for(
            trigger=run.trigger,
            run_id=run.run_id,
            delivery_generation=delivery_scope.generation if delivery_scope else None,
            latest_work_run_id=latest,
        )

    # continuation axis --------------------------------------------------------------------
    def _move_scope(self, tx: Transaction, scope: Scope, event: ContinuationEvent, reason: str) -> Scope:
        """Apply a continuation event to a scope and every request in it (never back to active)."""
        new = next_continuation_state(scope.state, event)
        if new is not scope.state:
            Mailbox.update_scope(tx, scope, state=new, reason=reason)
        for request in Mailbox.requests_in_scope(tx, scope.scope_id):
            self._move_request_continuation(tx, request, event, reason)
        return Mailbox.scope(tx, scope.scope_id)  # type: ignore[return-value]

    @staticmethod
    def _move_request_continuation(tx: Transaction, request: Request, event: ContinuationEvent, reason: str) -> None:
        new = next_continuation_state(request.continuation, event)
        if new is not request.continuation:
            Mailbox.update_request(tx, request, continuation=new, continuation_reason=reason)

    def _current_scope(self, tx: Transaction, facts: Facts, scope: Scope) -> Scope:
        """The scope with a newer user run on its session taken into account."""
        if scope.state is ContinuationState.ACTIVE and facts.superseded(scope.source_session_id, scope.generation):
            return self._move_scope(tx, scope, ContinuationEvent.SUPERSEDED, "superseded")
        return scope

    def _scope_for(self, tx: Transaction, facts: Facts, session_id: str, generation: str) -> Scope:
        scope = Mailbox.scope_for(tx, session_id, generation)
        if scope is None:
            now = now_iso()
            superseded = facts.superseded(session_id, generation)
            scope = Scope(
                scope_id=_new_id("cs"),
                source_session_id=session_id,
                generation=generation,
                state=ContinuationState.RECEIVE_ONLY if superseded else ContinuationState.ACTIVE,
                reason="superseded" if superseded else None,
                version=1,
                continuation_count=0,
                created_at=now,
                updated_at=now,
            )
            Mailbox.insert_scope(tx, scope)
            return scope
        return self._current_scope(tx, facts, scope)

    # request axis -------------------------------------------------------------------------
    @staticmethod
    def _move_request(tx: Transaction, request: Request, event: RequestEvent, reason: str | None = None,
                      **more: Any) -> Request:
        new = next_request_state(request.state, event)
        changes: dict[str, Any] = dict(more)
        if new is not request.state:
            changes["state"] = new
            changes["reason"] = reason
        if changes:
            won = Mailbox.update_request(tx, request, **changes)
            assert won, "the mailbox write lock is held: nobody else can change the row"
        return Mailbox.request(tx, request.request_id)  # type: ignore[return-value]

    # delivery axis ------------------------------------------------------------------------
    @staticmethod
    def _move_delivery(tx: Transaction, delivery: Delivery, event: DeliveryEvent, **changes: Any) -> Delivery:
        new = next_delivery_state(delivery.state, event)
        won = Mailbox.update_delivery(tx, delivery, state=new, **changes)
        assert won, "the mailbox write lock is held: nobody else can change the row"
        return Mailbox.delivery(tx, delivery.delivery_id)  # type: ignore[return-value]

    def _cancel_delivery(self, tx: Transaction, delivery: Delivery, reason: str) -> Delivery:
        return self._move_delivery(tx, delivery, DeliveryEvent.CANCEL, reason=reason)

    def _mark_uncertain(self, tx: Transaction, facts: Facts, delivery: Delivery, reason: str) -> str | None:
        """Claimed or starting, and nobody can prove what happened: review, never replayed.
        Returns the id of a run created for it that must be cancelled (nobody was told its id)."""
        self._move_delivery(tx, delivery, DeliveryEvent.UNCERTAIN, reason=reason)
        if delivery.direction is Direction.WORK and delivery.request_id is not None:
            request = Mailbox.request(tx, delivery.request_id)
            if request is not None:
                self._move_request(tx, request, RequestEvent.START_UNCERTAIN, reason)
        log.warning(
            "delivery start uncertain: marked for review, not replayed %s",
            kv(delivery=delivery.delivery_id, session=delivery.session_id, reason=reason, run=delivery.run_id),
        )
        if delivery.run_id is not None:
            run = facts.run(delivery.run_id)
            if run is not None and run.status is RunStatus.RUNNING:
                return run.run_id
        return None

    def _settle(self, tx: Transaction, delivery: Delivery, status: RunStatus) -> None:
        self._move_delivery(tx, delivery, DeliveryEvent.SETTLE, outcome=status.value)
        if delivery.direction is not Direction.WORK or delivery.request_id is None:
            return
        request = Mailbox.request(tx, delivery.request_id)
        if request is None:
            return
        more = Mailbox.pending_work_for(tx, request.request_id) is not None
        event = RequestEvent.RUN_ENDED_MORE_QUEUED if more else RequestEvent.RUN_ENDED_NO_RESULT
        # A target run that ends without a reply or a clarification fails the request.
        self._move_request(tx, request, event, "no_result" if not more else None)

    def _cancel_runs(self, run_ids: list[str]) -> list[str]:
        cancelled = []
        for run_id in run_ids:
            try:
                self._end_run(run_id)
                cancelled.append(run_id)
            except (Conflict, NotFound):  # already ended, or never committed
                pass
        return cancelled

    # contact_session ------------------------------------------------------------------------
    def _delivery_of_run(self, run: RunRecord) -> tuple[Delivery | None, Scope | None]:
        if run.delivery_id is None:
            return None, None
        with self._mailbox.read() as tx:
            delivery = Mailbox.delivery(tx, run.delivery_id)
            scope = Mailbox.scope(tx, delivery.scope_id) if delivery else None
        return delivery, scope

    def contact(self, run: RunRecord, session: SessionRecord, target_id: str, message: str,
                tool_call_id: str | None) -> dict[str, Any]:
        """The `contact_session` tool: record a request and queue it for the target; never wait."""
        refusal = policy.too_large(message, self.limits)
        if refusal:
            raise _tool_error(refusal)
        facts = self._facts()
        delivery, delivery_scope = self._delivery_of_run(run)
        handling_inbound = delivery is not None and delivery.direction is Direction.WORK
        target = facts.session(target_id)
        target_facts = SessionFacts(target.session_id, target.owner_user_id, target.project_id) if target else None
        refusal = policy.check_contact(
            source=SessionFacts(session.session_id, session.owner_user_id, session.project_id),
            runtime_user_id=run.runtime_user_id,
            handling_inbound_request=handling_inbound,
            target_id=target_id,
            target=target_facts,
            cross_project_ok=target is None or facts.cross_project_ok(session.project_id, target.project_id),
        )
        if refusal:
            raise _tool_error(refusal)
        generation = self._generation_of(facts, run, delivery_scope if not handling_inbound else None)
        digest = policy.body_hash({"target": target_id, "message": message})
        key = policy.op_key("contact_session", run.run_id, tool_call_id, digest)
        with self._mailbox.write() as tx:
            existing = Mailbox.request_by_op_key(tx, key)
            if existing is not None:
                refusal = policy.same_operation(existing.body_hash, digest, "request", existing.request_id)
                if refusal:
                    raise _tool_error(refusal)
                return self._contact_answer(existing, duplicate=True)
            refusal = policy.queue_full(Mailbox.count_pending_work(tx, target_id), self.limits, target_id)
            if refusal:
                raise _tool_error(refusal)
            scope = self._scope_for(tx, facts, session.session_id, generation)
            now = now_iso()
            request = Request(
                seq=0,
                request_id=_new_id("cr"),
                scope_id=scope.scope_id,
                source_session_id=session.session_id,
                source_run_id=run.run_id,
                generation=generation,
                target_session_id=target_id,
                state=RequestState.PENDING,
                reason=None,
                continuation=scope.state,
                continuation_reason=scope.reason,
                clarification_count=0,
                progress_count=0,
                op_key=key,
                body_hash=digest,
                version=1,
                created_at=now,
                updated_at=now,
            )
            Mailbox.insert_request(tx, request)
            first = Message(
                message_id=_new_id("cm"),
                request_id=request.request_id,
                seq=1,
                sender=Side.SOURCE,
                sender_session_id=session.session_id,
                sender_run_id=run.run_id,
                kind=MessageKind.REQUEST,
                body=message,
                op_key=key,
                body_hash=digest,
                created_at=now,
            )
            Mailbox.insert_message(tx, first)
            delivery_id = _new_id("cd")
            Mailbox.insert_delivery(tx, delivery_id, target_id, Direction.WORK, request.request_id, scope.scope_id)
            Mailbox.attach(tx, delivery_id, first.message_id)
            crash_point("collab.contact.before_commit")
        crash_point("collab.contact.after_commit")
        self.signals.notify(target_id)
        run_logger(log, session=session.session_id, owner=run.owner_user_id, runtime_user=run.runtime_user_id).info(
            "collaboration requested %s", kv(request=request.request_id, target=target_id, generation=generation)
        )
        return self._contact_answer(request, duplicate=False)

    @staticmethod
    def _contact_answer(request: Request, *, duplicate: bool) -> dict[str, Any]:
        return {
            "request_id": request.request_id,
            "target": request.target_session_id,
            "state": request.state.value,
            "continuation": request.continuation.value,
            "duplicate": duplicate,
            "note": (
                "The request is queued for the other session. Its answer comes back to this session as a "
                "later run; do not wait, sleep or poll for it. Continue with other work or end this run."
            ),
        }

    # reply_to_collaboration -----------------------------------------------------------------
    def reply(self, run: RunRecord, session: SessionRecord, request_id: str, kind: MessageKind, message: str,
              tool_call_id: str | None) -> dict[str, Any]:
        refusal = policy.too_large(message, self.limits)
        if refusal:
            raise _tool_error(refusal)
        digest = policy.body_hash({"request_id": request_id, "kind": kind.value, "message": message})
        key = policy.op_key("reply_to_collaboration", run.run_id, tool_call_id, digest)
        wake: set[str] = set()
        with self._mailbox.write() as tx:
            existing = Mailbox.message_by_op_key(tx, key)
            if existing is not None:
                refusal = policy.same_operation(existing.body_hash, digest, "message", existing.message_id)
                if refusal:
                    raise _tool_error(refusal)
                request = Mailbox.request(tx, existing.request_id)
                assert request is not None
                return self._reply_answer(existing, request, delivered_by=None, duplicate=True)
            request = Mailbox.request(tx, request_id)
            side = policy.side_of(session.session_id, request) if request else None
            if request is None or side is None:
                raise ToolError("not_found", f"no collaboration request {request_id} for this session", field="request_id")
            refusal = policy.check_reply(
                side=side, kind=kind, request=request, runtime_user_id=run.runtime_user_id,
                owner_user_id=run.owner_user_id, limits=self.limits,
            )
            if refusal:
                raise _tool_error(refusal)
            counters: dict[str, int] = {}
            if kind is MessageKind.CLARIFICATION:
                counters["clarification_count"] = request.clarification_count + 1
            elif kind is MessageKind.PROGRESS:
                counters["progress_count"] = request.progress_count + 1
            request = self._move_request(tx, request, policy.event_for(kind), None, **counters)
            stored = Message(
                message_id=_new_id("cm"),
                request_id=request.request_id,
                seq=Mailbox.next_message_seq(tx, request.request_id),
                sender=side,
                sender_session_id=session.session_id,
                sender_run_id=run.run_id,
                kind=kind,
                body=message,
                op_key=key,
                body_hash=digest,
                created_at=now_iso(),
            )
            Mailbox.insert_message(tx, stored)
            delivered_by = None
            direction = policy.direction_of_kind(kind)
            if direction is Direction.CONTINUATION:
                if kind is MessageKind.REPLY:
                    # The final answer makes queued, not-yet-started work on the request moot.
                    for queued in Mailbox.unstarted_work_for(tx, request.request_id):
                        self._cancel_delivery(tx, queued, "answered")
                delivered_by = self._route_to_source(tx, self._facts(), request, stored)
                wake.add(request.source_session_id)
            elif direction is Direction.WORK:
                delivered_by = self._route_to_target(tx, request, stored)
                wake.add(request.target_session_id)
            crash_point("collab.reply.before_commit")
            request = Mailbox.request(tx, request.request_id)  # type: ignore[assignment]
        crash_point("collab.reply.after_commit")
        for session_id in wake:
            self.signals.notify(session_id)
        run_logger(log, session=session.session_id, owner=run.owner_user_id, runtime_user=run.runtime_user_id).info(
            "collaboration message %s",
            kv(request=request.request_id, kind=kind.value, state=request.state.value, delivery=delivered_by),
        )
        return self._reply_answer(stored, request, delivered_by=delivered_by, duplicate=False)

    @staticmethod
    def _reply_answer(message: Message, request: Request, *, delivered_by: str | None, duplicate: bool) -> dict[str, Any]:
        return {
            "request_id": request.request_id,
            "message_id": message.message_id,
            "kind": message.kind.value,
            "request_state": request.state.value,
            "continuation": request.continuation.value,
            "delivery_id": delivered_by,
            "duplicate": duplicate,
        }

    def _route_to_source(self, tx: Transaction, facts: Facts, request: Request, message: Message) -> str | None:
        """Queue an answer for the source if its continuation is still active; else it
        is stored and shown, and starts nothing."""
        scope = self._current_scope(tx, facts, Mailbox.scope(tx, request.scope_id))  # type: ignore[arg-type]
        request = Mailbox.request(tx, request.request_id)  # type: ignore[assignment]
        # A reply never moves the continuation axis (REPLY_ARRIVED is the identity): a stopped or
        # receive-only request stays so, and its answer is only stored.
        if weakest(scope.state, request.continuation) is not ContinuationState.ACTIVE:
            return None
        pending = Mailbox.pending_continuation_for(tx, request.source_session_id, scope.scope_id)
        if pending is not None and len(Mailbox.carried(tx, pending.delivery_id)) < self.limits.merge_max:
            Mailbox.attach(tx, pending.delivery_id, message.message_id)  # merged: one continuation run
            return pending.delivery_id
        if scope.continuation_count >= self.limits.continuations_max:
            # Keep the message, stop waking the source; the user decides.
            self._move_scope(tx, scope, ContinuationEvent.LIMIT_REACHED, "continuation_limit")
            return None
        delivery_id = _new_id("cd")
        Mailbox.insert_delivery(tx, delivery_id, request.source_session_id, Direction.CONTINUATION, None, scope.scope_id)
        Mailbox.attach(tx, delivery_id, message.message_id)
        Mailbox.update_scope(tx, scope, continuation_count=scope.continuation_count + 1)
        return delivery_id

    def _route_to_target(self, tx: Transaction, request: Request, message: Message) -> str:
        pending = Mailbox.pending_work_for(tx, request.request_id)
        if pending is not None:
            Mailbox.attach(tx, pending.delivery_id, message.message_id)
            return pending.delivery_id
        refusal = policy.queue_full(
            Mailbox.count_pending_work(tx, request.target_session_id), self.limits, request.target_session_id
        )
        if refusal:
            raise _tool_error(refusal)
        delivery_id = _new_id("cd")
        Mailbox.insert_delivery(
            tx, delivery_id, request.target_session_id, Direction.WORK, request.request_id, request.scope_id
        )
        Mailbox.attach(tx, delivery_id, message.message_id)
        return delivery_id

    # the inbox claim --------------------------------------------------------------------------
    def _decide(self, tx: Transaction, facts: Facts, delivery: Delivery) -> ClaimDecision:
        """Re-check a queued delivery right before it is handed out or started (target, scope, rights)."""
        if delivery.direction is Direction.WORK:
            request = Mailbox.request(tx, delivery.request_id)  # type: ignore[arg-type]
            assert request is not None
            target = facts.session(request.target_session_id)
            source = facts.session(request.source_session_id)
            cross_ok = target is None or source is None or facts.cross_project_ok(source.project_id, target.project_id)
            return policy.decide_work_claim(
                request_state=request.state,
                target_alive=target is not None,
                source_alive=source is not None,
                cross_project_ok=cross_ok,
            )
        scope = self._current_scope(tx, facts, Mailbox.scope(tx, delivery.scope_id))  # type: ignore[arg-type]
        permissions = {}
        for message in Mailbox.carried(tx, delivery.delivery_id):
            request = Mailbox.request(tx, message.request_id)
            assert request is not None
            permissions[message.message_id] = request.continuation
        return policy.decide_continuation_claim(
            scope_state=scope.state,
            source_alive=facts.session(delivery.session_id) is not None,
            permissions=permissions,
        )

    def _apply_refusal(self, tx: Transaction, delivery: Delivery, decision: ClaimDecision) -> None:
        if decision.claim:
            if decision.drop:  # received only: stored and listed, never delivered
                Mailbox.withdraw(tx, decision.drop, "not_active")
            return
        self._cancel_delivery(tx, delivery, decision.reason or "cancelled")
        if decision.request_event is not None and delivery.request_id is not None:
            request = Mailbox.request(tx, delivery.request_id)
            assert request is not None
            self._move_request(tx, request, decision.request_event, decision.reason)

    def _expire_claims(self, tx: Transaction, facts: Facts, deliveries: list[Delivery], now: datetime) -> list[str]:
        orphans = []
        for delivery in deliveries:
            if delivery.state in (DeliveryState.CLAIMED, DeliveryState.STARTING) and delivery.claim_expires_at:
                if datetime.fromisoformat(delivery.claim_expires_at) <= now:
                    # An expired claim does not prove that nothing ran: review, never replay.
                    orphan = self._mark_uncertain(tx, facts, delivery, "claim_expired")
                    if orphan:
                        orphans.append(orphan)
        return orphans

    def claim_next(self, session_id: str) -> InboxItem | None:
        """Hand out the session's next delivery if nothing owns the session (per
        receiving session FIFO, one owner at a time; a session busy with its own run waits)."""
        now = self._clock()
        facts = self._facts()
        item = None
        with self._mailbox.write() as tx:
            in_flight = Mailbox.in_flight(tx, session_id)
            orphans = self._expire_claims(tx, facts, in_flight, now)
            for delivery in in_flight:
                if delivery.state is DeliveryState.LINKED:
                    run = facts.run(delivery.run_id) if delivery.run_id else None
                    if run is not None and run.status is not RunStatus.RUNNING:
                        self._settle(tx, delivery, run.status)  # its end was missed: settle now
            busy = Mailbox.in_flight(tx, session_id)
            if not busy and not facts.session_busy(session_id):
                for delivery in Mailbox.pending(tx, session_id, self.limits.queue_max + 1):
                    decision = self._decide(tx, facts, delivery)
                    self._apply_refusal(tx, delivery, decision)
                    if not decision.claim:
                        continue
                    expires = now + timedelta(seconds=self.limits.claim_timeout_s)
                    claimed = self._move_delivery(
                        tx, delivery, DeliveryEvent.CLAIM,
                        claimed_at=now.isoformat(timespec="microseconds"),
                        claim_expires_at=expires.isoformat(timespec="microseconds"),
                        reason=None,
                    )
                    item = self._inbox_item(tx, claimed)
                    break
        self._cancel_runs(orphans)
        if item is not None:
            crash_point("collab.claim.after_commit")
            log.info(
                "delivery claimed %s",
                kv(delivery=item.delivery.delivery_id, session=session_id, direction=item.delivery.direction.value),
            )
        return item

    @staticmethod
    def _inbox_item(tx: Transaction, delivery: Delivery) -> InboxItem:
        messages = Mailbox.carried(tx, delivery.delivery_id)
        requests = {m.request_id: Mailbox.request(tx, m.request_id) for m in messages}
        return InboxItem(delivery=delivery, messages=messages, requests=requests)  # type: ignore[arg-type]

    # the delivery ↔ run link ----------------------------------------------------------------
    def run_starting(self, tx: Transaction, run: RunRecord) -> None:
        """Start guard, inside the transaction that inserts the run (the linearization point of a
        start). Moves the claimed delivery to `starting` with the run id (the persisted intent),
        or refuses the start."""
        if run.delivery_id is None:
            return
        if not DELIVERY_ID.fullmatch(run.delivery_id):
            raise InvalidInput("delivery_id is not a delivery id (cd-…) from the inbox", field="delivery_id")
        if run.runtime_user_id != run.owner_user_id:
            raise InvalidInput(
                "a collaboration delivery runs as the session owner: start it with a trigger that acts as "
                "the owner (for example side_task)",
                field="trigger",
            )
        facts = Facts.within(tx)  # we are inside the run-insert transaction
        busy = facts.session_busy(run.session_id)
        refusal: Exception | None = None
        with self._mailbox.write() as mtx:
            delivery = Mailbox.delivery(mtx, run.delivery_id)
            if delivery is None or delivery.session_id != run.session_id:
                refusal = NotFound(f"delivery {run.delivery_id} not found for this session", field="delivery_id")
            elif delivery.state is DeliveryState.CLAIMED:
                # A claimed delivery has no run yet, so expiring it leaves no run to cancel (which
                # could not be done here anyway: we are inside the run-insert transaction).
                orphans = self._expire_claims(mtx, facts, [delivery], self._clock())
                assert not orphans
                current = Mailbox.delivery(mtx, delivery.delivery_id)
                assert current is not None
                if current.state is DeliveryState.REVIEW:
                    refusal = Conflict(
                        f"delivery {delivery.delivery_id} was claimed too long ago; its start is uncertain and it "
                        "is marked for review, never replayed",
                        field="delivery_id", reason="review",
                    )
                elif busy:
                    self._move_delivery(mtx, current, DeliveryEvent.RELEASE, claimed_at=None, claim_expires_at=None)
                    refusal = Conflict(
                        f"session {run.session_id} is busy with another run; the delivery waits in the "
                        "inbox and is handed out again when the session is free",
                        field="delivery_id", reason="session_busy",
                    )
                else:
                    decision = self._decide(mtx, facts, current)
                    self._apply_refusal(mtx, current, decision)
                    if not decision.claim:
                        refusal = Conflict(
                            f"delivery {delivery.delivery_id} was cancelled ({decision.reason})",
                            field="delivery_id", reason=decision.reason,
                        )
                    else:
                        self._move_delivery(mtx, current, DeliveryEvent.BEGIN_START, run_id=run.run_id)
            else:
                refusal = self._not_startable(delivery)
        if refusal is not None:
            raise refusal
        crash_point("collab.start.before_run_commit")

    @staticmethod
    def _not_startable(delivery: Delivery) -> Conflict:
        if delivery.state is DeliveryState.PENDING:
            return Conflict(
                f"delivery {delivery.delivery_id} was not handed out yet: take it from the inbox first",
                field="delivery_id", reason="not_claimed",
            )
        if delivery.state is DeliveryState.REVIEW:
            return Conflict(
                f"delivery {delivery.delivery_id} is marked for review (its start was uncertain); "
                "it is never replayed", field="delivery_id", reason="review",
            )
        if delivery.state is DeliveryState.CANCELLED:
            return Conflict(
                f"delivery {delivery.delivery_id} was cancelled ({delivery.reason})",
                field="delivery_id", reason=delivery.reason or "cancelled",
            )
        return Conflict(
            f"delivery {delivery.delivery_id} was already started by run {delivery.run_id}",
            field="delivery_id", reason="already_started", run_id=delivery.run_id,
        )

    def run_started(self, run: RunRecord) -> None:
        """After the run committed: link it to its delivery, or, for new user work, make older
        work generations of the session receive-only."""
        if run.delivery_id is None:
            if run.trigger in policy.NEW_WORK_TRIGGERS:
                self._supersede_older(run.session_id, run.run_id)
            return
        crash_point("collab.start.after_run_commit")
        stale = False
        with self._mailbox.write() as tx:
            delivery = Mailbox.delivery(tx, run.delivery_id)
            if delivery is not None and delivery.state is DeliveryState.STARTING and delivery.run_id == run.run_id:
                self._move_delivery(tx, delivery, DeliveryEvent.LINK)
                if delivery.direction is Direction.WORK and delivery.request_id is not None:
                    request = Mailbox.request(tx, delivery.request_id)
                    assert request is not None
                    if request.state in (RequestState.PENDING, RequestState.AWAITING_INPUT):
                        self._move_request(tx, request, RequestEvent.WORK_STARTED)
            else:
                stale = True  # stopped (or expired) between the guard and the commit
        if stale:
            # The stop came after the start won; cancel the run instead of ignoring it.
            self._cancel_runs([run.run_id])
            run_logger(log, session=run.session_id, owner=run.owner_user_id, runtime_user=run.runtime_user_id).info(
                "delivery run cancelled: the delivery was stopped while it started %s",
                kv(run=run.run_id, delivery=run.delivery_id),
            )

    def _supersede_older(self, session_id: str, generation: str) -> None:
        with self._mailbox.read() as tx:
            older = [s for s in Mailbox.active_scopes(tx, session_id) if s.generation != generation]
        if not older:
            return  # the common case: no write at all
        with self._mailbox.write() as tx:
            for scope in Mailbox.active_scopes(tx, session_id):
                if scope.generation != generation:
                    self._move_scope(tx, scope, ContinuationEvent.SUPERSEDED, "superseded")

    def run_ended(self, run: RunRecord) -> None:
        """Settle the run's delivery; wake the session's inbox (it may be free now)."""
        if run.delivery_id is not None:
            with self._mailbox.write() as tx:
                delivery = Mailbox.delivery(tx, run.delivery_id)
                if delivery is not None and delivery.state is DeliveryState.LINKED and delivery.run_id == run.run_id:
                    self._settle(tx, delivery, run.status)
        self.signals.notify(run.session_id)

    # stop ---------------------------------------------------------------------------------------
    def stop(self, session_id: str, request_id: str, *, actor: str = "collaboration") -> StopResult:
        """Revoke one request's continuation and cancel what has not started. A target
        run already under way may still reply; that reply is stored and starts nothing."""
        to_cancel: list[str] = []
        with self._mailbox.write() as tx:
            request = Mailbox.request(tx, request_id)
            if request is None or request.source_session_id != session_id:
                raise NotFound(f"collaboration request {request_id} not found")
            self._move_request_continuation(tx, request, ContinuationEvent.STOPPED, "stopped")
            request = Mailbox.request(tx, request_id)  # type: ignore[assignment]
            request = self._move_request(tx, request, RequestEvent.STOPPED, "stopped")
            for queued in Mailbox.unstarted_work_for(tx, request_id):
                self._cancel_delivery(tx, queued, "stopped")
            for delivery in Mailbox.continuations_carrying(tx, request_id):
                if delivery.state in (DeliveryState.PENDING, DeliveryState.CLAIMED, DeliveryState.STARTING):
                    self._withdraw(tx, delivery, request_id)
                elif delivery.state is DeliveryState.LINKED and delivery.run_id:
                    to_cancel.append(delivery.run_id)  # the continuation won the race: cancel it
            view = self._view(tx, request)
        cancelled = self._cancel_runs(to_cancel)
        with self._state.write() as tx:  # after the mailbox transaction: lock order
            audit.record(
                tx, actor=actor, action="collaboration.stop", session_id=session_id, request_id=request_id,
                target_session_id=view.request.target_session_id, cancelled_run_ids=cancelled,
            )
        log.info("collaboration stopped %s", kv(request=request_id, session=session_id, cancelled_runs=",".join(cancelled)))
        return StopResult(view=view, cancelled_run_ids=cancelled)

    def _withdraw(self, tx: Transaction, delivery: Delivery, request_id: str) -> None:
        """Take one request's messages out of a not-yet-started continuation, leaving the other
        requests merged into it untouched."""
        carried = Mailbox.carried(tx, delivery.delivery_id)
        mine = [m.message_id for m in carried if m.request_id == request_id]
        others = [m.message_id for m in carried if m.request_id != request_id]
        if delivery.state is DeliveryState.PENDING:
            Mailbox.withdraw(tx, mine, "stopped")
            if not others:
                self._cancel_delivery(tx, delivery, "stopped")
            return
        # Claimed or starting: the bot holds its text, so the whole delivery is cancelled (its start
        # is refused) and the other requests' messages go back in the queue as a new delivery.
        self._cancel_delivery(tx, delivery, "stopped")
        if others:
            replacement = _new_id("cd")
            Mailbox.insert_delivery(tx, replacement, delivery.session_id, Direction.CONTINUATION, None, delivery.scope_id)
            Mailbox.move(tx, others, replacement)

    # reading ------------------------------------------------------------------------------------
    def _view(self, tx: Transaction, request: Request) -> RequestView:
        return RequestView(
            request=request,
            messages=Mailbox.messages_of(tx, request.request_id),
            deliveries=Mailbox.deliveries_of_request(tx, request.request_id),
        )

    def list(self, session_id: str, *, before: int | None, limit: int) -> list[RequestView]:
        with self._mailbox.read() as tx:
            return [self._view(tx, r) for r in Mailbox.requests_of_session(tx, session_id, before=before, limit=limit)]

    def get(self, session_id: str, request_id: str) -> RequestView:
        with self._mailbox.read() as tx:
            request = Mailbox.request(tx, request_id)
            if request is None or policy.side_of(session_id, request) is None:
                raise NotFound(f"collaboration request {request_id} not found")
            return self._view(tx, request)

    # restart and deletion ----------------------------------------------------------------------
    def recover(self) -> RecoveryReport:
        """After a restart: whatever was claimed or starting has an uncertain start and is marked
        for review, never replayed; linked deliveries whose run ended are settled."""
        review, settled, orphans = [], [], []
        facts = self._facts()
        with self._mailbox.write() as tx:
            for delivery in Mailbox.in_flight(tx):
                if delivery.state is DeliveryState.LINKED:
                    run = facts.run(delivery.run_id) if delivery.run_id else None
                    if run is not None and run.status is not RunStatus.RUNNING:
                        self._settle(tx, delivery, run.status)
                        settled.append(delivery.delivery_id)
                    continue
                run = facts.run(delivery.run_id) if delivery.run_id else None
                if delivery.state is DeliveryState.CLAIMED:
                    reason = "claim_unconfirmed"
                else:
                    # A run row is proof of a start, but its id never reached the bot.
                    reason = "start_unconfirmed" if run is not None else "start_uncertain"
                orphan = self._mark_uncertain(tx, facts, delivery, reason)
                if orphan:
                    orphans.append(orphan)
                review.append(delivery.delivery_id)
        cancelled = self._cancel_runs(orphans)
        if review or settled:
            log.warning("collaboration recovery %s", kv(review=len(review), settled=len(settled), cancelled_runs=len(cancelled)))
        return RecoveryReport(review=review, settled=settled, cancelled_runs=cancelled)

    def forget_session(self, session_id: str) -> None:
        """A deleted session: cancel what has not started for or about it, fail its open requests
        and revoke its continuations. Its messages stay as history."""
        with self._mailbox.write() as tx:
            for delivery in Mailbox.pending_touching(tx, session_id):
                self._cancel_delivery(tx, delivery, "session_deleted")
            for request in Mailbox.open_requests_touching(tx, session_id):
                reason = "target_deleted" if request.target_session_id == session_id else "source_deleted"
                self._move_request(tx, request, RequestEvent.PARTY_UNAVAILABLE, reason)
            for scope in Mailbox.active_scopes(tx, session_id):
                self._move_scope(tx, scope, ContinuationEvent.STOPPED, "source_deleted")
            for request in Mailbox.requests_of_session(tx, session_id, before=None, limit=10_000):
                if request.source_session_id == session_id:
                    self._move_request_continuation(tx, request, ContinuationEvent.STOPPED, "source_deleted")

