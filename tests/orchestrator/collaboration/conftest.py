"""Helpers for the collaboration tests: real services over real SQLite files, driven the way
the HTTP API drives them (tool calls through the dispatcher, runs through RunService)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.collaboration.coordinator import InboxItem, RequestView
from orchestrator.runs.records import RunStatus
from orchestrator.runs.service import StartRun
from orchestrator.identity import Trigger
from orchestrator.service import OrchestratorService
from orchestrator.sessions.service import NewSession


@dataclass
class Harness:
    service: OrchestratorService

    def session(self, session_id: str, owner: int = 7, project: str | None = None) -> str:
        self.service.sessions.create(
            NewSession(owner_user_id=owner, channel="web", session_id=session_id, project_id=project), actor="test"
        )
        return session_id

    def user_run(self, session_id: str, trigger: str = "web", speaker: int | None = None) -> str:
        context = self.service.runs.start(
            session_id, StartRun(trigger=Trigger(trigger), speaker_user_id=speaker), actor="test"
        )
        return context.run.run_id

    def tool(self, run_id: str, name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
        return self.service.dispatcher.dispatch(run_id, name, arguments, tool_call_id=call_id, actor="test").body()

    def contact(self, run_id: str, target: str, message: str = "please help", call_id: str | None = None) -> str:
        body = self.tool(run_id, "contact_session", {"target": target, "message": message}, call_id)
        assert body["ok"], body
        return body["result"]["request_id"]

    def reply(self, run_id: str, request_id: str, kind: str = "reply", message: str = "done",
              call_id: str | None = None) -> dict[str, Any]:
        return self.tool(run_id, "reply_to_collaboration", {"request_id": request_id, "kind": kind, "message": message}, call_id)

    def claim(self, session_id: str) -> InboxItem | None:
        return self.service.collaboration.claim_next(session_id)

    def start(self, session_id: str, delivery_id: str, trigger: str = "side_task") -> str:
        context = self.service.runs.start(
            session_id, StartRun(trigger=Trigger(trigger), delivery_id=delivery_id), actor="test"
        )
        return context.run.run_id

    def take(self, session_id: str) -> tuple[InboxItem, str]:
        """What a bot does: claim the next delivery and start its run."""
        item = self.claim(session_id)
        assert item is not None, f"nothing in the inbox of {session_id}"
        return item, self.start(session_id, item.delivery.delivery_id)

    def end(self, run_id: str, status: str = "succeeded") -> None:
        self.service.runs.end(run_id, RunStatus(status), actor="test")

    def view(self, session_id: str, request_id: str) -> RequestView:
        return self.service.collaboration.get(session_id, request_id)

    def states(self, session_id: str, request_id: str) -> tuple[str, str | None, str]:
        view = self.view(session_id, request_id)
        state = view.delivery_state.value if view.delivery_state else None
        return view.request.state.value, state, view.request.continuation.value


@pytest.fixture
def harness(service: OrchestratorService) -> Harness:
    return Harness(service)


@pytest.fixture
def make_harness(data_dir):
    """A harness over a service with some settings changed (limits, timeouts)."""
    from tests.conftest import make_settings

    made: list[OrchestratorService] = []

    def make(**overrides: Any) -> Harness:
        service = OrchestratorService(make_settings(data_dir, **overrides))
        made.append(service)
        return Harness(service)

    yield make
    for service in made:
        service.close()


@pytest.fixture
def live_url(service: OrchestratorService):
    """The app served by uvicorn on a real loopback socket, in a thread of this process."""
    import socket
    import threading
    import time

    import uvicorn

    from orchestrator.http.app import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
