"""The foundation's acceptance, through the HTTP API."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator import audit
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import ADMIN_TOKEN, admin_headers, make_settings

GROUP = {"channel": "feishu", "chat_id": "oc_team"}


def create_group_session(client: TestClient, session_id: str = "g-1", owner: int = 17) -> dict:
    response = client.post(
        "/v1/sessions",
        json={"session_id": session_id, "owner_user_id": owner, "channel": "feishu_group", "group": GROUP},
    )
    assert response.status_code == 201, response.text
    return response.json()


def start_run(client: TestClient, session_id: str, trigger: str, speaker: int | None = None) -> dict:
    body: dict = {"trigger": trigger}
    if speaker is not None:
        body["speaker_user_id"] = speaker
    response = client.post(f"/v1/sessions/{session_id}/runs", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def test_group_scenario_follows_the_speaker(client: TestClient, service: OrchestratorService) -> None:
    client.put("/v1/users/67", json={"display_name": "Qin"})
    client.put("/v1/users/17", json={"display_name": "Alice"})
    create_group_session(client)

    run = start_run(client, "g-1", "group_message", speaker=67)
    assert (run["owner_user_id"], run["execution_user_id"], run["runtime_user_id"]) == (17, 67, 67)
    assert run["identity_mode"] == "execution"
    assert run["workdir"] == str(service.layout.runtime_dir(67, "g-1"))
    assert run["upload_dir"] == str(service.layout.uploads_dir(67))
    assert run["memory_user_id"] == 67
    assert run["archive_hint_enabled"] is False
    section = run["prompt_identity_section"]
    assert "#67 Qin" in section and "#17 Alice" in section
    assert "/uploads/{uid}/{file}" in section
    assert client.get("/v1/sessions/g-1").json()["last_runtime_user_id"] == 67
    assert Path(run["workdir"]).is_dir()

    retry = start_run(client, "g-1", "retry")
    assert retry["runtime_user_id"] == 67 and retry["execution_user_id"] == 67

    scheduled = start_run(client, "g-1", "scheduled")
    assert scheduled["runtime_user_id"] == 17 and scheduled["execution_user_id"] is None
    # A group session's owner run still says whose environment it is (and no speaker: none spoke).
    owner_section = scheduled["prompt_identity_section"]
    assert "#17 Alice, the session owner" in owner_section and "This message is from" not in owner_section
    assert scheduled["archive_hint_enabled"] is True
    assert client.get("/v1/sessions/g-1").json()["last_runtime_user_id"] == 17

    # a new speaker, then a subagent spawned from the session inherits that speaker
    start_run(client, "g-1", "group_message", speaker=67)
    child = client.post(
        "/v1/sessions",
        json={"session_id": "g-1.sub", "owner_user_id": 17, "channel": "feishu_group", "group": GROUP, "parent_session_id": "g-1"},
    ).json()
    assert child["last_runtime_user_id"] == 67
    sub = start_run(client, "g-1.sub", "subagent")
    assert sub["runtime_user_id"] == 67


def test_speaking_in_a_group_joins_it(client: TestClient) -> None:
    create_group_session(client)
    start_run(client, "g-1", "group_message", speaker=67)
    groups = client.get("/v1/users/67").json()["groups"]
    assert groups == [GROUP]


def test_admin_switch_applies_to_the_next_run_and_is_audited(client: TestClient, service: OrchestratorService) -> None:
    create_group_session(client)
    assert client.put("/v1/admin/runtime-identity", json={"mode": "owner"}).status_code == 403
    response = client.put("/v1/admin/runtime-identity", json={"mode": "owner"}, headers=admin_headers())
    assert response.status_code == 200
    assert response.json()["mode"] == "owner" and response.json()["source"] == "admin"

    run = start_run(client, "g-1", "group_message", speaker=67)
    assert run["runtime_user_id"] == 17 and run["execution_user_id"] == 67
    assert run["identity_mode"] == "owner"
    assert client.get("/healthz").json()["runtime_identity"] == "owner"

    (entry,) = audit.entries(service.store, action="runtime_identity.change")
    assert entry.actor == "admin"
    assert entry.detail["from"] == "execution" and entry.detail["to"] == "owner"
    assert entry.at


def test_admin_override_survives_a_restart(settings, service: OrchestratorService) -> None:
    service.switch.set_by_admin(__import__("orchestrator.settings").settings.IdentityMode.OWNER, actor="admin")
    service.close()
    again = OrchestratorService(settings)
    try:
        assert again.switch.state().mode.value == "owner"
        assert again.switch.state().source == "admin"
    finally:
        again.close()


def test_invalid_configured_mode_falls_back_and_is_reported(data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    service = OrchestratorService(make_settings(data_dir, runtime_identity="bogus"))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
            state = client.get("/v1/admin/runtime-identity").json()
            assert state["mode"] == "execution"
            assert state["invalid_value"] == "bogus"
            assert client.get("/healthz", headers=admin_headers()).json()["runtime_identity_invalid_value"] == "bogus"
        assert any("invalid runtime identity mode" in r.getMessage() for r in caplog.records)
    finally:
        service.close()


def test_settings_file_edit_flips_the_mode_without_restart(data_dir: Path, tmp_path: Path) -> None:
    settings_file = tmp_path / "conf" / "orchestrator.env"
    settings_file.parent.mkdir()
    settings_file.write_text("ORCH_RUNTIME_IDENTITY=execution\n")
    service = OrchestratorService(make_settings(data_dir, settings_file=settings_file))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
            create_group_session(client)
            assert start_run(client, "g-1", "group_message", speaker=67)["runtime_user_id"] == 67
            settings_file.write_text("ORCH_RUNTIME_IDENTITY=owner\n")
            deadline = time.monotonic() + 10
            while client.get("/healthz").json()["runtime_identity"] != "owner":
                assert time.monotonic() < deadline, "the settings file change was not picked up"
                time.sleep(0.05)
            assert start_run(client, "g-1", "group_message", speaker=67)["runtime_user_id"] == 17
            (entry,) = audit.entries(service.store, action="runtime_identity.change")
            assert entry.actor == "settings_file" and entry.detail["to"] == "owner"
    finally:
        service.close()


def test_persistence_failure_warns_and_the_run_still_starts(
    client: TestClient, service: OrchestratorService, caplog: pytest.LogCaptureFixture
) -> None:
    create_group_session(client)
    # A real SQLite failure on exactly that write.
    with service.store.write() as tx:
        tx.execute(
            "CREATE TRIGGER fail_last_runtime BEFORE UPDATE OF last_runtime_user_id ON sessions"
            " BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
        )
    caplog.set_level(logging.WARNING)
    run = start_run(client, "g-1", "group_message", speaker=67)
    assert run["runtime_user_id"] == 67
    assert client.get("/v1/sessions/g-1").json()["last_runtime_user_id"] is None
    warning = next(r for r in caplog.records if "could not persist last_runtime_user_id" in r.getMessage())
    assert "session=g-1" in warning.getMessage() and "runtime_user=67" in warning.getMessage()


def test_run_logs_carry_the_identity_fields(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    create_group_session(client)
    run = start_run(client, "g-1", "group_message", speaker=67)
    client.post(f"/v1/runs/{run['run_id']}/end", json={"status": "succeeded"})
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("orchestrator.runs.service")]
    assert len(messages) == 2
    for message in messages:
        assert "session=g-1" in message and "owner=17" in message and "runtime_user=67" in message


def test_run_end(client: TestClient) -> None:
    create_group_session(client)
    run = start_run(client, "g-1", "group_message", speaker=67)
    ended = client.post(f"/v1/runs/{run['run_id']}/end", json={"status": "failed"})
    assert ended.status_code == 200 and ended.json()["status"] == "failed"
    assert client.post(f"/v1/runs/{run['run_id']}/end", json={}).status_code == 409
    assert client.post("/v1/runs/r-nope/end", json={}).status_code == 404
