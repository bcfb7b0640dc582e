"""Crashes as real process kills (before/after commit, after claim, after
start-before-link, after reply-before-notify).

`orchestrator serve` runs as a subprocess with ORCH_CRASH_AT naming a crash point; it kills
itself with SIGKILL there, in the middle of a real HTTP request. A second server on the same
data directory must then show nothing replayed, and the uncertain as uncertain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import API_TOKEN, KEPT_ENV
from tests.live_server import free_port
from tests.orchestrator.test_cli import wait_for_health

pytestmark = pytest.mark.slow


@contextmanager
def server(data_dir: Path, crash_at: str | None = None) -> Iterator[tuple[httpx.Client, subprocess.Popen]]:
    port = free_port()
    # The uid block stays, like in conftest: parallel test runs each claim their own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_") or k in KEPT_ENV}
    env.update(ORCH_DATA_DIR=str(data_dir), ORCH_API_TOKEN=API_TOKEN, ORCH_BACKEND="process")
    if crash_at:
        env["ORCH_CRASH_AT"] = crash_at
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "--log-level", "WARNING", "serve", "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_for_health(f"http://127.0.0.1:{port}/healthz", process)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {API_TOKEN}"},
                          timeout=20) as client:
            yield client, process
    finally:
        if process.poll() is None:
            process.terminate()
        process.communicate(timeout=20)


def killed_by(process: subprocess.Popen, request) -> None:
    """Send a request that hits the crash point: no answer, and the process died of SIGKILL."""
    with pytest.raises(httpx.TransportError):
        request()
    assert process.wait(timeout=20) == -signal.SIGKILL


def tool(client: httpx.Client, run_id: str, name: str, arguments: dict, call_id: str) -> httpx.Response:
    return client.post(f"/v1/runs/{run_id}/tools/{name}", json={"arguments": arguments, "tool_call_id": call_id})


def setup_sessions(client: httpx.Client) -> str:
    for sid in ("A", "B"):
        assert client.post("/v1/sessions", json={"session_id": sid, "owner_user_id": 7, "channel": "web"}).status_code == 201
    return client.post("/v1/sessions/A/runs", json={"trigger": "web"}).json()["run_id"]


def contact(client: httpx.Client, run_id: str) -> httpx.Response:
    return tool(client, run_id, "contact_session", {"target": "B", "message": "port?"}, "call-1")


def collaborations(client: httpx.Client, session_id: str = "A") -> list[dict]:
    return client.get(f"/v1/sessions/{session_id}/collaborations").json()["collaborations"]


def test_crash_before_the_request_commits_leaves_nothing_and_a_retry_creates_it_once(tmp_path: Path) -> None:
    with server(tmp_path, "collab.contact.before_commit") as (client, process):
        run_id = setup_sessions(client)
        killed_by(process, lambda: contact(client, run_id))
    with server(tmp_path) as (client, _):
        assert collaborations(client) == []  # never "sent" without a commit
        first = contact(client, run_id).json()["result"]
        again = contact(client, run_id).json()["result"]
        assert first["request_id"] == again["request_id"] and again["duplicate"] is True
        (item,) = collaborations(client)
        assert len(item["messages"]) == 1 and len(item["deliveries"]) == 1


def test_crash_after_the_request_commits_a_retry_returns_the_same_request(tmp_path: Path) -> None:
    with server(tmp_path, "collab.contact.after_commit") as (client, process):
        run_id = setup_sessions(client)
        killed_by(process, lambda: contact(client, run_id))
    with server(tmp_path) as (client, _):
        (stored,) = collaborations(client)
        assert stored["state"] == "pending"
        retried = contact(client, run_id).json()["result"]
        assert retried["request_id"] == stored["request_id"] and retried["duplicate"] is True
        (item,) = collaborations(client)
        assert len(item["messages"]) == 1 and len(item["deliveries"]) == 1
        delivery = client.get("/v1/sessions/B/inbox").json()["delivery"]  # delivered once, after the restart
        assert delivery["request_ids"] == [stored["request_id"]]


def test_crash_after_a_claim_marks_it_for_review_and_never_hands_it_out_again(tmp_path: Path) -> None:
    with server(tmp_path, "collab.claim.after_commit") as (client, process):
        run_id = setup_sessions(client)
        contact(client, run_id)
        killed_by(process, lambda: client.get("/v1/sessions/B/inbox"))
    with server(tmp_path) as (client, _):
        (item,) = collaborations(client)
        delivery = item["deliveries"][0]
        assert (item["state"], item["delivery_state"], delivery["reason"]) == ("review", "review", "claim_unconfirmed")
        assert client.get("/v1/sessions/B/inbox", params={"wait_s": 0.2}).json() == {"delivery": None}
        refused = client.post("/v1/sessions/B/runs", json={"trigger": "side_task", "delivery_id": delivery["delivery_id"]})
        assert refused.status_code == 409 and refused.json()["error"]["reason"] == "review"


def test_crash_after_the_intent_before_the_run_commits_is_uncertain(tmp_path: Path) -> None:
    with server(tmp_path, "collab.start.before_run_commit") as (client, process):
        run_id = setup_sessions(client)
        contact(client, run_id)
        delivery_id = client.get("/v1/sessions/B/inbox").json()["delivery"]["delivery_id"]
        killed_by(process, lambda: client.post("/v1/sessions/B/runs",
                                               json={"trigger": "side_task", "delivery_id": delivery_id}))
    with server(tmp_path) as (client, _):
        (item,) = collaborations(client)
        delivery = item["deliveries"][0]
        assert (item["state"], delivery["state"], delivery["reason"]) == ("review", "review", "start_uncertain")
        assert client.get(f"/v1/runs/{delivery['run_id']}").status_code == 404  # the run never committed
        again = client.post("/v1/sessions/B/runs", json={"trigger": "side_task", "delivery_id": delivery_id})
        assert again.status_code == 409


def test_crash_after_the_run_started_before_the_link_is_review_and_the_orphan_is_cancelled(tmp_path: Path) -> None:
    with server(tmp_path, "collab.start.after_run_commit") as (client, process):
        run_id = setup_sessions(client)
        contact(client, run_id)
        delivery_id = client.get("/v1/sessions/B/inbox").json()["delivery"]["delivery_id"]
        killed_by(process, lambda: client.post("/v1/sessions/B/runs",
                                               json={"trigger": "side_task", "delivery_id": delivery_id}))
    with server(tmp_path) as (client, _):
        (item,) = collaborations(client)
        delivery = item["deliveries"][0]
        assert (item["state"], delivery["state"], delivery["reason"]) == ("review", "review", "start_unconfirmed")
        orphan = client.get(f"/v1/runs/{delivery['run_id']}").json()
        assert orphan["status"] == "cancelled" and orphan["session_id"] == "B"  # the run existed; nobody knew its id
        assert client.post("/v1/sessions/B/runs",
                           json={"trigger": "side_task", "delivery_id": delivery_id}).status_code == 409
        assert client.get("/v1/sessions/B/inbox", params={"wait_s": 0.2}).json() == {"delivery": None}


def test_crash_after_the_reply_commits_before_anyone_is_told(tmp_path: Path) -> None:
    with server(tmp_path, "collab.reply.after_commit") as (client, process):
        source_run = setup_sessions(client)
        request_id = contact(client, source_run).json()["result"]["request_id"]
        client.post(f"/v1/runs/{source_run}/end", json={})
        delivery_id = client.get("/v1/sessions/B/inbox").json()["delivery"]["delivery_id"]
        target_run = client.post("/v1/sessions/B/runs", json={"trigger": "side_task", "delivery_id": delivery_id}).json()["run_id"]
        killed_by(process, lambda: tool(client, target_run, "reply_to_collaboration",
                                        {"request_id": request_id, "kind": "reply", "message": "8700"}, "r-1"))
    with server(tmp_path) as (client, _):
        (item,) = collaborations(client)
        assert (item["state"], item["continuation"]) == ("replied", "active")
        retried = tool(client, target_run, "reply_to_collaboration",
                       {"request_id": request_id, "kind": "reply", "message": "8700"}, "r-1").json()["result"]
        assert retried["duplicate"] is True  # the bot's retry finds the stored answer
        client.post(f"/v1/runs/{target_run}/end", json={})
        answer = client.get("/v1/sessions/A/inbox", params={"wait_s": 2}).json()["delivery"]  # the "notify" after restart
        assert [m["body"] for m in answer["messages"]] == ["8700"]
        (item,) = collaborations(client)
        assert len(item["messages"]) == 2 and [d["direction"] for d in item["deliveries"]] == ["work", "continuation"]


def test_a_crash_before_the_reply_commits_loses_it_cleanly(tmp_path: Path) -> None:
    with server(tmp_path, "collab.reply.before_commit") as (client, process):
        source_run = setup_sessions(client)
        request_id = contact(client, source_run).json()["result"]["request_id"]
        delivery_id = client.get("/v1/sessions/B/inbox").json()["delivery"]["delivery_id"]
        target_run = client.post("/v1/sessions/B/runs", json={"trigger": "side_task", "delivery_id": delivery_id}).json()["run_id"]
        killed_by(process, lambda: tool(client, target_run, "reply_to_collaboration",
                                        {"request_id": request_id, "kind": "reply", "message": "8700"}, "r-1"))
    with server(tmp_path) as (client, _):
        (item,) = collaborations(client)
        assert (item["state"], [m["kind"] for m in item["messages"]]) == ("processing", ["request"])
        ok = tool(client, target_run, "reply_to_collaboration",
                  {"request_id": request_id, "kind": "reply", "message": "8700"}, "r-1").json()["result"]
        assert ok["duplicate"] is False and ok["request_state"] == "replied"
