"""What the person named by `X-Acting-User` may act on (docs/decisions.md, "X-Acting-User").

Without the header the bot is trusted for everyone and nothing here narrows anything. With it,
a person acts on itself only: its own `users/{uid}` routes, sessions it can see, runs it is the
person of, deliveries of sessions it can see. Not visible looks like not found (404); a route
naming another user id is 403.
"""

from __future__ import annotations

from orchestrator.errors import Forbidden, NotFound
from orchestrator.http.parts import RunReach
from orchestrator.runs.records import RunRecord, person_of


def require_self(acting: int | None, user_id: int) -> None:
    """A person may act on itself only: `users/{uid}` routes refuse another uid."""
    if acting is not None and acting != user_id:
        raise Forbidden(
            f"X-Acting-User {acting} may act on user {acting} only, not on user {user_id}", field="X-Acting-User"
        )


def visible_run(reach: RunReach, run_id: str, acting: int | None) -> RunRecord:
    """The run, when its session is visible to `acting` (a member sees its group's runs)."""
    run = reach.runs.get(run_id)
    if acting is not None:
        try:
            reach.sessions.get(run.session_id, acting_user=acting)
        except NotFound:
            raise NotFound(f"run {run_id} not found") from None
    return run


def own_run(reach: RunReach, run_id: str, acting: int | None, *, owner_too: bool = False) -> RunRecord:
    """The run, when `acting` is its person (tool calls run as that person's identity); with
    `owner_too` also for the session owner (ending a run in one's own session)."""
    run = visible_run(reach, run_id, acting)
    if acting is not None and acting != person_of(run) and not (owner_too and acting == run.owner_user_id):
        raise NotFound(f"run {run_id} not found")
    return run


def check_delivery(reach: RunReach, session_id: str, delivery_id: str, acting: int | None) -> None:
    if acting is None:
        return
    try:
        reach.sessions.get(session_id, acting_user=acting)
    except NotFound:
        raise NotFound(f"delivery {delivery_id} not found") from None
