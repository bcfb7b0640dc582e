"""People in answers: the platform identity shown beside each integer user id.

A bot that names people by their platform ids reads them back the same way: a session's owner
and a run's owner and speaker carry `owner_identity` / `speaker_identity` when the person has
one. Which identity, for a person known on two platforms: the one on the session's platform
(its group's, else its channel's), else the oldest. One query per answer, whatever its length.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.errors import InvalidInput
from orchestrator.http.models import PersonIn, PersonOut, RunContextOut, RunOut, SessionOut
from orchestrator.users.identities import IdentityRecord, IdentityRepository, channel_platform, preferred_identity
from orchestrator.users.repository import UserRepository


def person_user_id(
    identities: IdentityRepository, users: UserRepository, user_id: int | None, person: PersonIn | None, *,
    field: str, person_field: str, actor: str, required: bool,
) -> int | None:  # fmt: skip
    """The user a body names by our id (`field`) or by platform identity (`person_field`,
    allocated on first sight): one of them, or neither when not `required`."""
    if user_id is not None and person is not None:
        raise InvalidInput(f"send {field} or {person_field}, not both", field=field)
    if person is not None:
        record = identities.sight(person.identity(), actor=actor)
        return users.admit(record.user_id, person_field)
    if user_id is None and required:
        raise InvalidInput(f"send {field} (our user id) or {person_field} (a platform identity)", field=field)
    return user_id


def _out(record: IdentityRecord | None) -> PersonOut | None:
    return None if record is None else PersonOut(platform=record.platform, id=record.external_id)


def with_session_identities(identities: IdentityRepository, outs: Sequence[SessionOut]) -> None:
    """In place: each session's `owner_identity`."""
    known = identities.of_users(out.owner_user_id for out in outs)
    for out in outs:
        hint = out.group.channel if out.group is not None else channel_platform(out.channel)
        out.owner_identity = _out(preferred_identity(known.get(out.owner_user_id, ()), hint))


def with_run_identities(identities: IdentityRepository, outs: Sequence[RunOut | RunContextOut]) -> None:
    """In place: each run's `owner_identity` and `speaker_identity` (its execution user's)."""
    people = {out.owner_user_id for out in outs} | {o.execution_user_id for o in outs if o.execution_user_id is not None}
    known = identities.of_users(people)
    for out in outs:
        out.owner_identity = _out(preferred_identity(known.get(out.owner_user_id, ()), None))
        if out.execution_user_id is not None:
            out.speaker_identity = _out(preferred_identity(known.get(out.execution_user_id, ()), None))
