"""The three state axes, table-driven: every allowed move, and everything else refused."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.collaboration.states import (
    CONTINUATION_TRANSITIONS,
    DELIVERY_TRANSITIONS,
    REQUEST_TRANSITIONS,
    ContinuationEvent as CE,
    ContinuationState as C,
    DeliveryEvent as DE,
    DeliveryState as D,
    IllegalTransition,
    RequestEvent as RE,
    RequestState as R,
    next_continuation_state,
    next_delivery_state,
    next_request_state,
    weakest,
)

REQUEST_CASES = [
    # (state, event, expected)
    (R.PENDING, RE.WORK_STARTED, R.PROCESSING),
    (R.AWAITING_INPUT, RE.WORK_STARTED, R.PROCESSING),
    (R.PENDING, RE.PROGRESS, R.PENDING),
    (R.PROCESSING, RE.PROGRESS, R.PROCESSING),
    (R.AWAITING_INPUT, RE.PROGRESS, R.AWAITING_INPUT),
    (R.PROCESSING, RE.CLARIFIED, R.AWAITING_INPUT),
    (R.PENDING, RE.CLARIFIED, R.AWAITING_INPUT),  # the target's user took over before the bot started
    (R.AWAITING_INPUT, RE.SUPPLEMENTED, R.PENDING),
    (R.PROCESSING, RE.SUPPLEMENTED, R.PROCESSING),
    (R.PENDING, RE.SUPPLEMENTED, R.PENDING),
    (R.PROCESSING, RE.REPLIED, R.REPLIED),
    (R.PENDING, RE.REPLIED, R.REPLIED),
    (R.AWAITING_INPUT, RE.REPLIED, R.REPLIED),
    (R.PROCESSING, RE.RUN_ENDED_NO_RESULT, R.FAILED),
    (R.PROCESSING, RE.RUN_ENDED_MORE_QUEUED, R.PENDING),
    (R.AWAITING_INPUT, RE.RUN_ENDED_NO_RESULT, R.AWAITING_INPUT),  # it asked: not a failure
    (R.PENDING, RE.RUN_ENDED_MORE_QUEUED, R.PENDING),  # ... and the source answered before the run ended
    (R.REPLIED, RE.RUN_ENDED_NO_RESULT, R.REPLIED),
    (R.PENDING, RE.STOPPED, R.REVOKED),
    (R.AWAITING_INPUT, RE.STOPPED, R.REVOKED),
    (R.PROCESSING, RE.STOPPED, R.PROCESSING),  # a started target may still reply
    (R.REPLIED, RE.STOPPED, R.REPLIED),
    (R.PENDING, RE.START_UNCERTAIN, R.REVIEW),
    (R.PROCESSING, RE.START_UNCERTAIN, R.REVIEW),
    (R.REPLIED, RE.START_UNCERTAIN, R.REPLIED),
    (R.PENDING, RE.PARTY_UNAVAILABLE, R.FAILED),
    (R.REVOKED, RE.PARTY_UNAVAILABLE, R.REVOKED),
]


@pytest.mark.parametrize(("state", "event", "expected"), REQUEST_CASES)
def test_request_transitions(state: R, event: RE, expected: R) -> None:
    assert next_request_state(state, event) is expected


@pytest.mark.parametrize("closed", [R.REPLIED, R.FAILED, R.REVOKED, R.REVIEW])
@pytest.mark.parametrize("event", [RE.WORK_STARTED, RE.PROGRESS, RE.CLARIFIED, RE.SUPPLEMENTED, RE.REPLIED])
def test_a_closed_request_takes_no_more_work_or_messages(closed: R, event: RE) -> None:
    with pytest.raises(IllegalTransition) as info:
        next_request_state(closed, event)
    assert info.value.axis == "request" and closed.value in str(info.value)


def test_nothing_leaves_a_closed_request_state() -> None:
    closed = {R.REPLIED, R.FAILED, R.REVOKED, R.REVIEW}
    for (state, _event), new in REQUEST_TRANSITIONS.items():
        if state in closed:
            assert new is state


def test_review_is_only_reached_from_an_uncertain_start() -> None:
    for (state, event), new in REQUEST_TRANSITIONS.items():
        if new is R.REVIEW and state is not R.REVIEW:
            assert event is RE.START_UNCERTAIN


DELIVERY_CASES = [
    (D.PENDING, DE.CLAIM, D.CLAIMED),
    (D.CLAIMED, DE.RELEASE, D.PENDING),
    (D.CLAIMED, DE.BEGIN_START, D.STARTING),
    (D.STARTING, DE.LINK, D.LINKED),
    (D.LINKED, DE.SETTLE, D.SETTLED),
    (D.PENDING, DE.CANCEL, D.CANCELLED),
    (D.CLAIMED, DE.CANCEL, D.CANCELLED),
    (D.STARTING, DE.CANCEL, D.CANCELLED),
    (D.CLAIMED, DE.UNCERTAIN, D.REVIEW),
    (D.STARTING, DE.UNCERTAIN, D.REVIEW),
]


@pytest.mark.parametrize(("state", "event", "expected"), DELIVERY_CASES)
def test_delivery_transitions(state: D, event: DE, expected: D) -> None:
    assert next_delivery_state(state, event) is expected


def test_the_delivery_table_is_exactly_the_listed_moves() -> None:
    assert DELIVERY_TRANSITIONS == {(s, e): n for s, e, n in DELIVERY_CASES}


@pytest.mark.parametrize(("state", "event"), [
    (s, e) for s, e in itertools.product(D, DE) if (s, e) not in DELIVERY_TRANSITIONS
])
def test_every_other_delivery_move_is_refused(state: D, event: DE) -> None:
    with pytest.raises(IllegalTransition):
        next_delivery_state(state, event)


def test_review_and_cancelled_deliveries_are_never_claimed_again() -> None:
    # "never replayed": no way back from review, cancelled or settled
    for final in (D.REVIEW, D.CANCELLED, D.SETTLED):
        assert not [e for (s, e) in DELIVERY_TRANSITIONS if s is final]
    # a release back to the queue only from a claim that was refused before anything ran
    assert [(s, e) for (s, e), n in DELIVERY_TRANSITIONS.items() if n is D.PENDING] == [(D.CLAIMED, DE.RELEASE)]


CONTINUATION_CASES = [
    (C.ACTIVE, CE.SUPERSEDED, C.RECEIVE_ONLY),
    (C.ACTIVE, CE.LIMIT_REACHED, C.RECEIVE_ONLY),
    (C.ACTIVE, CE.STOPPED, C.REVOKED),
    (C.RECEIVE_ONLY, CE.STOPPED, C.REVOKED),
    (C.REVOKED, CE.STOPPED, C.REVOKED),
    (C.RECEIVE_ONLY, CE.SUPERSEDED, C.RECEIVE_ONLY),
    (C.REVOKED, CE.SUPERSEDED, C.REVOKED),
    (C.ACTIVE, CE.REPLY_ARRIVED, C.ACTIVE),
    (C.RECEIVE_ONLY, CE.REPLY_ARRIVED, C.RECEIVE_ONLY),
    (C.REVOKED, CE.REPLY_ARRIVED, C.REVOKED),
]


@pytest.mark.parametrize(("state", "event", "expected"), CONTINUATION_CASES)
def test_continuation_transitions(state: C, event: CE, expected: C) -> None:
    assert next_continuation_state(state, event) is expected


def test_receive_only_and_revoked_can_never_be_revived() -> None:
    for (state, _event), new in CONTINUATION_TRANSITIONS.items():
        if state is not C.ACTIVE:
            assert new is not C.ACTIVE
    assert set(CONTINUATION_TRANSITIONS) == set(itertools.product(C, CE))  # total: no gap to fall through


def test_weakest_permission_wins() -> None:
    assert weakest(C.ACTIVE, C.ACTIVE) is C.ACTIVE
    assert weakest(C.ACTIVE, C.RECEIVE_ONLY) is C.RECEIVE_ONLY
    assert weakest(C.RECEIVE_ONLY, C.REVOKED, C.ACTIVE) is C.REVOKED
