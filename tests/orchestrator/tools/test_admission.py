"""The admission of a tool call, pure: records in, `Refused` or `Admitted` out (no state
store, no sandbox). Its idempotency wrapper is exercised through the live server in
test_idempotent_calls.py; its wait for a first call still running is tested here on its own."""

from __future__ import annotations

import asyncio
import threading

import pytest

from orchestrator.errors import CleanupPending, NotFound, RunEnded, ToolError
from orchestrator.identity import IdentityMode, Trigger
from orchestrator.runs.records import RunRecord, RunStatus
from orchestrator.sessions.records import SessionRecord
from mounts.layout import GroupRef
from orchestrator.tools.admission import Admitted, Refused, Repeat, admit, person_refusal
from orchestrator.tools.call_records import CallRecords, Repeats
from orchestrator.tools.container_tools import CONTAINER_TOOL_SPECS

OWNER, RUNTIME = 17, 42
SPECS = {spec.name: spec for spec in CONTAINER_TOOL_SPECS}
NAMES = sorted(SPECS)


def run_record(status: RunStatus = RunStatus.RUNNING) -> RunRecord:
    return RunRecord(
        run_id="r-1", session_id="s-1", trigger=Trigger.WEB, agent_id="bot", identity_mode=IdentityMode.EXECUTION,
        owner_user_id=OWNER, execution_user_id=RUNTIME, runtime_user_id=RUNTIME, speaker_user_id=None,
        delivery_id=None, status=status, started_at="2026-01-01T00:00:00Z", ended_at=None,
    )  # fmt: skip


def session_record(deleted: bool = False) -> SessionRecord:
    return SessionRecord(
        session_id="s-1", owner_user_id=OWNER, project_id=None, channel="web", group=None, parent_session_id=None,
        title=None, last_runtime_user_id=None, allow_cross_read=False, cross_private=False, archived=False,
        pinned=False, created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:00Z",
        deleted_at="2026-01-02T00:00:00Z" if deleted else None,
    )  # fmt: skip


def decide(name: str, arguments: dict, run: RunRecord | None = None, session: SessionRecord | None = None):
    run = run_record() if run is None else run
    session = session_record() if session is None else session
    return admit("r-1", run, session, name, SPECS.get(name), arguments, tool_names=lambda: NAMES)


def test_a_valid_container_call_is_admitted_as_the_runtime_user_with_its_arguments() -> None:
    decision = decide("read_file", {"path": "notes.md"})
    assert isinstance(decision, Admitted)
    assert decision.acting_user == RUNTIME and decision.spec.name == "read_file"
    assert decision.arguments.model_dump()["path"] == "notes.md"
    assert decision.tool_call_id is None  # no record until the idempotency wrapper gives it one


def test_a_gone_or_ended_run_or_a_deleted_session_is_the_requests_error_not_a_tool_result() -> None:
    gone = admit("r-9", None, None, "read_file", SPECS["read_file"], {"path": "a"}, tool_names=lambda: NAMES)
    assert isinstance(gone, Refused) and isinstance(gone.error, NotFound) and not gone.is_tool_result
    assert gone.acting_user is None
    ended = decide("read_file", {"path": "a"}, run=run_record(RunStatus.SUCCEEDED))
    assert isinstance(ended, Refused) and isinstance(ended.error, RunEnded)
    deleted = decide("read_file", {"path": "a"}, session=session_record(deleted=True))
    assert isinstance(deleted, Refused) and isinstance(deleted.error, NotFound) and "s-1" in deleted.error.message


def test_an_invented_tool_is_a_tool_result_listing_the_tools_under_the_runtime_user() -> None:
    decision = decide("rm_rf_everything", {})
    assert isinstance(decision, Refused) and decision.is_tool_result
    assert isinstance(decision.error, ToolError) and decision.error.code == "unknown_tool"
    assert decision.error.body()["tools"] == NAMES and decision.acting_user == RUNTIME


