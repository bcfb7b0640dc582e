"""The three state axes of a collaboration and their transition tables.

Pure: every allowed move is a row of a table; anything else is an `IllegalTransition`.
The axes never mix: a request's state says what the target did with it, a delivery's state
says how far one hand-over to a chat bot got, the continuation says whether a reply may
start work on the source. Receiving a reply never moves the continuation axis back.
"""

from __future__ import annotations

from enum import Enum


class RequestState(str, Enum):
    PENDING = "pending"  # queued for the target
    PROCESSING = "processing"  # a target run linked to it is under way
    AWAITING_INPUT = "awaiting_input"  # the target asked a clarification; waiting for a supplement
    REPLIED = "replied"  # the target gave its final reply (not: the source used it)
    FAILED = "failed"  # with a reason: no_result, target_unavailable, ...
    REVOKED = "revoked"  # stopped by the source before the target started
    REVIEW = "review"  # the target's start is uncertain after a crash: shown, never replayed


class RequestEvent(str, Enum):
    WORK_STARTED = "work_started"
    PROGRESS = "progress"
    CLARIFIED = "clarified"
    SUPPLEMENTED = "supplemented"
    REPLIED = "replied"
    RUN_ENDED_NO_RESULT = "run_ended_no_result"
    RUN_ENDED_MORE_QUEUED = "run_ended_more_queued"  # a supplement is already queued for the target
    STOPPED = "stopped"
    START_UNCERTAIN = "start_uncertain"
    PARTY_UNAVAILABLE = "party_unavailable"  # a session was deleted, or the project switch turned off


class DeliveryState(str, Enum):
    PENDING = "pending"  # waiting in the receiving session's FIFO
    CLAIMED = "claimed"  # handed to a chat bot by the inbox; not started
    STARTING = "starting"  # a run with this delivery id is being created (intent persisted)
    LINKED = "linked"  # the run exists and is linked
    SETTLED = "settled"  # the linked run ended
    REVIEW = "review"  # start uncertain (restart or expired claim): never handed out again
    CANCELLED = "cancelled"  # will never start (stop, receive-only, target gone, superseded)


class DeliveryEvent(str, Enum):
    CLAIM = "claim"
    RELEASE = "release"  # the start was refused before anything ran (session busy)
    BEGIN_START = "begin_start"
    LINK = "link"
    SETTLE = "settle"
    CANCEL = "cancel"
    UNCERTAIN = "uncertain"


class ContinuationState(str, Enum):
    ACTIVE = "active"  # a reply may start a continuation run on the source
    RECEIVE_ONLY = "receive_only"  # replies are stored and shown, nothing starts
    REVOKED = "revoked"  # stopped: replies are stored, nothing starts, and not-yet-started work is cancelled


class ContinuationEvent(str, Enum):
    SUPERSEDED = "superseded"  # a new user run on the source began a newer work generation
    LIMIT_REACHED = "limit_reached"  # the bounded number of automatic continuations is used up
    STOPPED = "stopped"
    REPLY_ARRIVED = "reply_arrived"  # never changes the axis: a late reply cannot revive anything


class IllegalTransition(ValueError):
    def __init__(self, axis: str, state: Enum, event: Enum) -> None:
        super().__init__(f"{axis}: {event.value} is not allowed in state {state.value}")
        self.axis = axis
        self.state = state
        self.event = event


_R, _RE = RequestState, RequestEvent
_OPEN = (_R.PENDING, _R.PROCESSING, _R.AWAITING_INPUT)
_REQUEST_CLOSED = (_R.REPLIED, _R.FAILED, _R.REVOKED, _R.REVIEW)

