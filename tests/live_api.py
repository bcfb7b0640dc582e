"""A live server's API as the tool tests use it (tests/orchestrator/tools/): group sessions of
OWNER, runs of a speaker, tool calls that must answer 200."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from orchestrator.service import OrchestratorService
from tests.api_calls import MEMBER, OWNER


@dataclass
class LiveApi:
    url: str
    service: OrchestratorService
    http: httpx.Client
    backend: str
    default_chat: str = "oc_live"
    sessions: list[str] = field(default_factory=list)  # every session made, oldest first

    def session(self, chat: str | None = None) -> str:
        group = {"channel": "feishu", "chat_id": chat or self.default_chat}
        body = {"owner_user_id": OWNER, "channel": "feishu_group", "group": group}
        response = self.http.post("/v1/sessions", json=body)
        assert response.status_code == 201, response.text
        self.sessions.append(response.json()["session_id"])
        return self.sessions[-1]

    def run(self, session_id: str, speaker: int = MEMBER) -> str:
        body = {"trigger": "group_message", "speaker_user_id": speaker}
        response = self.http.post(f"/v1/sessions/{session_id}/runs", json=body)
        assert response.status_code == 201, response.text
        return response.json()["run_id"]

    def tool(self, run_id: str, name: str, **arguments: object) -> dict:
        response = self.http.post(f"/v1/runs/{run_id}/tools/{name}", json={"arguments": arguments}, timeout=180)
        assert response.status_code == 200, response.text
        return response.json()

    def ok(self, run_id: str, name: str, **arguments: object) -> dict:
        body = self.tool(run_id, name, **arguments)
        assert body["ok"], body
        return body["result"]
