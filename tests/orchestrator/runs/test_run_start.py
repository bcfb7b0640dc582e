"""Starting a run is one service call and one transaction: visibility, the identities, the start
guards, the speaker joining the group and the run row. A start refused anywhere in it leaves
nothing behind: no run, no membership, no runtime-user row, no changed last runtime user."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from orchestrator.errors import Forbidden
from orchestrator.identity import Trigger
from orchestrator.runs.start_access import run_start_access
from orchestrator.service import OrchestratorService
from orchestrator.users.repository import GroupRef
from tests.api_calls import MEMBER, OWNER, group_session

GROUP = GroupRef("feishu", "oc_team")
SPEAKER = 91  # not a member of the group before it speaks


def _traces(service: OrchestratorService, session_id: str) -> dict:
    """Everything a start writes about the session and the speaker."""
    with service.store.read() as tx:
        runs = tx.one("SELECT COUNT(*) AS n FROM runs WHERE session_id = ?", (session_id,))["n"]
        runtime = [r["user_id"] for r in tx.all("SELECT user_id FROM session_runtime_users WHERE session_id = ?", (session_id,))]
        last = tx.one("SELECT last_runtime_user_id FROM sessions WHERE session_id = ?", (session_id,))[0]
    return {
        "runs": runs,
        "runtime_users": sorted(runtime),
        "last_runtime_user_id": last,
        "speaker_is_member": service.users.is_group_member(GROUP, SPEAKER),
    }


NOTHING = {"runs": 0, "runtime_users": [], "last_runtime_user_id": None, "speaker_is_member": False}


def test_a_speakers_first_run_in_a_group_joins_it_and_starts_the_run(client: TestClient, service: OrchestratorService) -> None:
    sid = group_session(client)
    started = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": SPEAKER})
    assert started.status_code == 201, started.text
    assert started.json()["runtime_user_id"] == SPEAKER
    assert _traces(service, sid) == {
        "runs": 1,
        "runtime_users": [SPEAKER],
        "last_runtime_user_id": SPEAKER,
        "speaker_is_member": True,
    }
    # and being a member now, it sees the session as itself
    assert client.get(f"/v1/sessions/{sid}", headers={"X-Acting-User": str(SPEAKER)}).status_code == 200


def test_a_start_refused_by_a_guard_after_visibility_leaves_nothing_behind(
    client: TestClient, service: OrchestratorService
) -> None:
    sid = group_session(client)
    # The collaboration guard refuses a delivery run that would not run as the owner: the
    # session is visible and the identities resolve, and only then is the start refused.
    refused = client.post(
        f"/v1/sessions/{sid}/runs",
        json={"trigger": "group_message", "speaker_user_id": SPEAKER, "delivery_id": "cd-" + "0" * 24},
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["field"] == "trigger"
    assert _traces(service, sid) == NOTHING


def test_a_start_that_fails_after_the_join_rolls_the_join_back(client: TestClient, service: OrchestratorService) -> None:
    sid = group_session(client)
    with service.store.write() as tx:  # a real SQLite failure on the run's own insert
        tx.execute("CREATE TRIGGER no_runs BEFORE INSERT ON runs BEGIN SELECT RAISE(ABORT, 'disk says no'); END")
    with pytest.raises(Exception, match="disk says no"):
        client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": SPEAKER})
    assert _traces(service, sid) == NOTHING


def test_an_acting_member_removed_from_the_group_cannot_start_a_run(client: TestClient, service: OrchestratorService) -> None:
    sid = group_session(client)
    joined = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": MEMBER})
    assert joined.status_code == 201
    as_member = {"X-Acting-User": str(MEMBER)}
    body = {"trigger": "group_message", "speaker_user_id": MEMBER}
    assert client.post(f"/v1/sessions/{sid}/runs", json=body, headers=as_member).status_code == 201
    assert client.delete(f"/v1/groups/{GROUP.channel}/{GROUP.chat_id}/members/{MEMBER}").json()["removed"] is True
    gone = client.post(f"/v1/sessions/{sid}/runs", json=body, headers=as_member)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert not service.users.is_group_member(GROUP, MEMBER)  # speaking with the header joins nothing


@pytest.mark.parametrize(
    ("trigger", "speaker", "acting", "owner_only", "speaker_joins"),
    [
        (Trigger.GROUP_MESSAGE, SPEAKER, None, False, True),  # the bot: the speaker joins by speaking
        (Trigger.PRIVATE_MESSAGE, SPEAKER, SPEAKER, False, True),  # as itself, in a session it sees
        (Trigger.GROUP_MESSAGE, None, None, False, False),  # nobody speaks, nobody joins
        (Trigger.WEB, None, OWNER, True, False),  # the owner's own triggers are the owner's only
        (Trigger.SCHEDULED, None, None, True, False),
    ],
)
def test_the_start_access_rule(trigger: Trigger, speaker: int | None, acting: int | None, owner_only: bool, speaker_joins: bool) -> None:
    access = run_start_access(trigger, speaker, acting)
    assert (access.owner_only, access.speaker_joins) == (owner_only, speaker_joins)
    assert access.joining(GROUP, speaker) == (speaker if speaker_joins else None)
    assert access.joining(None, speaker) is None  # a personal session has no group to join


def test_a_person_speaks_for_itself_only() -> None:
    with pytest.raises(Forbidden) as refused:
        run_start_access(Trigger.GROUP_MESSAGE, MEMBER, OWNER)
    assert refused.value.field == "speaker_user_id"
