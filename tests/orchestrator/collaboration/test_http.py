"""The collaboration endpoints: the inbox, the list, stop, and a whole loop
between two chat bots through the HTTP API.

The chat bots are the one simulated part: there is no chat platform here, so
`SimulatedChatBot` plays a bot's role (long-poll the inbox, start the run with the delivery id,
let its scripted agent call tools, end the run). Everything it talks to is real: uvicorn on a
loopback socket, the orchestrator, its SQLite files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.conftest import API_TOKEN, admin_headers

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


def call_tool(client: httpx.Client | TestClient, run_id: str, name: str, arguments: dict, call_id: str) -> dict:
    response = client.post(f"/v1/runs/{run_id}/tools/{name}", json={"arguments": arguments, "tool_call_id": call_id})
    assert response.status_code == 200, response.text
    return response.json()


@dataclass
class BotTurn:
    client: httpx.Client
    run_id: str
    delivery: dict[str, Any]

    def tool(self, name: str, arguments: dict, call_id: str) -> dict:
        return call_tool(self.client, self.run_id, name, arguments, call_id)


@dataclass
class SimulatedChatBot:
    """FAKE: stands in for a Feishu/DingTalk bot serving one session (see the module docstring)."""

    base_url: str
    session_id: str
    agent: Callable[[BotTurn], None]
    handled: list[dict] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._loop, name=f"bot-{self.session_id}", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        with httpx.Client(base_url=self.base_url, headers=AUTH, timeout=30) as client:
            while not self._stop.is_set():
                try:
                    inbox = client.get(f"/v1/sessions/{self.session_id}/inbox", params={"wait_s": 1})
                    assert inbox.status_code == 200, inbox.text
                    delivery = inbox.json()["delivery"]
                    if delivery is None:
                        continue
                    started = client.post(
                        f"/v1/sessions/{self.session_id}/runs",
                        json={"trigger": "side_task", "delivery_id": delivery["delivery_id"]},
                    )
                    assert started.status_code == 201, started.text
                    run_id = started.json()["run_id"]
                    self.agent(BotTurn(client, run_id, delivery))
                    ended = client.post(f"/v1/runs/{run_id}/end", json={"status": "succeeded"})
                    assert ended.status_code == 200, ended.text
                    self.handled.append(delivery)
                except BaseException as exc:  # reported by the test
                    self.errors.append(exc)
                    return


def wait_until(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_two_bots_collaborate_through_their_inboxes(live_url: str) -> None:
    client = httpx.Client(base_url=live_url, headers=AUTH, timeout=30)
    for sid, project in (("ops", "infra"), ("dev", "app")):  # cross-project: allowed by default
        assert client.post("/v1/sessions", json={"session_id": sid, "owner_user_id": 7, "channel": "feishu_private",
                                                 "project_id": project}).status_code == 201

    def ops_agent(turn: BotTurn) -> None:  # the asked session
        message = turn.delivery["messages"][-1]
        (request_id,) = turn.delivery["request_ids"]
        assert turn.delivery["direction"] == "work" and "not from the user of this session" in turn.delivery["context"]
        if message["kind"] == "request":
            turn.tool("reply_to_collaboration", {"request_id": request_id, "kind": "progress", "message": "looking"}, "p1")
            turn.tool("reply_to_collaboration", {"request_id": request_id, "kind": "clarification",
                                                 "message": "Which environment?"}, "c1")
        else:
            assert message["kind"] == "supplement" and message["body"] == "production"
            turn.tool("reply_to_collaboration", {"request_id": request_id, "kind": "reply",
                                                 "message": "8700 in production"}, "r1")

    answers: list[str] = []

    def dev_agent(turn: BotTurn) -> None:  # the asking session, continued by answers
        assert turn.delivery["direction"] == "continuation"
        for message in turn.delivery["messages"]:
            if message["kind"] == "clarification":
                turn.tool("reply_to_collaboration", {"request_id": message["request_id"], "kind": "supplement",
                                                     "message": "production"}, "s1")
            else:
                answers.append(message["body"])

    bots = [SimulatedChatBot(live_url, "ops", ops_agent), SimulatedChatBot(live_url, "dev", dev_agent)]
    for bot in bots:
        bot.start()
    try:
        # a user asks dev something; dev's agent asks ops and ends its run without waiting
        run = client.post("/v1/sessions/dev/runs", json={"trigger": "private_message", "speaker_user_id": 7}).json()
        contacted = call_tool(client, run["run_id"], "contact_session",
                              {"target": "ops", "message": "What port does the service listen on?"}, "t1")
        request_id = contacted["result"]["request_id"]
        client.post(f"/v1/runs/{run['run_id']}/end", json={"status": "succeeded"})
        # done when dev's bot has ended the run that received the answer
        wait_until(lambda: (answers and len(bots[1].handled) == 2) or any(b.errors for b in bots))
    finally:
        for bot in bots:
            bot.stop()
    assert [b.errors for b in bots] == [[], []]
    assert answers == ["8700 in production"]
    listed = client.get("/v1/sessions/dev/collaborations").json()["collaborations"]
    (item,) = listed
    assert (item["request_id"], item["role"], item["state"], item["continuation"]) == (
        request_id, "outgoing", "replied", "active")
    assert [m["kind"] for m in item["messages"]] == ["request", "progress", "clarification", "supplement", "reply"]
    assert [(d["session_id"], d["direction"], d["state"]) for d in item["deliveries"]] == [
        ("ops", "work", "settled"), ("dev", "continuation", "settled"),
        ("ops", "work", "settled"), ("dev", "continuation", "settled"),
    ]
    incoming = client.get("/v1/sessions/ops/collaborations").json()["collaborations"][0]
    assert incoming["role"] == "incoming" and incoming["request_id"] == request_id
    client.close()


def test_the_inbox_long_poll_wakes_when_a_request_arrives(live_url: str) -> None:
    client = httpx.Client(base_url=live_url, headers=AUTH, timeout=30)
    for sid in ("A", "B"):
        client.post("/v1/sessions", json={"session_id": sid, "owner_user_id": 7, "channel": "web"})
    run = client.post("/v1/sessions/A/runs", json={"trigger": "web"}).json()["run_id"]
    result: dict = {}

    def poll() -> None:
        started = time.monotonic()
        with httpx.Client(base_url=live_url, headers=AUTH, timeout=30) as poller:
            result["body"] = poller.get("/v1/sessions/B/inbox", params={"wait_s": 20}).json()
        result["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.5)
    call_tool(client, run, "contact_session", {"target": "B", "message": "hi"}, "c")
    thread.join(timeout=30)
    assert result["body"]["delivery"]["messages"][0]["body"] == "hi"
    assert result["seconds"] < 5  # woken by the request, not by the 20 s timeout
    started = time.monotonic()
    assert client.get("/v1/sessions/B/inbox", params={"wait_s": 0.3}).json() == {"delivery": None}
    assert 0.25 < time.monotonic() - started < 5
    client.close()


@pytest.fixture
def two_sessions(client: TestClient) -> str:
    for sid in ("A", "B"):
        client.post("/v1/sessions", json={"session_id": sid, "owner_user_id": 7, "channel": "web"})
    return client.post("/v1/sessions/A/runs", json={"trigger": "web"}).json()["run_id"]


def test_inbox_validation(client: TestClient, two_sessions: str) -> None:
    response = client.get("/v1/sessions/B/inbox", params={"wait_s": 31})
    assert response.status_code == 422 and response.json()["error"]["field"] == "wait_s"
    assert client.get("/v1/sessions/B/inbox", params={"wait_s": -1}).status_code == 422
    assert client.get("/v1/sessions/nobody/inbox").status_code == 404
    assert client.get("/v1/sessions/B/inbox", headers={"X-Acting-User": "8"}).status_code == 404  # not theirs
    assert client.get("/v1/sessions/B/inbox", headers={"Authorization": "Bearer wrong"}).status_code == 401
    # an encoded slash is decoded before routing: no route has a session id with a slash in it
    assert client.get("/v1/sessions/..%2F/inbox").status_code == 404


def test_tools_are_listed_with_their_schemas(client: TestClient) -> None:
    tools = {t["name"]: t for t in client.get("/v1/tools").json()["tools"]}
    contact, reply = tools["contact_session"], tools["reply_to_collaboration"]
    assert contact["place"] == "host" and contact["acts_as"] == "owner"
    assert set(contact["parameters"]["properties"]) == {"target", "message"}
    assert contact["parameters"]["additionalProperties"] is False
    assert set(reply["parameters"]["properties"]["kind"]["enum"]) == {"progress", "clarification", "supplement", "reply"}


def test_run_start_with_a_delivery_id(client: TestClient, two_sessions: str) -> None:
    response = client.post("/v1/sessions/B/runs", json={"trigger": "side_task", "delivery_id": "cd-" + "0" * 24})
    assert response.status_code == 404 and response.json()["error"]["field"] == "delivery_id"
    call_tool(client, two_sessions, "contact_session", {"target": "B", "message": "hi"}, "c")
    delivery_id = client.get("/v1/sessions/A/collaborations").json()["collaborations"][0]["deliveries"][0]["delivery_id"]
    response = client.post("/v1/sessions/B/runs", json={"trigger": "side_task", "delivery_id": delivery_id})
    assert response.status_code == 409 and response.json()["error"]["reason"] == "not_claimed"
    assert client.get("/v1/sessions/B/inbox").json()["delivery"]["delivery_id"] == delivery_id
    response = client.post("/v1/sessions/B/runs", json={"trigger": "side_task", "delivery_id": delivery_id})
    assert response.status_code == 201
    again = client.post("/v1/sessions/B/runs", json={"trigger": "side_task", "delivery_id": delivery_id})
    assert again.status_code == 409 and again.json()["error"]["run_id"] == response.json()["run_id"]


def test_list_pages_detail_and_stop(client: TestClient, two_sessions: str) -> None:
    ids = [call_tool(client, two_sessions, "contact_session", {"target": "B", "message": f"m{i}"}, f"c{i}")["result"]["request_id"]
           for i in range(5)]
    seen, before = [], None
    while True:
        params = {"limit": 2, **({"before": before} if before else {})}
        page = client.get("/v1/sessions/A/collaborations", params=params).json()
        seen += [c["request_id"] for c in page["collaborations"]]
        before = page["next_before"]
        if before is None:
            break
    assert seen == ids[::-1]  # newest first, each once
    assert client.get("/v1/sessions/A/collaborations", params={"limit": 101}).status_code == 422
    detail = client.get(f"/v1/sessions/B/collaborations/{ids[0]}").json()
    assert detail["role"] == "incoming" and detail["messages"][0]["body"] == "m0"
    client.post("/v1/sessions", json={"session_id": "C", "owner_user_id": 7, "channel": "web"})
    assert client.get(f"/v1/sessions/C/collaborations/{ids[0]}").status_code == 404  # not a participant
    assert client.get("/v1/sessions/A/collaborations/not-an-id").status_code == 422
    # stop: the source's owner only
    assert client.post(f"/v1/sessions/A/collaborations/{ids[0]}/stop", headers={"X-Acting-User": "8"}).status_code == 404
    assert client.post(f"/v1/sessions/B/collaborations/{ids[0]}/stop").status_code == 404
    stopped = client.post(f"/v1/sessions/A/collaborations/{ids[0]}/stop", headers={"X-Acting-User": "7"}).json()
    assert stopped["collaboration"]["state"] == "revoked" and stopped["collaboration"]["continuation"] == "revoked"
    assert stopped["cancelled_run_ids"] == []
    (entry,) = client.get("/v1/admin/audit", params={"action": "collaboration.stop"}, headers=admin_headers()).json()["entries"]
    assert (entry["session_id"], entry["detail"]["request_id"], entry["actor"]) == ("A", ids[0], "bot")
    assert client.get("/v1/sessions/B/inbox").json()["delivery"]["request_ids"] == [ids[1]]  # the stopped one is skipped
