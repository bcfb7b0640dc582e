"""The complete JSON of the record-shaped answers, every field pinned: sessions, runs and their
context, chat messages, project settings and skills. Values the service makes up (timestamps,
run ids, fingerprints) are checked by form; everything else by value."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from mounts.layout import GroupRef

from orchestrator.collaboration.records import Delivery, Direction, Message, MessageKind, Side
from orchestrator.collaboration.states import DeliveryState
from orchestrator.http.collaboration_models import DeliveryStateOut, MessageOut
from orchestrator.service import OrchestratorService
from tests.conftest import admin_headers

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
SHA256 = re.compile(r"[0-9a-f]{64}$")


def _masked(value: object, key: str = "") -> object:
    """Timestamps, run ids and digests become a placeholder saying their form was right."""
    if isinstance(value, dict):
        return {k: _masked(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, key) for v in value]
    if isinstance(value, str):
        if (key.endswith("_at") or key == "at") and TIMESTAMP.match(value):
            return "<time>"
        if key == "run_id" and re.fullmatch(r"r-[0-9a-f]{24}", value):
            return "<run>"
        if SHA256.match(value) and key in ("fingerprint", "sha256", "previous_fingerprint"):
            return "<sha256>"
    return value


def test_session_and_run_json(client: TestClient, service: OrchestratorService) -> None:
    client.put("/v1/users/17", json={"display_name": "Alice"})
    client.put("/v1/users/67", json={"display_name": "Qin"})
    body = {
        "session_id": "g-1",
        "owner_user_id": 17,
        "project_id": "p-1",
        "channel": "feishu_group",
        "group": {"channel": "feishu", "chat_id": "oc_team"},
        "title": "Team",
    }
    created = client.post("/v1/sessions", json=body)
    assert created.status_code == 201
    session = {
        **body,  # every field of the request comes back as it was sent
        "owner_identity": None,  # no platform identity names user 17
        "parent_session_id": None,
        "last_runtime_user_id": None,
        "allow_cross_read": True,
        "cross_private": False,
        "archived": False,
        "pinned": False,
        "created_at": "<time>",
        "updated_at": "<time>",
    }
    assert _masked(created.json()) == session
    patched = client.patch("/v1/sessions/g-1", json={"pinned": True, "title": "Team 2"}).json()
    session = {**session, "pinned": True, "title": "Team 2"}
    assert _masked(patched) == session

    run = client.post("/v1/sessions/g-1/runs", json={"trigger": "group_message", "speaker_user_id": 67})
    assert run.status_code == 201
    context = _masked(run.json())
    section = context.pop("prompt_identity_section")
    assert "#67 Qin" in section and "#17 Alice" in section
    identities = {
        "run_id": "<run>",
        "session_id": "g-1",
        "trigger": "group_message",
        "owner_user_id": 17,
        "execution_user_id": 67,
        "runtime_user_id": 67,
        "identity_mode": "execution",
        "owner_identity": None,
        "speaker_identity": None,
    }
    assert context == {
        **identities,
        "workdir": str(service.layout.runtime_dir(67, "g-1")),
        "upload_dir": str(service.layout.uploads_dir(67)),
        "outputs_dir": str(service.layout.runtime_dir(67, "g-1") / "outputs"),
        "group_workspace": str(service.layout.group_dir(GroupRef("feishu", "oc_team"))),
        "skills": {"available": [], "failed": [], "catalog": []},
        "archive_hint_enabled": False,
        "memory_user_id": 67,
        "delegated_credentials": [],  # none granted to 67 in this session (docs/credentials.md)
        "template": {"name": "default", "source": "default", "lacking": []},
    }
    session = {**session, "last_runtime_user_id": 67}
    assert _masked(client.get("/v1/sessions/g-1").json()) == session
    assert _masked(client.get("/v1/sessions", params={"owner_user_id": 17, "project_id": "p-1"}).json()) == {
        "owner_user_id": 17,
        "project_id": "p-1",
        "sessions": [session],
    }

    run_id = run.json()["run_id"]
    record = {
        **identities,
        "status": "running",
        "started_at": "<time>",
        "ended_at": None,
    }
    assert _masked(client.get(f"/v1/runs/{run_id}").json()) == record
    ended = client.post(f"/v1/runs/{run_id}/end", json={"status": "failed"}).json()
    assert _masked(ended) == {**record, "status": "failed", "ended_at": "<time>"}


def test_message_json(client: TestClient) -> None:
    client.post("/v1/sessions", json={"session_id": "s-1", "owner_user_id": 17, "channel": "web"})
    messages = [
        {"role": "user", "content": "hi", "speaker_user_id": 17},
        {"role": "assistant", "content": "done", "tool_calls": [{"name": "shell", "status": "ok"}]},
    ]
    appended = client.post("/v1/sessions/s-1/messages", json={"messages": messages}).json()
    assert appended == {"session_id": "s-1", "appended": 2, "message_count": 2, "last_seq": 2, "transcript_turns": 1}
    assert _masked(client.get("/v1/sessions/s-1/messages").json()) == {
        "session_id": "s-1",
        "total": 2,
        "messages": [
            {"seq": 1, "at": "<time>", "role": "user", "content": "hi", "tool_calls": [], "speaker_user_id": 17},
            {
                "seq": 2,
                "at": "<time>",
                "role": "assistant",
                "content": "done",
                "tool_calls": [{"name": "shell", "status": "ok"}],
                "speaker_user_id": None,
            },
        ],
    }


def test_project_settings_json(client: TestClient) -> None:
    put = client.put("/v1/projects/p-1/settings", json={"cross_session_read": False})
    expected = {"project_id": "p-1", "cross_session_read": False, "cross_project_collaboration": True}
    assert put.json() == expected
    assert client.get("/v1/projects/p-1/settings").json() == expected


def test_skill_json(client: TestClient, service: OrchestratorService) -> None:
    files = {"SKILL.md": "# pdf\n", "bin/run.sh": {"text": "#!/bin/sh\n", "executable": True}}
    installed = client.put("/v1/admin/skills/pdf", json={"files": files}, headers=admin_headers())
    assert installed.status_code == 201, installed.text
    path = installed.json()["path"]
    summary = {
        "name": "pdf",
        "kind": "system",
        "user_id": None,
        "path": path,
        "valid": True,
        "fingerprint": "<sha256>",
        "problem": None,
        "files": 2,
        "bytes": len("# pdf\n") + len("#!/bin/sh\n"),
    }
    assert _masked(installed.json()) == {**summary, "created": True, "changed": True, "previous_fingerprint": None}
    assert _masked(client.get("/v1/admin/skills", headers=admin_headers()).json()) == {
        "skills": [summary],
        "ignored": [],
    }
    detail = _masked(client.get("/v1/admin/skills/pdf", headers=admin_headers()).json())
    assert detail == {
        **summary,
        "entries": [
            {"path": "SKILL.md", "kind": "file", "executable": False, "size": 6, "sha256": "<sha256>", "target": None},
            {"path": "bin", "kind": "dir", "executable": False, "size": 0, "sha256": None, "target": None},
            {"path": "bin/run.sh", "kind": "file", "executable": True, "size": 10, "sha256": "<sha256>", "target": None},
        ],
    }
    run = client.post("/v1/sessions", json={"session_id": "s-1", "owner_user_id": 17, "channel": "web"})
    context = client.post("/v1/sessions/s-1/runs", json={"trigger": "web"}).json()
    assert context["skills"]["available"] == ["pdf"] and context["skills"]["failed"] == []
    (entry,) = context["skills"]["catalog"]
    assert entry.keys() == {"name", "path", "kind"} and entry["name"] == "pdf"
    removed = client.delete("/v1/admin/skills/pdf", headers=admin_headers()).json()
    assert _masked(removed) == {
        "name": "pdf",
        "kind": "system",
        "user_id": None,
        "removed": True,
        "previous_fingerprint": "<sha256>",
    }
    assert run.status_code == 201 and Path(path).name == "pdf"


def test_collaboration_message_and_delivery_json() -> None:
    message = Message(
        message_id="m-1", request_id="q-1", seq=3, sender=Side.TARGET, sender_session_id="s-2",
        sender_run_id="r-9", kind=MessageKind.REPLY, body="done", op_key="k", body_hash="h", created_at="t0",
    )
    assert MessageOut.model_validate(message).model_dump(mode="json") == {
        "message_id": "m-1", "request_id": "q-1", "seq": 3, "sender": "target", "sender_session_id": "s-2",
        "kind": "reply", "body": "done", "created_at": "t0",
    }
    delivery = Delivery(
        seq=1, delivery_id="d-1", session_id="s-1", direction=Direction.CONTINUATION, request_id=None,
        scope_id="sc", state=DeliveryState.SETTLED, reason=None, version=4, run_id="r-1", claimed_at="t1",
        claim_expires_at="t2", outcome="succeeded", created_at="t0", updated_at="t3",
    )
    assert DeliveryStateOut.model_validate(delivery).model_dump(mode="json") == {
        "delivery_id": "d-1", "session_id": "s-1", "direction": "continuation", "state": "settled", "reason": None,
        "run_id": "r-1", "outcome": "succeeded", "created_at": "t0", "updated_at": "t3",
    }
