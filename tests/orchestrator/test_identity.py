"""Every row of the entry-point table in both modes."""

from __future__ import annotations

import pytest

from orchestrator.identity import (
    IdentityInputError,
    ParentIdentity,
    Trigger,
    inherited_runtime_user,
    resolve_run_identity,
)
from orchestrator.identity import IdentityMode

OWNER, SPEAKER, LAST, PARENT_OWNER, PARENT_LAST = 17, 67, 42, 5, 9
EXEC, OWN = IdentityMode.EXECUTION, IdentityMode.OWNER

# trigger, speaker, session.last_runtime_user_id, parent, expected execution user
ROWS = [
    (Trigger.GROUP_MESSAGE, SPEAKER, LAST, None, SPEAKER),
    (Trigger.PRIVATE_MESSAGE, SPEAKER, LAST, None, SPEAKER),
    (Trigger.RETRY, SPEAKER, LAST, None, LAST),
    (Trigger.RETRY, SPEAKER, None, None, None),
    (Trigger.CRASH_RECOVERY, None, LAST, None, LAST),
    (Trigger.CRASH_RECOVERY, None, None, None, None),
    (Trigger.SUBAGENT, None, LAST, ParentIdentity(PARENT_OWNER, PARENT_LAST), LAST),
    (Trigger.SUBAGENT, None, None, ParentIdentity(PARENT_OWNER, PARENT_LAST), PARENT_LAST),
    (Trigger.SUBAGENT, None, None, ParentIdentity(PARENT_OWNER, None), PARENT_OWNER),
    *[
        (trigger, SPEAKER, LAST, None, None)
        for trigger in (
            Trigger.WEB,
            Trigger.SCHEDULED,
            Trigger.OPENAPI,
            Trigger.MANUAL_COMPACTION,
            Trigger.SIDE_TASK,
            Trigger.WECHAT,
        )
    ],
]


@pytest.mark.parametrize("trigger,speaker,last,parent,expected_execution", ROWS)
def test_execution_mode_follows_the_table(trigger, speaker, last, parent, expected_execution) -> None:
    identity = resolve_run_identity(
        EXEC, trigger, owner_user_id=OWNER, speaker_user_id=speaker,
        session_last_runtime_user_id=last, parent=parent,
    )
    assert identity.execution_user_id == expected_execution
    assert identity.runtime_user_id == (expected_execution if expected_execution is not None else OWNER)
    assert identity.owner_user_id == OWNER


@pytest.mark.parametrize("trigger,speaker,last,parent,expected_execution", ROWS)
def test_owner_mode_always_runs_as_the_owner(trigger, speaker, last, parent, expected_execution) -> None:
    identity = resolve_run_identity(
        OWN, trigger, owner_user_id=OWNER, speaker_user_id=speaker,
        session_last_runtime_user_id=last, parent=parent,
    )
    assert identity.runtime_user_id == OWNER
    # approvals and billing still follow who triggered the run
    assert identity.execution_user_id == expected_execution


def test_every_trigger_has_a_row() -> None:
    assert {row[0] for row in ROWS} == set(Trigger)


@pytest.mark.parametrize("trigger", [Trigger.GROUP_MESSAGE, Trigger.PRIVATE_MESSAGE])
def test_speaker_triggers_need_a_speaker(trigger) -> None:
    with pytest.raises(IdentityInputError) as info:
        resolve_run_identity(EXEC, trigger, owner_user_id=OWNER)
    assert info.value.field == "speaker_user_id"


def test_subagent_needs_a_parent() -> None:
    with pytest.raises(IdentityInputError):
        resolve_run_identity(EXEC, Trigger.SUBAGENT, owner_user_id=OWNER)


def test_spawn_inherits_parent_runtime_or_owner() -> None:
    assert inherited_runtime_user(ParentIdentity(PARENT_OWNER, PARENT_LAST)) == PARENT_LAST
    assert inherited_runtime_user(ParentIdentity(PARENT_OWNER, None)) == PARENT_OWNER
