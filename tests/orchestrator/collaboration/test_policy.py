"""The collaboration rules as pure decisions."""

from __future__ import annotations

import pytest

from orchestrator.collaboration import policy
from orchestrator.collaboration.policy import CollaborationLimits, SessionFacts
from orchestrator.collaboration.records import MessageKind, Request, Side
from orchestrator.collaboration.states import ContinuationState as C, RequestEvent, RequestState as R
from orchestrator.identity import Trigger

SOURCE = SessionFacts("A", 7, "p1")
LIMITS = CollaborationLimits(clarifications_max=2, progress_max=3, message_max_chars=10, queue_max=2)


def contact(**overrides):
    values = dict(
        source=SOURCE, runtime_user_id=7, handling_inbound_request=False, target_id="B",
        target=SessionFacts("B", 7, "p1"), cross_project_ok=True,
    )
    values.update(overrides)
    return policy.check_contact(**values)


def test_contact_allowed_between_sessions_of_one_owner() -> None:
    assert contact() is None


@pytest.mark.parametrize(
    ("overrides", "code", "says"),
    [
        ({"runtime_user_id": 67}, "forbidden", "another member"),
        ({"handling_inbound_request": True}, "forbidden", "cannot be forwarded"),
        ({"target_id": "A", "target": SOURCE}, "invalid_arguments", "itself"),
        ({"target": None}, "not_found", "no session B"),
        ({"target": SessionFacts("B", 8, "p1")}, "not_found", "no session B"),  # another owner looks absent
        ({"target": SessionFacts("B", 7, "p2"), "cross_project_ok": False}, "forbidden", "another project"),
    ],
)
def test_contact_refusals(overrides: dict, code: str, says: str) -> None:
    refusal = contact(**overrides)
    assert refusal is not None and refusal.code == code and says in refusal.message


def test_cross_project_refusal_names_no_project() -> None:
    refusal = contact(target=SessionFacts("B", 7, "secret-project"), cross_project_ok=False)
    assert refusal is not None
    assert "secret-project" not in refusal.message and "p1" not in refusal.message


def test_an_absent_target_is_not_found_even_when_cross_project_is_off() -> None:
    # the caller learns nothing about projects of sessions it cannot reach
    refusal = contact(target=None, cross_project_ok=False)
    assert refusal is not None and refusal.code == "not_found"


@pytest.mark.parametrize(
    ("source", "target", "source_allows", "target_allows", "expected"),
    [
        ("p1", "p1", False, False, True),
        (None, None, False, False, True),
        ("p1", "p2", True, True, True),
        ("p1", "p2", False, True, False),
        ("p1", "p2", True, False, False),
        (None, "p2", True, True, True),
    ],
)
def test_cross_project_switch(source, target, source_allows, target_allows, expected) -> None:
    assert policy.cross_project_allowed(source, target, source_allows, target_allows) is expected


def request(state: R = R.PROCESSING, continuation: C = C.ACTIVE, clarifications: int = 0, progress: int = 0) -> Request:
    return Request(
        seq=1, request_id="cr-0", scope_id="cs-0", source_session_id="A", source_run_id="r-a", generation="r-a",
        target_session_id="B", state=state, reason=None, continuation=continuation, continuation_reason=None,
        clarification_count=clarifications, progress_count=progress, op_key="k", body_hash="h", version=1,
        created_at="", updated_at="",
    )


def check_reply(side: Side, kind: MessageKind, req: Request | None = None, runtime: int = 7):
    return policy.check_reply(
        side=side, kind=kind, request=req or request(), runtime_user_id=runtime, owner_user_id=7, limits=LIMITS
    )


def test_sides_of_a_request() -> None:
    assert policy.side_of("B", request()) is Side.TARGET
    assert policy.side_of("A", request()) is Side.SOURCE
    assert policy.side_of("C", request()) is None


@pytest.mark.parametrize(
    ("side", "kind", "allowed"),
    [
        (Side.TARGET, MessageKind.PROGRESS, True),
        (Side.TARGET, MessageKind.CLARIFICATION, True),
        (Side.TARGET, MessageKind.REPLY, True),
        (Side.TARGET, MessageKind.SUPPLEMENT, False),
        (Side.SOURCE, MessageKind.SUPPLEMENT, True),
        (Side.SOURCE, MessageKind.REPLY, False),
        (Side.SOURCE, MessageKind.CLARIFICATION, False),
        (Side.SOURCE, MessageKind.PROGRESS, False),
    ],
)
def test_who_may_send_which_kind(side: Side, kind: MessageKind, allowed: bool) -> None:
    refusal = check_reply(side, kind)
    assert (refusal is None) is allowed
    if not allowed:
        assert refusal.code == "forbidden" and refusal.details["field"] == "kind"


def test_reply_refusals() -> None:
    assert check_reply(Side.TARGET, MessageKind.REPLY, runtime=67).code == "forbidden"
    closed = check_reply(Side.TARGET, MessageKind.REPLY, request(R.REPLIED))
    assert closed.code == "request_closed" and "replied" in closed.message
    assert check_reply(Side.SOURCE, MessageKind.SUPPLEMENT, request(continuation=C.REVOKED)).code == "request_closed"
    # receive-only still takes a supplement: the source's user chose to send it
    assert check_reply(Side.SOURCE, MessageKind.SUPPLEMENT, request(continuation=C.RECEIVE_ONLY)) is None
    assert check_reply(Side.TARGET, MessageKind.CLARIFICATION, request(clarifications=2)).code == "limit_reached"
    assert check_reply(Side.TARGET, MessageKind.CLARIFICATION, request(clarifications=1)) is None
    assert check_reply(Side.TARGET, MessageKind.PROGRESS, request(progress=3)).code == "limit_reached"


