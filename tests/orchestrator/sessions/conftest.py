"""Fixtures for session storage, isolation, deletion and cross-session reading tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.sessions.chat_store import ChatKey
from orchestrator.service import OrchestratorService

GROUP = {"channel": "feishu", "chat_id": "oc_team"}


@dataclass
class SessionsApi:
    """The HTTP calls these tests make, spelled once."""

    client: TestClient
    service: OrchestratorService

    def create(
        self,
        session_id: str,
        owner: int = 17,
        *,
        project: str | None = None,
        group: dict | None = None,
        title: str | None = None,
    ) -> dict:
        body: dict[str, Any] = {"session_id": session_id, "owner_user_id": owner, "channel": "web"}
        if project is not None:
            body["project_id"] = project
        if group is not None:
            body.update(group=group, channel="feishu_group")
        if title is not None:
            body["title"] = title
        response = self.client.post("/v1/sessions", json=body)
        assert response.status_code == 201, response.text
        return response.json()

    def say(self, session_id: str, *texts: str, acting: int | None = None, role: str = "user", **extra: Any):
        messages = [{"role": role, "content": text, **extra} for text in texts]
        return self.client.post(f"/v1/sessions/{session_id}/messages", json={"messages": messages}, headers=_acting(acting))

    def patch(self, session_id: str, acting: int | None = None, **flags: Any):
        return self.client.patch(f"/v1/sessions/{session_id}", json=flags, headers=_acting(acting))

    def delete(self, session_id: str, acting: int | None = None):
        return self.client.delete(f"/v1/sessions/{session_id}", headers=_acting(acting))

    def run(self, session_id: str, trigger: str = "web", speaker: int | None = None) -> dict:
        body: dict[str, Any] = {"trigger": trigger}
        if speaker is not None:
            body["speaker_user_id"] = speaker
        response = self.client.post(f"/v1/sessions/{session_id}/runs", json=body)
        assert response.status_code == 201, response.text
        return response.json()

    def tool(self, run: dict, name: str, **arguments: Any) -> dict:
        response = self.client.post(f"/v1/runs/{run['run_id']}/tools/{name}", json={"arguments": arguments})
        assert response.status_code == 200, response.text
        return response.json()

    def gate(self, project: str, on: bool) -> None:
        response = self.client.put(f"/v1/projects/{project}/settings", json={"cross_session_read": on})
        assert response.status_code == 200, response.text

    def chat_dir(self, session_id: str) -> Path:
        record = self.service.session_repo.get_any(session_id)
        assert record is not None
        return Path(self.service.chat.chat_dir(ChatKey.of(record)))


def _acting(acting: int | None) -> dict[str, str]:
    return {} if acting is None else {"X-Acting-User": str(acting)}


@pytest.fixture
def api(client: TestClient, service: OrchestratorService) -> SessionsApi:
    return SessionsApi(client, service)


@contextmanager
def trapped(chat_dir: Path, bait: Path) -> Iterator[None]:
    """Make a chat directory impossible to read without an error surfacing.

    The real directory is made unreadable (mode 000; enough for an unprivileged process)
    and moved aside, and a symlink to `bait` takes its place (enough for root too: opening
    it is refused with an error). The bait must stay untouched.
    """
    aside = chat_dir.with_name("chat.aside")
    chat_dir.rename(aside)
    os.chmod(aside, 0)
    bait.mkdir(exist_ok=True)
    chat_dir.symlink_to(bait, target_is_directory=True)
    try:
        yield
    finally:
        chat_dir.unlink()
        os.chmod(aside, 0o700)
        aside.rename(chat_dir)
        shutil.rmtree(bait)
