"""Who may start a run in a session, and who joins its group by starting one (pure).

Without `X-Acting-User` the bot is trusted: it starts any run, and the speaker of a message in
a group session joins the group (a user who speaks in a group joins it and gets its workspace
mounts). With the header a person starts runs as itself only: as the speaker of a
session it can see (a member, so speaking joins nothing new), or as the owner for the triggers
without a speaker (docs/decisions.md, "X-Acting-User").
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import Forbidden
from orchestrator.identity import SPEAKER_TRIGGERS, Trigger
from orchestrator.users.repository import GroupRef


@dataclass(frozen=True)
class RunStartAccess:
    owner_only: bool  # the session must be the acting person's own, not only visible to it
    speaker_joins: bool  # the speaker becomes a member of the session's group (if it has one)

    def joining(self, group: GroupRef | None, speaker_user_id: int | None) -> int | None:
        """The user who joins `group` with this start, if any."""
        return speaker_user_id if self.speaker_joins and group is not None else None


def run_start_access(trigger: Trigger, speaker_user_id: int | None, acting_user: int | None) -> RunStartAccess:
    if acting_user is not None and speaker_user_id not in (None, acting_user):
        # Naming another person than the acting one is "may not" (403), not a malformed request.
        raise Forbidden("the speaker must be the acting user (X-Acting-User)", field="speaker_user_id")
    speaks = trigger in SPEAKER_TRIGGERS
    return RunStartAccess(owner_only=not speaks, speaker_joins=speaks and speaker_user_id is not None)