def test_bad_arguments_are_a_tool_result_naming_the_field() -> None:
    decision = decide("read_file", {"path": 5})
    assert isinstance(decision, Refused) and isinstance(decision.error, ToolError)
    assert decision.error.code == "invalid_arguments" and decision.error.body()["field"] == "path"
    assert decision.acting_user == RUNTIME


def records() -> Repeats:
    return Repeats(CallRecords(ttl_s=60, max_result_bytes=1000, copies=None))  # type: ignore[arg-type]


def test_a_call_that_is_not_a_repeat_answers_its_own_outcome() -> None:
    async def attempt() -> str:
        return "ran"

    assert asyncio.run(records().answer("r-1", None, lambda: 1.0, attempt)) == "ran"


def test_a_repeat_of_a_recorded_call_answers_its_body_at_once() -> None:
    async def attempt() -> Repeat:
        return Repeat({"ok": True, "result": 1})

    assert asyncio.run(records().answer("r-1", "c1", lambda: 1.0, attempt)) == {"ok": True, "result": 1}


def test_a_repeat_waits_for_the_first_call_then_reads_its_record_again() -> None:
    repeats = records()
    repeats.pending.open(("r-1", "c1"))
    attempts: list[int] = []

    async def attempt() -> Repeat:
        attempts.append(1)
        return Repeat(None) if len(attempts) == 1 else Repeat({"ok": True, "result": "first"})

    threading.Timer(0.1, repeats.completed, ("r-1", "c1")).start()
    assert asyncio.run(repeats.answer("r-1", "c1", lambda: 5.0, attempt)) == {"ok": True, "result": "first"}
    assert len(attempts) == 2


def test_a_repeat_that_waited_too_long_says_the_call_is_still_running() -> None:
    repeats = records()
    repeats.pending.open(("r-1", "c1"))

    async def attempt() -> Repeat:
        return Repeat(None)

    body = asyncio.run(repeats.answer("r-1", "c1", lambda: 0.2, attempt))
    assert isinstance(body, dict) and body["error"]["code"] == "in_progress"


@pytest.mark.parametrize("status", [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED])
def test_every_ended_status_refuses(status: RunStatus) -> None:
    decision = decide("read_file", {"path": "a"}, run=run_record(status))
    assert isinstance(decision, Refused) and decision.error.code == "run_ended"


def test_x_acting_user_calls_only_in_a_run_it_is_the_person_of() -> None:
    """The person check the tool route made with a run read of its own, now made on the
    admission's read (one read of the run per call)."""
    from dataclasses import replace

    nobody_is_member = lambda group, user: False  # noqa: E731 - a personal session asks nobody
    assert person_refusal("r-1", run_record(), session_record(), OWNER, nobody_is_member) is None
    gone = person_refusal("r-9", None, None, OWNER, nobody_is_member)
    assert isinstance(gone, NotFound) and gone.message == "run r-9 not found"
    stranger = person_refusal("r-1", run_record(), session_record(), 99, nobody_is_member)
    assert isinstance(stranger, NotFound) and stranger.message == "run r-1 not found"
    # A group run is its speaker's (a member of the group): the session's owner is not its person.
    spoken = replace(run_record(), speaker_user_id=67)
    group_session = replace(session_record(), group=GroupRef("slack", "C1"))
    members = lambda group, user: group == GroupRef("slack", "C1") and user == 67  # noqa: E731
    assert person_refusal("r-1", spoken, group_session, 67, members) is None
    assert isinstance(person_refusal("r-1", spoken, group_session, OWNER, members), NotFound)
    assert isinstance(person_refusal("r-1", spoken, group_session, 67, nobody_is_member), NotFound)  # left the group
    # A deleted session: not found, except for its owner while its cleanup is unfinished (503).
    deleted = session_record(deleted=True)
    assert isinstance(person_refusal("r-1", run_record(), deleted, OWNER, nobody_is_member), CleanupPending)
    assert isinstance(person_refusal("r-1", run_record(), deleted, 99, nobody_is_member), NotFound)

