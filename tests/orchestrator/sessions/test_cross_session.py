"""orchestrator/sessions/cross_session.py: the read formula and its acceptance table, pure."""

from __future__ import annotations

import pytest

from orchestrator.sessions.cross_session import (
    Conversation,
    ReadVerdict,
    acts_for_another_member,
    can_read,
    project_gate,
    read_verdict,
    search_verdict,
)
from orchestrator.identity import RunIdentity
from orchestrator.identity import IdentityMode

A = Conversation("A", 17, "p1")
B = Conversation("B", 17, "p1")

# acceptance table: scenario, project switch, A.allow_cross_read, target, expected
MATRIX = [
    ("all off (defaults)", False, True, B, ReadVerdict.GATE_CLOSED),
    ("normal", True, True, B, ReadVerdict.ALLOWED),
    ("outbound off", True, False, B, ReadVerdict.OUTBOUND_OFF),
    ("target private", True, True, Conversation("B", 17, "p1", cross_private=True), ReadVerdict.TARGET_PRIVATE),
    ("cross project", True, True, Conversation("C", 17, "p2"), ReadVerdict.OTHER_SCOPE),
    ("cross owner", True, True, Conversation("D", 18, "p1"), ReadVerdict.OTHER_SCOPE),
    ("self-read", True, True, A, ReadVerdict.ALLOWED),
    ("archived target", True, True, B, ReadVerdict.ALLOWED),  # archived is not a term of the formula
]


@pytest.mark.parametrize(("scenario", "gate", "outbound", "target", "expected"), MATRIX, ids=[m[0] for m in MATRIX])
def test_seed_000_acceptance_matrix(scenario: str, gate: bool, outbound: bool, target: Conversation, expected: ReadVerdict) -> None:
    reader = Conversation("A", 17, "p1", allow_cross_read=outbound)
    assert read_verdict(gate, reader, target) is expected
    assert can_read(gate, reader, target) is (expected is ReadVerdict.ALLOWED)


def test_cross_scope_and_private_look_like_not_found() -> None:
    assert {v for v in ReadVerdict if v.looks_like_not_found} == {ReadVerdict.OTHER_SCOPE, ReadVerdict.TARGET_PRIVATE}


def test_a_personal_conversation_has_no_switch_to_open() -> None:
    assert project_gate(None, True) is False
    assert project_gate("p1", True) is True and project_gate("p1", False) is False
    mine = Conversation("P", 17, None)
    assert read_verdict(project_gate(None, True), mine, Conversation("Q", 17, None)) is ReadVerdict.GATE_CLOSED


def test_search_scope() -> None:
    personal, other_personal = Conversation("P", 17, None), Conversation("Q", 17, None)
    assert search_verdict(False, personal, other_personal) is ReadVerdict.ALLOWED  # personal: no switch
    assert search_verdict(False, personal, Conversation("Q", 17, None, cross_private=True)) is ReadVerdict.TARGET_PRIVATE
    assert search_verdict(False, personal, B) is ReadVerdict.OTHER_SCOPE
    assert search_verdict(False, personal, Conversation("Q", 18, None)) is ReadVerdict.OTHER_SCOPE
    assert search_verdict(False, A, B) is ReadVerdict.GATE_CLOSED
    assert search_verdict(False, A, A) is ReadVerdict.ALLOWED  # one's own transcript, always
    assert search_verdict(True, A, B) is ReadVerdict.ALLOWED
    assert search_verdict(True, Conversation("A", 17, "p1", allow_cross_read=False), B) is ReadVerdict.OUTBOUND_OFF


def identity(mode: IdentityMode, execution: int | None, runtime: int) -> RunIdentity:
    return RunIdentity(mode=mode, owner_user_id=17, execution_user_id=execution, runtime_user_id=runtime)


def test_runs_acting_for_another_member_are_refused_fail_closed() -> None:
    assert acts_for_another_member(identity(IdentityMode.EXECUTION, 67, 67))  # group member's run
    assert acts_for_another_member(identity(IdentityMode.OWNER, 67, 17))  # owner mode, member speaking
    assert not acts_for_another_member(identity(IdentityMode.EXECUTION, None, 17))  # web / scheduled
    assert not acts_for_another_member(identity(IdentityMode.EXECUTION, 17, 17))  # the owner speaking
