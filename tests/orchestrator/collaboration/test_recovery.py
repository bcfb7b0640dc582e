"""After a restart, or when a claim expires: uncertain starts are marked for review and never
replayed. Restarts here reopen the same data directory in a new service; the
real process kills are in test_crashes.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.errors import Conflict
from orchestrator.runs.records import RunStatus
from orchestrator.service import OrchestratorService
from tests.conftest import make_settings
from tests.orchestrator.collaboration.conftest import Harness


def restart(h: Harness, data_dir: Path) -> Harness:
    h.service.close()
    return Harness(OrchestratorService(make_settings(data_dir)))


@pytest.fixture
def asked(harness: Harness) -> tuple[Harness, str]:
    harness.session("A"), harness.session("B")
    source_run = harness.user_run("A")
    request_id = harness.contact(source_run, "B")
    harness.end(source_run)
    return harness, request_id


def test_waiting_deliveries_survive_a_restart(asked, data_dir: Path) -> None:
    h, request_id = asked
    h = restart(h, data_dir)
    try:
        item, run = h.take("B")
        assert item.requests.keys() == {request_id}
    finally:
        h.service.close()


def test_a_claim_open_at_restart_is_marked_for_review_and_never_handed_out_again(asked, data_dir: Path) -> None:
    h, request_id = asked
    item = h.claim("B")
    h = restart(h, data_dir)
    try:
        view = h.view("A", request_id)
        assert (view.request.state.value, view.deliveries[0].state.value, view.deliveries[0].reason) == (
            "review", "review", "claim_unconfirmed")
        assert h.claim("B") is None
        with pytest.raises(Conflict) as info:
            h.start("B", item.delivery.delivery_id)
        assert info.value.details["reason"] == "review"
        assert h.service.run_repo.running_in_session("B") == []
        assert h.reply(h.user_run("B"), request_id)["error"]["code"] == "request_closed"  # shown as uncertain
    finally:
        h.service.close()


def test_a_run_started_but_never_linked_is_review_and_its_orphan_run_is_cancelled(asked, data_dir: Path) -> None:
    """The crash window after the run committed and before the link (start-before-link)."""
    h, request_id = asked
    h.service.runs.start_listeners.remove(h.service.collaboration.run_started)  # the process "dies" here
    item, run = h.take("B")
    assert h.view("A", request_id).deliveries[0].state.value == "starting"
    h = restart(h, data_dir)
    try:
        delivery = h.view("A", request_id).deliveries[0]
        assert (delivery.state.value, delivery.reason, delivery.run_id) == ("review", "start_unconfirmed", run)
        assert h.view("A", request_id).request.state.value == "review"
        assert h.service.runs.get(run).status is RunStatus.CANCELLED  # nobody was told its id
        with pytest.raises(Conflict):
            h.start("B", item.delivery.delivery_id)
    finally:
        h.service.close()


def test_a_linked_run_that_ended_while_nobody_listened_is_settled(asked, data_dir: Path) -> None:
    h, request_id = asked
    _, run = h.take("B")
    h.service.runs.end_listeners.remove(h.service.collaboration.run_ended)
    h.end(run)
    h = restart(h, data_dir)
    try:
        view = h.view("A", request_id)
        assert (view.request.state.value, view.request.reason, view.deliveries[0].state.value) == (
            "failed", "no_result", "settled")
    finally:
        h.service.close()


def test_a_linked_run_still_running_at_restart_stays_linked(asked, data_dir: Path) -> None:
    h, request_id = asked
    _, run = h.take("B")
    h = restart(h, data_dir)
    try:
        assert h.states("A", request_id) == ("processing", "linked", "active")
        h.reply(run, request_id, message="after the restart")
        h.end(run)
        assert h.claim("A").messages[0].body == "after the restart"
    finally:
        h.service.close()


def test_an_answer_claimed_at_restart_is_review_but_the_answer_stays(harness: Harness, data_dir: Path) -> None:
    harness.session("A"), harness.session("B")
    source_run = harness.user_run("A")
    request_id = harness.contact(source_run, "B")
    _, target_run = harness.take("B")
    harness.reply(target_run, request_id, message="42")
    harness.end(target_run)
    harness.end(source_run)
    harness.claim("A")
    h = restart(harness, data_dir)
    try:
        assert h.states("A", request_id) == ("replied", "review", "active")
        assert h.claim("A") is None
        assert h.view("A", request_id).messages[-1].body == "42"
    finally:
        h.service.close()


def test_an_expired_claim_is_review_not_a_retry(make_harness) -> None:
    h = make_harness(collaboration_claim_timeout_s=0.2)
    h.session("A"), h.session("B")
    request_id = h.contact(h.user_run("A"), "B")
    item = h.claim("B")
    time.sleep(0.3)
    with pytest.raises(Conflict) as info:
        h.start("B", item.delivery.delivery_id)
    assert info.value.details["reason"] == "review"
    assert h.states("A", request_id) == ("review", "review", "active")
    assert h.view("A", request_id).deliveries[0].reason == "claim_expired"
    assert h.claim("B") is None


def test_an_expired_claim_found_by_the_next_poll_unblocks_the_queue(make_harness) -> None:
    h = make_harness(collaboration_claim_timeout_s=0.2)
    for sid in ("A", "B"):
        h.session(sid)
    run = h.user_run("A")
    first, second = h.contact(run, "B", "1"), h.contact(run, "B", "2")
    h.claim("B")
    assert h.claim("B") is None
    time.sleep(0.3)
    item = h.claim("B")
    assert item.requests.keys() == {second}
    assert h.states("A", first)[0] == "review"
