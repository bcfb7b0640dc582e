"""Cross-session reading (docs/sessions.md): who may read which conversation. Pure.

    can_read(A → B) = project(A).cross_session_read      project switch, default false
                  AND A.allow_cross_read                outbound, default true
                  AND NOT B.cross_private               inbound, default false
                  AND A.project_id == B.project_id AND owner(A) == owner(B)

`read_verdict` is that formula (with the reason when it says no); `can_read` is its yes/no.
A personal conversation has no project and so no switch to turn on: its gate is closed.
On top (our rule, fail-closed): a run acting for anyone but the conversation's owner may
not use the cross-session tools at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from orchestrator.identity import RunIdentity


class SessionFlags(Protocol):
    session_id: str
    owner_user_id: int
    project_id: str | None
    allow_cross_read: bool
    cross_private: bool


@dataclass(frozen=True)
class Conversation:
    """The facts of one session the formula looks at."""

    session_id: str
    owner_user_id: int
    project_id: str | None
    allow_cross_read: bool = True
    cross_private: bool = False

    @classmethod
    def of(cls, record: SessionFlags) -> Conversation:
        return cls(
            session_id=record.session_id,
            owner_user_id=record.owner_user_id,
            project_id=record.project_id,
            allow_cross_read=record.allow_cross_read,
            cross_private=record.cross_private,
        )


class ReadVerdict(str, Enum):
    ALLOWED = "allowed"
    GATE_CLOSED = "project_gate_closed"  # the project switch is off (or there is no project)
    OUTBOUND_OFF = "outbound_off"  # A.allow_cross_read is false
    OTHER_SCOPE = "other_scope"  # another project or another owner: must look like "not found"
    TARGET_PRIVATE = "target_private"  # B.cross_private: not readable and not even listed

    @property
    def looks_like_not_found(self) -> bool:
        # The existence of another owner's, another project's or a private conversation is information.
        return self in (ReadVerdict.OTHER_SCOPE, ReadVerdict.TARGET_PRIVATE)


def read_verdict(project_cross_session_read: bool, reader: Conversation, target: Conversation) -> ReadVerdict:
    """The formula for reading `target` from a run in `reader` (A → B).

    `project_cross_session_read` is project(A)'s switch; pass `project_gate(...)`, which is
    false for a personal conversation (it has no project, so nothing can turn it on).
    """
    outbound = outbound_verdict(project_cross_session_read, reader)
    if outbound is not ReadVerdict.ALLOWED:
        return outbound
    if reader.project_id != target.project_id or reader.owner_user_id != target.owner_user_id:
        return ReadVerdict.OTHER_SCOPE
    if target.cross_private:
        return ReadVerdict.TARGET_PRIVATE
    return ReadVerdict.ALLOWED


def outbound_verdict(project_cross_session_read: bool, reader: Conversation) -> ReadVerdict:
    """The formula's terms about A alone: may a run in `reader` read other conversations at all?"""
    if not project_cross_session_read:
        return ReadVerdict.GATE_CLOSED
    if not reader.allow_cross_read:
        return ReadVerdict.OUTBOUND_OFF
    return ReadVerdict.ALLOWED


def can_read(project_cross_session_read: bool, reader: Conversation, target: Conversation) -> bool:
    return read_verdict(project_cross_session_read, reader, target) is ReadVerdict.ALLOWED


def project_gate(reader_project_id: str | None, project_cross_session_read: bool) -> bool:
    return reader_project_id is not None and project_cross_session_read


def search_verdict(project_cross_session_read: bool, reader: Conversation, target: Conversation) -> ReadVerdict:
    """Whose transcripts `session_search` may search from `reader` (our decision, docs/sessions.md).

    The reader's own conversation, always. Another one through the same formula, except that
    a personal scope counts as an open gate: it has no project switch and holds only its
    owner's conversations. The outbound and private flags apply everywhere.
    """
    if target.session_id == reader.session_id and target.owner_user_id == reader.owner_user_id:
        return ReadVerdict.ALLOWED
    gate = True if reader.project_id is None else project_cross_session_read
    return read_verdict(gate, reader, target)


def acts_for_another_member(identity: RunIdentity) -> bool:
    """Fail-closed: the run's runtime identity is not the owner, or (in `owner` mode) the
    person who triggered it is not. Either way a group member must not read the owner's
    other conversations through it."""
    if identity.runtime_user_id != identity.owner_user_id:
        return True
    return identity.execution_user_id is not None and identity.execution_user_id != identity.owner_user_id
