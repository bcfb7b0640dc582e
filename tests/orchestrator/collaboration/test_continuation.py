"""Answers back to the source: continuation, work generations, stop, merging and bounds
(and the stop/continuation rows of the race and fault matrix)."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.errors import Conflict, NotFound
from orchestrator.runs.records import RunStatus
from tests.orchestrator.collaboration.conftest import Harness


def asked_and_answered(h: Harness, *, end_source: bool = True) -> tuple[str, str]:
    """A asks B, B answers. Returns (source run, request id)."""
    h.session("A"), h.session("B")
    source_run = h.user_run("A")
    request_id = h.contact(source_run, "B", "what is the port?")
    _, target_run = h.take("B")
    h.reply(target_run, request_id, message="8700")
    h.end(target_run)
    if end_source:
        h.end(source_run)
    return source_run, request_id


def test_an_answer_reaches_the_source_after_its_current_run_ends(harness: Harness) -> None:
    source_run, request_id = asked_and_answered(harness, end_source=False)
    assert harness.claim("A") is None  # A is still in its run: the answer waits
    assert harness.states("A", request_id) == ("replied", "pending", "active")
    harness.end(source_run)
    item, continuation = harness.take("A")
    assert item.delivery.direction.value == "continuation" and [m.body for m in item.messages] == ["8700"]
    harness.end(continuation)
    assert harness.states("A", request_id) == ("replied", "settled", "active")


def test_a_continuation_keeps_the_work_generation(harness: Harness) -> None:
    source_run, request_id = asked_and_answered(harness)
    harness.session("C")
    _, continuation = harness.take("A")
    follow_up = harness.contact(continuation, "C", "and you?")  # the source may ask onward in its continuation
    view = harness.view("A", follow_up)
    assert view.request.generation == source_run == harness.view("A", request_id).request.generation
    assert view.request.scope_id == harness.view("A", request_id).request.scope_id
    assert view.request.continuation.value == "active"  # a continuation does not begin new work


def test_a_retry_continues_the_latest_user_work(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    user_run = harness.user_run("A")
    harness.end(user_run, "failed")
    retry = harness.user_run("A", trigger="retry")
    request_id = harness.contact(retry, "B")
    assert harness.view("A", request_id).request.generation == user_run


def test_a_new_user_run_makes_older_work_receive_only_and_a_late_reply_cannot_revive_it(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    old = harness.user_run("A")
    request_id = harness.contact(old, "B")
    harness.end(old)
    harness.end(harness.user_run("A"))  # the user moved on: new work generation
    assert harness.states("A", request_id) == ("pending", "pending", "receive_only")
    assert harness.view("A", request_id).request.continuation_reason == "superseded"
    _, target_run = harness.take("B")  # the request itself still stands
    body = harness.reply(target_run, request_id, message="late answer")
    assert body["ok"] and body["result"]["delivery_id"] is None and body["result"]["continuation"] == "receive_only"
    harness.end(target_run)
    assert harness.claim("A") is None  # stored and shown, starts nothing
    view = harness.view("A", request_id)
    assert view.request.state.value == "replied" and view.messages[-1].body == "late answer"
    assert view.request.continuation.value == "receive_only"


def test_an_answer_queued_before_new_user_work_is_not_delivered_after_it(harness: Harness) -> None:
    source_run, request_id = asked_and_answered(harness)
    harness.end(harness.user_run("A"))  # new work before a bot took the answer
    assert harness.claim("A") is None
    view = harness.view("A", request_id)
    continuation = [d for d in view.deliveries if d.direction.value == "continuation"][0]
    assert (continuation.state.value, continuation.reason) == ("cancelled", "receive_only")
    assert view.messages[-1].body == "8700"  # the answer stays readable


def test_several_answers_are_merged_with_a_bound_and_never_start_two_source_runs(make_harness) -> None:
    h = make_harness(collaboration_merge_max=2)
    targets = ["B1", "B2", "B3"]
    h.session("A")
    for t in targets:
        h.session(t)
    source_run = h.user_run("A")
    requests = {t: h.contact(source_run, t, f"ask {t}") for t in targets}
    for t in targets:
        _, run = h.take(t)
        h.reply(run, requests[t], message=f"answer {t}")
        h.end(run)
    h.end(source_run)
    first, first_run = h.take("A")
    assert [m.body for m in first.messages] == ["answer B1", "answer B2"]
    assert h.claim("A") is None  # one source run at a time
    h.end(first_run)
    second, second_run = h.take("A")
    assert [m.body for m in second.messages] == ["answer B3"]
    h.end(second_run)
    carried = h.service.mailbox.connection().execute("SELECT COUNT(*), COUNT(DISTINCT message_id) FROM delivery_messages "
                                                      "JOIN deliveries USING (delivery_id) WHERE direction = 'continuation'").fetchone()
    assert tuple(carried) == (3, 3)  # each answer delivered exactly once


def test_automatic_continuations_are_bounded(make_harness) -> None:
    h = make_harness(collaboration_continuations_max=1)
    for sid in ("A", "B1", "B2"):
        h.session(sid)
    source_run = h.user_run("A")
    r1, r2 = h.contact(source_run, "B1"), h.contact(source_run, "B2")
    h.end(source_run)
    _, b1 = h.take("B1")
    h.reply(b1, r1, message="one")
    h.end(b1)
    _, a_run = h.take("A")
    h.end(a_run)
    _, b2 = h.take("B2")
    body = h.reply(b2, r2, message="two")
    assert body["ok"] and body["result"]["delivery_id"] is None
    h.end(b2)
    assert h.claim("A") is None  # the user decides now
    view = h.view("A", r2)
    assert (view.request.continuation.value, view.request.continuation_reason) == ("receive_only", "continuation_limit")
    assert view.messages[-1].body == "two"


# --- stop ----------------------------------------------------------------------------------

def test_stop_before_the_target_started_cancels_the_request(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    request_id = harness.contact(harness.user_run("A"), "B")
    result = harness.service.collaboration.stop("A", request_id)
    assert (result.view.request.state.value, result.view.request.continuation.value) == ("revoked", "revoked")
    assert result.cancelled_run_ids == []
    assert harness.claim("B") is None
    assert harness.reply(harness.user_run("B"), request_id)["error"]["code"] == "request_closed"
    again = harness.service.collaboration.stop("A", request_id)  # stopping twice is harmless
    assert again.view.request.state.value == "revoked"


def test_stop_then_a_late_reply_is_stored_and_starts_nothing(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    source_run = harness.user_run("A")
    request_id = harness.contact(source_run, "B")
    _, target_run = harness.take("B")
    harness.service.collaboration.stop("A", request_id)
    assert harness.states("A", request_id) == ("processing", "linked", "revoked")  # B may still finish
    body = harness.reply(target_run, request_id, message="late")
    assert body["ok"] and body["result"]["delivery_id"] is None
    harness.end(target_run)
    harness.end(source_run)
    assert harness.claim("A") is None
    view = harness.view("A", request_id)
    assert (view.request.state.value, view.request.continuation.value) == ("replied", "revoked")
    assert harness.service.runs.get(target_run).status is RunStatus.SUCCEEDED  # B's run was not touched


def test_stop_after_the_answer_was_queued_cancels_the_continuation(harness: Harness) -> None:
    _, request_id = asked_and_answered(harness)
    harness.service.collaboration.stop("A", request_id)
    assert harness.claim("A") is None
    assert harness.states("A", request_id) == ("replied", "cancelled", "revoked")


def test_stop_after_the_bot_took_the_continuation_refuses_its_start(harness: Harness) -> None:
    _, request_id = asked_and_answered(harness)
    item = harness.claim("A")
    harness.service.collaboration.stop("A", request_id)
    with pytest.raises(Conflict) as info:
        harness.start("A", item.delivery.delivery_id)
    assert info.value.details["reason"] == "stopped"
    assert harness.service.run_repo.running_in_session("A") == []


def test_stop_after_the_continuation_started_cancels_that_run(harness: Harness) -> None:
    _, request_id = asked_and_answered(harness)
    _, continuation = harness.take("A")
    result = harness.service.collaboration.stop("A", request_id)
    assert result.cancelled_run_ids == [continuation]
    assert harness.service.runs.get(continuation).status is RunStatus.CANCELLED
    with pytest.raises(Conflict, match="has ended"):  # the bot's next tool call learns it
        harness.tool(continuation, "contact_session", {"target": "B", "message": "more"})
    assert harness.states("A", request_id) == ("replied", "settled", "revoked")


def test_stop_while_the_continuation_is_starting_cancels_the_run_it_creates(harness: Harness) -> None:
    """The stop lands between the start guard and the run's commit (the `starting` window)."""
    _, request_id = asked_and_answered(harness)
    item = harness.claim("A")
    stopper: list[threading.Thread] = []

    def stop_in_the_window(tx, run) -> None:  # runs inside the run-insert transaction, after ours
        if run.delivery_id != item.delivery.delivery_id:
            return
        thread = threading.Thread(target=harness.service.collaboration.stop, args=("A", request_id))
        thread.start()
        stopper.append(thread)
        deadline = time.monotonic() + 10
        while harness.view("A", request_id).deliveries[-1].state.value != "cancelled":
            assert time.monotonic() < deadline
            time.sleep(0.005)

    harness.service.runs.start_guards.append(stop_in_the_window)
    run = harness.start("A", item.delivery.delivery_id)
    stopper[0].join(timeout=10)
    assert harness.service.runs.get(run).status is RunStatus.CANCELLED  # never left running
    assert harness.states("A", request_id) == ("replied", "cancelled", "revoked")


