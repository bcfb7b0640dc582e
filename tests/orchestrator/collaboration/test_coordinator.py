"""Requests, answers and the inbox (and the race and fault matrix)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from orchestrator.errors import Conflict, InvalidInput, NotFound
from orchestrator.identity import Trigger
from orchestrator.runs.records import RunStatus
from orchestrator.runs.service import StartRun
from tests.orchestrator.collaboration.conftest import Harness


def counts(h: Harness) -> dict[str, int]:
    conn = h.service.mailbox.connection()
    return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("requests", "messages", "deliveries")}


# --- contact_session ---------------------------------------------------------------------------

def test_contact_returns_at_once_and_queues_one_delivery(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    run = harness.user_run("A")
    body = harness.tool(run, "contact_session", {"target": "B", "message": "what is the port?"}, "call-1")
    assert body["ok"] and body["result"]["state"] == "pending" and body["result"]["duplicate"] is False
    assert "do not wait" in body["result"]["note"]
    request_id = body["result"]["request_id"]
    view = harness.view("A", request_id)
    assert view.request.source_run_id == run and view.request.generation == run  # from the trusted run
    assert [m.kind.value for m in view.messages] == ["request"]
    assert harness.states("A", request_id) == ("pending", "pending", "active")
    assert harness.service.runs.get(run).status is RunStatus.RUNNING  # nothing waited for B


def test_retries_give_one_request_one_message_one_delivery(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    run = harness.user_run("A")
    first = harness.tool(run, "contact_session", {"target": "B", "message": "hi"}, "call-1")
    with ThreadPoolExecutor(4) as pool:  # retries racing each other too
        again = list(pool.map(lambda _: harness.tool(run, "contact_session", {"target": "B", "message": "hi"}, "call-1"), range(6)))
    ids = {first["result"]["request_id"], *(a["result"]["request_id"] for a in again)}
    assert len(ids) == 1 and all(a["result"]["duplicate"] for a in again)
    assert counts(harness) == {"requests": 1, "messages": 1, "deliveries": 1}


def test_same_key_with_a_different_body_is_a_conflict_and_changes_nothing(harness: Harness) -> None:
    harness.session("A"), harness.session("B"), harness.session("C")
    run = harness.user_run("A")
    request_id = harness.contact(run, "B", "hi", call_id="call-1")
    for args in ({"target": "B", "message": "something else"}, {"target": "C", "message": "hi"}):
        body = harness.tool(run, "contact_session", args, "call-1")
        assert not body["ok"] and body["error"]["code"] == "conflict"
        assert body["error"]["existing_id"] == request_id
    assert counts(harness) == {"requests": 1, "messages": 1, "deliveries": 1}


def test_without_a_tool_call_id_the_body_is_the_key(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    run = harness.user_run("A")
    a = harness.contact(run, "B", "hi")
    assert harness.contact(run, "B", "hi") == a
    assert harness.contact(run, "B", "something else") != a
    other_run = harness.user_run("A")
    assert harness.contact(other_run, "B", "hi") != a  # the key is bound to the run
    assert counts(harness)["requests"] == 3


def test_source_fields_cannot_be_supplied_by_the_model(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    run = harness.user_run("A")
    body = harness.tool(run, "contact_session", {"target": "B", "message": "hi", "source_session": "X"})
    assert body["error"]["code"] == "invalid_arguments" and "source_session" in body["error"]["message"]
    assert counts(harness)["requests"] == 0


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        ({"target": "A", "message": "hi"}, "invalid_arguments"),
        ({"target": "nobody", "message": "hi"}, "not_found"),
        ({"target": "../etc", "message": "hi"}, "invalid_arguments"),
        ({"target": "B", "message": ""}, "invalid_arguments"),
        ({"target": "B", "message": "x" * 16_001}, "too_large"),
        ({"target": "theirs", "message": "hi"}, "not_found"),  # another owner's session looks absent
    ],
)
def test_contact_refusals_change_nothing(harness: Harness, arguments: dict, code: str) -> None:
    harness.session("A"), harness.session("B"), harness.session("theirs", owner=8)
    run = harness.user_run("A")
    body = harness.tool(run, "contact_session", arguments)
    assert body["ok"] is False and body["error"]["code"] == code, body
    assert counts(harness) == {"requests": 0, "messages": 0, "deliveries": 0}


def test_a_group_members_run_may_not_contact_the_owners_sessions(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    run = harness.user_run("A", trigger="private_message", speaker=67)  # runtime user 67, owner 7
    body = harness.tool(run, "contact_session", {"target": "B", "message": "hi"})
    assert body["error"]["code"] == "forbidden" and "another member" in body["error"]["message"]


def test_cross_project_is_allowed_by_default_and_refused_without_names_when_off(harness: Harness) -> None:
    harness.session("A", project="alpha"), harness.session("B", project="beta"), harness.session("C")
    run = harness.user_run("A")
    assert harness.contact(run, "B")
    assert harness.contact(run, "C")  # personal session: another "project" too, allowed
    harness.service.projects.update("beta", cross_project_collaboration=False)
    body = harness.tool(run, "contact_session", {"target": "B", "message": "again"})
    assert body["error"]["code"] == "forbidden"
    assert "beta" not in body["error"]["message"] and "alpha" not in body["error"]["message"]
    harness.service.projects.update("beta", cross_project_collaboration=True)
    harness.service.projects.update("alpha", cross_project_collaboration=False)
    assert harness.tool(run, "contact_session", {"target": "B", "message": "again"})["error"]["code"] == "forbidden"
    harness.session("A2", project="alpha")
    assert harness.contact(run, "A2")  # same project: the switch is about other projects


def test_turning_cross_project_off_cancels_what_waits(harness: Harness) -> None:
    harness.session("A", project="alpha"), harness.session("B", project="beta")
    request_id = harness.contact(harness.user_run("A"), "B")
    harness.service.projects.update("alpha", cross_project_collaboration=False)
    assert harness.claim("B") is None
    assert harness.states("A", request_id) == ("failed", "cancelled", "active")
    assert harness.view("A", request_id).request.reason == "cross_project_disabled"


def test_bounded_queue_refuses_clearly(make_harness) -> None:
    h = make_harness(collaboration_queue_max=2)
    h.session("A"), h.session("B")
    run = h.user_run("A")
    h.contact(run, "B", "1"), h.contact(run, "B", "2")
    body = h.tool(run, "contact_session", {"target": "B", "message": "3"})
    assert body["error"]["code"] == "queue_full" and body["error"]["limit"] == 2
    assert counts(h)["requests"] == 2
    item, delivery_run = h.take("B")  # the queue drains: room again
    assert h.contact(run, "B", "3")


# --- the inbox and the link -------------------------------------------------------------------

def test_two_sources_one_target_fifo_with_one_owner_at_a_time(harness: Harness) -> None:
    for sid in ("A1", "A2", "B"):
        harness.session(sid)
    first = harness.contact(harness.user_run("A1"), "B", "from A1")
    second = harness.contact(harness.user_run("A2"), "B", "from A2")
    item = harness.claim("B")
    assert item.requests.keys() == {first}
    assert harness.claim("B") is None  # claimed: the session has an owner
    run = harness.start("B", item.delivery.delivery_id)
    assert harness.claim("B") is None  # linked and running
    assert harness.states("A1", first) == ("processing", "linked", "active")
    harness.reply(run, first)
    harness.end(run)
    item2, run2 = harness.take("B")
    assert item2.requests.keys() == {second}
    harness.reply(run2, second)
    harness.end(run2)
    assert harness.states("A2", second)[0] == "replied"


def test_concurrent_sources_each_get_one_delivery_in_arrival_order(harness: Harness) -> None:
    harness.session("B")
    sources = [harness.session(f"A{i}") for i in range(12)]
    runs = {sid: harness.user_run(sid) for sid in sources}
    with ThreadPoolExecutor(6) as pool:
        ids = list(pool.map(lambda sid: harness.contact(runs[sid], "B", sid, call_id="c"), sources))
    assert len(set(ids)) == 12 and counts(harness)["deliveries"] == 12
    seen = []
    for _ in ids:
        item, run = harness.take("B")
        (request_id,) = item.requests
        seen.append(request_id)
        harness.reply(run, request_id)
        harness.end(run)
    order = [harness.view("B", r).request.seq for r in seen]
    assert order == sorted(order) and set(seen) == set(ids)


def test_a_target_busy_with_its_own_run_keeps_deliveries_queued(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    own = harness.user_run("B")
    request_id = harness.contact(harness.user_run("A"), "B")
    assert harness.claim("B") is None
    assert harness.states("A", request_id) == ("pending", "pending", "active")
    harness.end(own)
    assert harness.claim("B") is not None


def test_a_user_run_between_claim_and_start_sends_the_delivery_back_to_the_queue(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    request_id = harness.contact(harness.user_run("A"), "B")
    item = harness.claim("B")
    own = harness.user_run("B")  # the target's user speaks first
    with pytest.raises(Conflict) as info:
        harness.start("B", item.delivery.delivery_id)
    assert info.value.details["reason"] == "session_busy"
    assert harness.states("A", request_id) == ("pending", "pending", "active")
    assert harness.service.run_repo.running_in_session("B") == [harness.service.runs.get(own)]  # no extra run
    harness.end(own)
    again = harness.claim("B")
    assert again.delivery.delivery_id == item.delivery.delivery_id  # the same delivery, same place


def test_start_guard_refusals(harness: Harness) -> None:
    harness.session("A"), harness.session("B"), harness.session("C")
    request_id = harness.contact(harness.user_run("A"), "B")
    delivery_id = harness.view("A", request_id).deliveries[0].delivery_id
    with pytest.raises(Conflict, match="take it from the inbox"):
        harness.start("B", delivery_id)  # not claimed yet
    with pytest.raises(NotFound):
        harness.start("B", "cd-" + "0" * 24)
    with pytest.raises(InvalidInput) as info:
        harness.start("B", "not-a-delivery")
    assert info.value.field == "delivery_id"
    harness.claim("B")
    with pytest.raises(NotFound):
        harness.start("C", delivery_id)  # another session's delivery
    with pytest.raises(InvalidInput) as info:
        harness.service.runs.start(
            "B", StartRun(Trigger.PRIVATE_MESSAGE, speaker_user_id=67, delivery_id=delivery_id), actor="test"
        )
    assert info.value.field == "trigger"  # a delivery runs as the owner
    run = harness.start("B", delivery_id)
    with pytest.raises(Conflict) as info:
        harness.start("B", delivery_id)
    assert info.value.details["reason"] == "already_started" and info.value.details["run_id"] == run
    assert len(harness.service.run_repo.running_in_session("B")) == 1


def test_a_target_run_that_ends_without_an_answer_fails_the_request(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    request_id = harness.contact(harness.user_run("A"), "B")
    _, run = harness.take("B")
    harness.reply(run, request_id, kind="progress", message="looking")  # a note is not an answer
    harness.end(run)
    view = harness.view("A", request_id)
    assert (view.request.state.value, view.request.reason) == ("failed", "no_result")
    assert view.deliveries[0].outcome == "succeeded"
    assert harness.claim("A") is None  # no automatic follow-up


def test_progress_is_stored_and_starts_nothing(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    source_run = harness.user_run("A")
    request_id = harness.contact(source_run, "B")
    harness.end(source_run)
    _, run = harness.take("B")
    body = harness.reply(run, request_id, kind="progress", message="half way")
    assert body["ok"] and body["result"]["delivery_id"] is None and body["result"]["request_state"] == "processing"
    assert harness.claim("A") is None


def test_clarification_round_trip_and_its_bound(make_harness) -> None:
    h = make_harness(collaboration_clarifications_max=1)
    h.session("A"), h.session("B")
    source_run = h.user_run("A")
    request_id = h.contact(source_run, "B", "fix the build")
    h.end(source_run)
    _, b1 = h.take("B")
    assert h.reply(b1, request_id, kind="clarification", message="which branch?")["result"]["request_state"] == "awaiting_input"
    h.end(b1)
    assert h.states("A", request_id)[0] == "awaiting_input"  # asking is not failing
    item, a2 = h.take("A")
    assert [m.kind.value for m in item.messages] == ["clarification"]
    assert h.reply(a2, request_id, kind="supplement", message="main")["result"]["request_state"] == "pending"
    h.end(a2)
    item, b2 = h.take("B")
    assert [m.body for m in item.messages] == ["main"]
    refused = h.reply(b2, request_id, kind="clarification", message="and which commit?")
    assert refused["error"]["code"] == "limit_reached"
    h.reply(b2, request_id, message="fixed on main")
    h.end(b2)
    item, a3 = h.take("A")
    assert [m.body for m in item.messages] == ["fixed on main"]
    assert [m.kind.value for m in h.view("A", request_id).messages] == ["request", "clarification", "supplement", "reply"]


def test_a_supplement_that_arrives_before_the_clarifying_run_ends(harness: Harness) -> None:
    """Found by the two-bot loop: the source answers the clarification while the target's run
    that asked it is still ending. The request stays pending and the supplement is delivered."""
    harness.session("A"), harness.session("B")
    source_run = harness.user_run("A")
    request_id = harness.contact(source_run, "B")
    harness.end(source_run)
    _, b1 = harness.take("B")
    harness.reply(b1, request_id, kind="clarification", message="which one?")
    _, a2 = harness.take("A")  # A is free: its bot takes the clarification at once
    harness.reply(a2, request_id, kind="supplement", message="the first")
    harness.end(a2)
    harness.end(b1)  # only now does the clarifying run end
    assert harness.states("A", request_id)[0] == "pending"
    item, b2 = harness.take("B")
    assert [m.body for m in item.messages] == ["the first"]
    assert harness.states("A", request_id)[0] == "processing"


def test_who_may_answer(harness: Harness) -> None:
    for sid in ("A", "B", "C"):
        harness.session(sid)
    request_id = harness.contact(harness.user_run("A"), "B")
    outsider = harness.user_run("C")
    body = harness.reply(outsider, request_id)
    assert body["error"]["code"] == "not_found"  # a non-participant learns nothing
    assert harness.reply(harness.user_run("A"), request_id)["error"]["code"] == "forbidden"  # the source can't reply
    assert harness.reply(harness.user_run("B"), request_id, kind="supplement")["error"]["code"] == "forbidden"


def test_the_targets_user_may_take_over_and_reply_before_the_bot_starts(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    source_run = harness.user_run("A")
    request_id = harness.contact(source_run, "B")
    harness.end(source_run)
    own = harness.user_run("B")
    assert harness.reply(own, request_id, message="done by hand")["result"]["request_state"] == "replied"
    harness.end(own)
    assert harness.view("A", request_id).deliveries[0].state.value == "cancelled"  # the queued work is moot
    item = harness.claim("B")
    assert item is None
    assert harness.claim("A").messages[0].body == "done by hand"


def test_reply_retries_give_one_message_and_one_continuation(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    source_run = harness.user_run("A")
    request_id = harness.contact(source_run, "B")
    _, run = harness.take("B")
    answers = [harness.reply(run, request_id, message="42", call_id="r1") for _ in range(3)]
    assert len({a["result"]["message_id"] for a in answers}) == 1
    assert [a["result"]["duplicate"] for a in answers] == [False, True, True]
    assert harness.reply(run, request_id, message="43", call_id="r1")["error"]["code"] == "conflict"
    assert harness.reply(run, request_id, message="43", call_id="r2")["error"]["code"] == "request_closed"
    assert counts(harness) == {"requests": 1, "messages": 2, "deliveries": 2}


def test_the_target_cannot_forward_to_a_third_session(harness: Harness) -> None:
    for sid in ("A", "B", "C"):
        harness.session(sid)
    harness.contact(harness.user_run("A"), "B")
    _, run = harness.take("B")
    for target in ("C", "A"):  # neither onward nor back as a new request (no A→B→A chain)
        body = harness.tool(run, "contact_session", {"target": target, "message": "can you do it?"})
        assert body["error"]["code"] == "forbidden" and "cannot be forwarded" in body["error"]["message"]
    # its own user work may ask others
    harness.end(run)
    assert harness.contact(harness.user_run("B"), "C")


def test_a_to_b_and_b_to_a_at_once_without_deadlock(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    rounds = 15
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def side(me: str, other: str) -> None:
        try:
            for i in range(rounds):
                run = harness.user_run(me)
                barrier.wait(timeout=20)
                harness.contact(run, other, f"{me} asks {i}", call_id=f"{i}")
                harness.end(run)
                handled = 0
                while handled < 1:  # handle the other side's request to me
                    item = harness.claim(me)
                    if item is None:
                        time.sleep(0.002)
                        continue
                    if item.delivery.direction.value != "work":  # an answer to my request: take it
                        harness.end(harness.start(me, item.delivery.delivery_id))
                        continue
                    delivery_run = harness.start(me, item.delivery.delivery_id)
                    (request_id,) = item.requests
                    assert harness.reply(delivery_run, request_id, message=f"{me} answers")["ok"]
                    harness.end(delivery_run)
                    handled += 1
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=side, args=p) for p in (("A", "B"), ("B", "A"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert errors == []
    replied = [v for v in harness.service.collaboration.list("A", before=None, limit=100) if v.request.state.value == "replied"]
    assert len(replied) == 2 * rounds