def test_limits_on_size_and_queue() -> None:
    assert policy.too_large("x" * 10, LIMITS) is None
    assert policy.too_large("x" * 11, LIMITS).code == "too_large"
    assert policy.queue_full(1, LIMITS, "B") is None
    refusal = policy.queue_full(2, LIMITS, "B")
    assert refusal.code == "queue_full" and refusal.details["limit"] == 2


def test_operation_keys_bind_run_and_tool_call() -> None:
    digest = policy.body_hash({"target": "B", "message": "hi"})
    assert digest == policy.body_hash({"message": "hi", "target": "B"})  # canonical
    assert policy.op_key("contact_session", "r-1", "call-1", digest) == "contact_session:r-1:call:call-1"
    assert policy.op_key("contact_session", "r-1", "call-1", digest) != policy.op_key(
        "contact_session", "r-2", "call-1", digest
    )
    # without a tool_call_id, the body is the key within the run
    assert policy.op_key("contact_session", "r-1", None, digest).endswith(digest)
    assert policy.same_operation(digest, digest, "request", "cr-1") is None
    conflict = policy.same_operation(digest, "other", "request", "cr-1")
    assert conflict.code == "conflict" and conflict.details == {"existing_id": "cr-1"}


@pytest.mark.parametrize(
    ("trigger", "delivery_generation", "latest", "expected"),
    [
        (Trigger.WEB, None, "r-old", "r-me"),  # a user run begins new work
        (Trigger.GROUP_MESSAGE, None, None, "r-me"),
        (Trigger.SIDE_TASK, "r-origin", "r-old", "r-origin"),  # a continuation inherits its scope
        (Trigger.RETRY, None, "r-old", "r-old"),  # a retry continues the latest user work
        (Trigger.RETRY, None, None, "r-me"),
        (Trigger.SCHEDULED, None, "r-old", "r-me"),  # other work of its own
    ],
)
def test_work_generation(trigger, delivery_generation, latest, expected) -> None:
    assert policy.generation_for(
        trigger=trigger, run_id="r-me", delivery_generation=delivery_generation, latest_work_run_id=latest
    ) == expected


def test_new_work_triggers_do_not_include_continuing_or_system_runs() -> None:
    assert Trigger.WEB in policy.NEW_WORK_TRIGGERS
    assert not {Trigger.RETRY, Trigger.CRASH_RECOVERY, Trigger.SCHEDULED, Trigger.SIDE_TASK} & policy.NEW_WORK_TRIGGERS


@pytest.mark.parametrize(
    ("state", "target", "source", "cross", "claim", "reason", "event"),
    [
        (R.PENDING, True, True, True, True, None, None),
        (R.AWAITING_INPUT, True, True, True, True, None, None),  # a supplement queued earlier
        (R.REVOKED, True, True, True, False, "request_revoked", None),
        (R.REPLIED, True, True, True, False, "request_replied", None),
        (R.PENDING, False, True, True, False, "target_unavailable", RequestEvent.PARTY_UNAVAILABLE),
        (R.PENDING, True, False, True, False, "source_unavailable", RequestEvent.PARTY_UNAVAILABLE),
        (R.PENDING, True, True, False, False, "cross_project_disabled", RequestEvent.PARTY_UNAVAILABLE),
    ],
)
def test_work_claim_rechecks(state, target, source, cross, claim, reason, event) -> None:
    decision = policy.decide_work_claim(request_state=state, target_alive=target, source_alive=source, cross_project_ok=cross)
    assert (decision.claim, decision.reason, decision.request_event) == (claim, reason, event)


def test_continuation_claim_keeps_only_active_answers() -> None:
    decision = policy.decide_continuation_claim(
        scope_state=C.ACTIVE, source_alive=True, permissions={"m1": C.ACTIVE, "m2": C.REVOKED, "m3": C.RECEIVE_ONLY}
    )
    assert decision.claim and decision.keep == ("m1",) and set(decision.drop) == {"m2", "m3"}


@pytest.mark.parametrize(
    ("scope", "permissions", "reason"),
    [
        (C.RECEIVE_ONLY, {"m1": C.ACTIVE}, "receive_only"),
        (C.ACTIVE, {"m1": C.REVOKED}, "revoked"),
        (C.ACTIVE, {"m1": C.RECEIVE_ONLY, "m2": C.REVOKED}, "revoked"),
        (C.ACTIVE, {}, "empty"),
    ],
)
def test_continuation_claim_cancels_when_nothing_may_start(scope, permissions, reason) -> None:
    decision = policy.decide_continuation_claim(scope_state=scope, source_alive=True, permissions=permissions)
    assert not decision.claim and decision.reason == reason and set(decision.drop) == set(permissions)


def test_continuation_to_a_deleted_source_is_cancelled() -> None:
    decision = policy.decide_continuation_claim(scope_state=C.ACTIVE, source_alive=False, permissions={"m1": C.ACTIVE})
    assert not decision.claim and decision.reason == "source_unavailable"
