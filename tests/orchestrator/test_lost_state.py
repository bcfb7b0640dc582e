"""Item 12 of the hostile-tenant issue: a lost state DB must not start as a fresh install.

With the DB deleted or truncated, the server used to start empty and hand the first new group
the gid of an existing group's workspace: its member then read the old group's secret. Now the
service refuses to start on a data dir with content but no DB, and the gid allocator never
hands out a gid that a group directory on disk already carries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mounts.layout import GroupRef
from orchestrator.users.group_gids import GidRange, GroupGids
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.startup_checks import StartupRefused
from orchestrator.state_schema import STATE_MIGRATIONS
from orchestrator.state_store import StateStore
from orchestrator.users.repository import UserRepository
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures
from tests.api_calls import tool
from tests.conftest import API_TOKEN, make_settings
from tests.live_server import free_port

AS_ROOT = os.geteuid() == 0
TEAM, NEW = GroupRef("feishu", "oc_team"), GroupRef("feishu", "oc_new")


def service_with_a_group_secret(data_dir: Path) -> Path:
    """Owner 17's team workspace holds a secret; returns the DB path after a clean stop."""
    service = OrchestratorService(make_settings(data_dir))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            body = {"owner_user_id": 17, "channel": "feishu_group", "group": {"channel": "feishu", "chat_id": "oc_team"}}
            sid = client.post("/v1/sessions", json=body).json()["session_id"]
            run = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": 17})
            team_dir = service.layout.group_dir(TEAM)
            answer = tool(client, run.json()["run_id"], "shell", command=f"echo secret > {team_dir}/secret.txt")
            assert answer["ok"] and answer["result"]["exit_code"] == 0, answer
        return service.layout.state_db
    finally:
        service.close()


def serve(data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "serve", "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.skipif(not AS_ROOT, reason="group gids need a root orchestrator")
@pytest.mark.parametrize("loss", ["deleted", "truncated"])
def test_item12_a_lost_state_db_refuses_to_start(agent_data_dir: Path, loss: str) -> None:
    db = service_with_a_group_secret(agent_data_dir)
    if loss == "deleted":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    else:
        db.write_bytes(b"")
    with pytest.raises(StartupRefused, match="orchestrator.sqlite3"):
        OrchestratorService(make_settings(agent_data_dir))
    result = serve(agent_data_dir)
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.startswith("orchestrator serve:")]
    assert len(lines) == 1 and str(db) in lines[0] and "restore" in lines[0], result.stderr
    assert not db.exists() or db.stat().st_size == 0  # nothing was created in its place


def test_item12_the_gid_allocator_skips_gids_found_on_disk(tmp_path: Path) -> None:
    groups_root = tmp_path / "data" / "groups"
    old = groups_root / "feishu" / "oc_team"
    old.mkdir(parents=True)
    gid_range = GidRange(2_000_000_000, 10)
    if AS_ROOT:
        os.chown(old, 0, gid_range.first)
    else:
        gid_range = GidRange(os.stat(old).st_gid, 10)  # our own group stands in for it
    store = StateStore(tmp_path / "state.sqlite3", STATE_MIGRATIONS)  # a fresh DB: it knows no group
    store.open()
    with store.write() as tx:
        UserRepository.add_group_member(tx, NEW, 67)
    gids = GroupGids(store, gid_range, groups_root=groups_root)
    assert gids.memberships_of(67) == {NEW: gid_range.first + 1}
    store.close()


def test_a_fresh_data_dir_still_starts(data_dir: Path) -> None:
    (data_dir / "skills").mkdir()  # operator-provided skills are not user state
    service = OrchestratorService(make_settings(data_dir))  # no StartupRefused
    try:
        assert service.store.schema_version() == len(STATE_MIGRATIONS)  # a new database, fully migrated
    finally:
        service.close()