def test_stop_and_continuation_racing_never_leave_a_continuation_running(harness: Harness) -> None:
    harness.session("A")
    for i in range(20):
        target = harness.session(f"B{i}")
        source_run = harness.user_run("A")
        request_id = harness.contact(source_run, target)
        _, target_run = harness.take(target)
        harness.reply(target_run, request_id)
        harness.end(target_run)
        harness.end(source_run)
        item = harness.claim("A")
        barrier = threading.Barrier(2)
        started: list[str] = []

        def start() -> None:
            barrier.wait()
            try:
                started.append(harness.start("A", item.delivery.delivery_id))
            except Conflict:
                pass

        def stop() -> None:
            barrier.wait()
            time.sleep(0.0005 * (i % 4))  # vary who wins
            harness.service.collaboration.stop("A", request_id)

        threads = [threading.Thread(target=start), threading.Thread(target=stop)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert harness.service.run_repo.running_in_session("A") == [], f"round {i}"
        for run_id in started:
            assert harness.service.runs.get(run_id).status is RunStatus.CANCELLED
        assert harness.view("A", request_id).request.continuation.value == "revoked"


def test_stopping_one_request_leaves_the_others_merged_with_it(harness: Harness) -> None:
    for sid in ("A", "B1", "B2", "B3", "B4"):
        harness.session(sid)
    source_run = harness.user_run("A")
    ids = {t: harness.contact(source_run, t) for t in ("B1", "B2", "B3", "B4")}
    for t in ("B1", "B2"):
        _, run = harness.take(t)
        harness.reply(run, ids[t], message=f"from {t}")
        harness.end(run)
    harness.service.collaboration.stop("A", ids["B1"])  # pending and merged with B2's answer
    harness.end(source_run)
    item = harness.claim("A")
    assert [m.body for m in item.messages] == ["from B2"]
    harness.end(harness.start("A", item.delivery.delivery_id))
    for t in ("B3", "B4"):
        _, run = harness.take(t)
        harness.reply(run, ids[t], message=f"from {t}")
        harness.end(run)
    claimed = harness.claim("A")  # the bot holds B3+B4 when B3 is stopped
    assert [m.body for m in claimed.messages] == ["from B3", "from B4"]
    harness.service.collaboration.stop("A", ids["B3"])
    with pytest.raises(Conflict):
        harness.start("A", claimed.delivery.delivery_id)
    again = harness.claim("A")
    assert [m.body for m in again.messages] == ["from B4"]  # B4's answer is not lost


def test_only_the_source_session_can_stop(harness: Harness) -> None:
    harness.session("A"), harness.session("B")
    request_id = harness.contact(harness.user_run("A"), "B")
    with pytest.raises(NotFound):
        harness.service.collaboration.stop("B", request_id)


def test_a_deleted_session_fails_what_waits_for_it(harness: Harness) -> None:
    for sid in ("A", "B", "C"):
        harness.session(sid)
    to_b = harness.contact(harness.user_run("A"), "B")
    from_b = harness.contact(harness.user_run("B"), "C")
    harness.service.sessions.delete("B", actor="test")  # its cleanup step ends B's mailbox entries
    view = harness.view("A", to_b)
    assert (view.request.state.value, view.request.reason, view.deliveries[0].state.value) == (
        "failed", "target_deleted", "cancelled")
    view = harness.view("C", from_b)
    assert (view.request.state.value, view.request.reason, view.request.continuation.value) == (
        "failed", "source_deleted", "revoked")
    assert harness.claim("C") is None