REQUEST_TRANSITIONS: dict[tuple[RequestState, RequestEvent], RequestState] = {
    (_R.PENDING, _RE.WORK_STARTED): _R.PROCESSING,
    (_R.AWAITING_INPUT, _RE.WORK_STARTED): _R.PROCESSING,  # a supplement queued before the clarification
    **{(s, _RE.PROGRESS): s for s in _OPEN},
    **{(s, _RE.CLARIFIED): _R.AWAITING_INPUT for s in _OPEN},
    (_R.PENDING, _RE.SUPPLEMENTED): _R.PENDING,
    (_R.PROCESSING, _RE.SUPPLEMENTED): _R.PROCESSING,  # delivered after the current target run
    (_R.AWAITING_INPUT, _RE.SUPPLEMENTED): _R.PENDING,
    **{(s, _RE.REPLIED): _R.REPLIED for s in _OPEN},
    (_R.PROCESSING, _RE.RUN_ENDED_NO_RESULT): _R.FAILED,
    (_R.PROCESSING, _RE.RUN_ENDED_MORE_QUEUED): _R.PENDING,
    # The run already answered (or the request closed meanwhile): its end changes nothing. PENDING:
    # it asked a clarification and the source supplemented before this run ended.
    **{
        (s, e): s
        for s in (_R.PENDING, _R.AWAITING_INPUT, *_REQUEST_CLOSED)
        for e in (_RE.RUN_ENDED_NO_RESULT, _RE.RUN_ENDED_MORE_QUEUED)
    },
    (_R.PENDING, _RE.STOPPED): _R.REVOKED,
    (_R.AWAITING_INPUT, _RE.STOPPED): _R.REVOKED,
    (_R.PROCESSING, _RE.STOPPED): _R.PROCESSING,  # a started target may still reply
    **{(s, _RE.STOPPED): s for s in _REQUEST_CLOSED},
    (_R.PENDING, _RE.START_UNCERTAIN): _R.REVIEW,
    (_R.PROCESSING, _RE.START_UNCERTAIN): _R.REVIEW,
    **{(s, _RE.START_UNCERTAIN): s for s in (_R.AWAITING_INPUT, *_REQUEST_CLOSED)},
    (_R.PENDING, _RE.PARTY_UNAVAILABLE): _R.FAILED,
    (_R.AWAITING_INPUT, _RE.PARTY_UNAVAILABLE): _R.FAILED,
    (_R.PROCESSING, _RE.PARTY_UNAVAILABLE): _R.FAILED,
    **{(s, _RE.PARTY_UNAVAILABLE): s for s in _REQUEST_CLOSED},
}

_D, _DE = DeliveryState, DeliveryEvent
DELIVERY_TRANSITIONS: dict[tuple[DeliveryState, DeliveryEvent], DeliveryState] = {
    (_D.PENDING, _DE.CLAIM): _D.CLAIMED,
    (_D.CLAIMED, _DE.RELEASE): _D.PENDING,
    (_D.CLAIMED, _DE.BEGIN_START): _D.STARTING,
    (_D.STARTING, _DE.LINK): _D.LINKED,
    (_D.LINKED, _DE.SETTLE): _D.SETTLED,
    (_D.PENDING, _DE.CANCEL): _D.CANCELLED,
    (_D.CLAIMED, _DE.CANCEL): _D.CANCELLED,
    (_D.STARTING, _DE.CANCEL): _D.CANCELLED,  # the starter sees it on link and cancels its run
    (_D.CLAIMED, _DE.UNCERTAIN): _D.REVIEW,
    (_D.STARTING, _DE.UNCERTAIN): _D.REVIEW,
}

_C, _CE = ContinuationState, ContinuationEvent
CONTINUATION_TRANSITIONS: dict[tuple[ContinuationState, ContinuationEvent], ContinuationState] = {
    (_C.ACTIVE, _CE.SUPERSEDED): _C.RECEIVE_ONLY,
    (_C.RECEIVE_ONLY, _CE.SUPERSEDED): _C.RECEIVE_ONLY,
    (_C.REVOKED, _CE.SUPERSEDED): _C.REVOKED,
    (_C.ACTIVE, _CE.LIMIT_REACHED): _C.RECEIVE_ONLY,
    (_C.RECEIVE_ONLY, _CE.LIMIT_REACHED): _C.RECEIVE_ONLY,
    (_C.REVOKED, _CE.LIMIT_REACHED): _C.REVOKED,
    **{(s, _CE.STOPPED): _C.REVOKED for s in _C},
    **{(s, _CE.REPLY_ARRIVED): s for s in _C},
}

DELIVERY_BUSY = frozenset({_D.CLAIMED, _D.STARTING, _D.LINKED})  # the receiving session has an owner
DELIVERY_FINAL = frozenset({_D.SETTLED, _D.REVIEW, _D.CANCELLED})
REQUEST_OPEN = frozenset(_OPEN)


def next_request_state(state: RequestState, event: RequestEvent) -> RequestState:
    try:
        return REQUEST_TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition("request", state, event) from None


def next_delivery_state(state: DeliveryState, event: DeliveryEvent) -> DeliveryState:
    try:
        return DELIVERY_TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition("delivery", state, event) from None


def next_continuation_state(state: ContinuationState, event: ContinuationEvent) -> ContinuationState:
    try:
        return CONTINUATION_TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition("continuation", state, event) from None


def weakest(*states: ContinuationState) -> ContinuationState:
    """The effective permission of several layers (scope, request): the most restrictive wins."""
    order = (_C.ACTIVE, _C.RECEIVE_ONLY, _C.REVOKED)
    return max(states, key=order.index)
