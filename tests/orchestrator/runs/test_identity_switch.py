"""Which identity mode applies (docs/operations.md): the newest change wins between the
configured value and an admin PUT, across restarts; `PUT {"mode": null}` returns to the
configured value; GET says which applies and where it came from."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator import audit
from orchestrator.http.app import create_app
from orchestrator.identity import IdentityMode
from orchestrator.runs.identity_switch import IdentityModeState, decide_at_start
from orchestrator.service import OrchestratorService
from tests.conftest import ADMIN_TOKEN, make_settings

EXECUTION, OWNER = IdentityMode.EXECUTION, IdentityMode.OWNER


def _state(mode: IdentityMode, source: str) -> IdentityModeState:
    return IdentityModeState(mode, source, "t", None, EXECUTION, "environment")


@pytest.mark.parametrize(
    ("configured", "recorded", "override", "mode", "clears", "records"),
    [
        (EXECUTION, None, None, EXECUTION, False, True),  # first start
        (EXECUTION, "execution", OWNER, OWNER, False, False),  # unchanged config: the admin's change stays
        (OWNER, "execution", EXECUTION, OWNER, True, True),  # config changed after the admin's: config wins
        (EXECUTION, None, OWNER, OWNER, False, True),  # nothing recorded yet: keep the latest known decision
        (OWNER, "execution", None, OWNER, False, True),
    ],
)
def test_decide_at_start(configured, recorded, override, mode, clears, records) -> None:
    decision = decide_at_start(
        _state(configured, "environment"), recorded, _state(override, "admin") if override else None
    )
    assert decision.state.mode is mode
    assert decision.clears_override is clears and decision.record_configured is records


def _mode(data_dir: Path, configured: str | None) -> dict:
    extra = {} if configured is None else {"runtime_identity": configured}
    service = OrchestratorService(make_settings(data_dir, **extra))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
            return client.get("/v1/admin/runtime-identity").json()
    finally:
        service.close()


def _put(data_dir: Path, configured: str | None, mode: str | None) -> dict:
    extra = {} if configured is None else {"runtime_identity": configured}
    service = OrchestratorService(make_settings(data_dir, **extra))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
            response = client.put("/v1/admin/runtime-identity", json={"mode": mode})
            assert response.status_code == 200, response.text
            return response.json()
    finally:
        service.close()


def test_the_documented_rollback_works_after_an_admin_change(data_dir: Path) -> None:
    # The admin switches to execution explicitly; later the operator rolls back the documented
    # way: ORCH_RUNTIME_IDENTITY=owner and a restart.
    assert _put(data_dir, None, "execution")["source"] == "admin"
    assert _mode(data_dir, None)["source"] == "admin"  # a plain restart keeps the admin's change
    rolled_back = _mode(data_dir, "owner")
    assert rolled_back["mode"] == "owner" and rolled_back["source"] == "environment"
    assert rolled_back["configured_mode"] == "owner" and rolled_back["configured_source"] == "environment"
    # The admin's change is gone for good, not merely shadowed: back to the default config.
    assert _mode(data_dir, None) | {"changed_at": None} == {
        "mode": "execution", "source": "default", "changed_at": None, "invalid_value": None,
        "configured_mode": "execution", "configured_source": "default",
    }


def test_an_admin_change_newer_than_the_config_survives_restarts(data_dir: Path) -> None:
    assert _mode(data_dir, "execution")["source"] == "environment"
    _put(data_dir, "execution", "owner")
    for _ in range(2):
        state = _mode(data_dir, "execution")
        assert state["mode"] == "owner" and state["source"] == "admin"
        assert state["configured_mode"] == "execution" and state["configured_source"] == "environment"


def test_put_null_returns_to_the_configured_mode_and_is_audited(data_dir: Path) -> None:
    _put(data_dir, "owner", "execution")
    back = _put(data_dir, "owner", None)
    assert back["mode"] == "owner" and back["source"] == "environment"
    assert _mode(data_dir, "owner")["source"] == "environment"  # nothing stored any more
    service = OrchestratorService(make_settings(data_dir, runtime_identity="owner"))
    try:
        latest = audit.entries(service.store, action="runtime_identity.change")[0]
        assert latest.actor == "admin" and latest.detail["reset"] is True
        assert latest.detail["from"] == "execution" and latest.detail["to"] == "owner"
    finally:
        service.close()


def test_put_needs_the_mode_key(client: TestClient) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert client.put("/v1/admin/runtime-identity", json={}, headers=headers).status_code == 422


def test_a_settings_file_edit_is_ignored_while_the_environment_sets_the_mode(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings_file = tmp_path / "orchestrator.env"
    settings_file.write_text("ORCH_RUNTIME_IDENTITY=execution\n")
    monkeypatch.setenv("ORCH_RUNTIME_IDENTITY", "execution")
    service = OrchestratorService(make_settings(data_dir, settings_file=settings_file, runtime_identity="execution"))
    try:
        settings_file.write_text("ORCH_RUNTIME_IDENTITY=owner\n")
        state = service.switch.reload_settings_file()
        assert state.mode is EXECUTION and state.source == "environment"
    finally:
        service.close()
