"""A server with disk quotas for a test module: one data dir, one service, its client and the
calls the quota tests make; closing it unmounts everything of ours and checks that no loop
device of ours is left."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.quotas.mountinfo import read_mounts
from orchestrator.quotas.volumes import LoopVolumes
from orchestrator.service import OrchestratorService
from orchestrator.settings import Settings
from tests.api_calls import start_run, tool
from tests.conftest import API_TOKEN, TEST_ROOT, admin_headers, make_settings


def quota_settings(data_dir: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "disk_quota": "loop",
        "user_disk_quota_mb": 16,
        "user_inode_quota": 256,
        "shared_disk_quota_mb": 16,
        "shared_inode_quota": 256,
        "min_free_disk_pct": 0,
    }
    values.update(overrides)
    return make_settings(data_dir, **values)


def our_mounts(data_dir: Path) -> list[Path]:
    return [e.mount_point for e in read_mounts() if data_dir in e.mount_point.parents]


def our_loop_devices(data_dir: Path) -> list[str]:
    """Loop devices whose backing file is below `data_dir` (what `losetup -a` lists)."""
    found = []
    for name in os.listdir("/sys/block"):
        try:
            with open(f"/sys/block/{name}/loop/backing_file", encoding="utf-8") as f:
                backing = f.read().strip()
        except OSError:
            continue
        if backing.startswith(f"{data_dir}/"):
            found.append(f"/dev/{name}: {backing}")
    return found


def release_mounts(data_dir: Path) -> None:
    """Unmount everything below `data_dir` and wait for the loop devices to be freed."""
    LoopVolumes(Settings(data_dir=data_dir).layout).unmount_all()
    assert our_mounts(data_dir) == []
    deadline = time.monotonic() + 10
    while our_loop_devices(data_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert our_loop_devices(data_dir) == []


def traversable_data_dir(under: Path = TEST_ROOT) -> Path:
    under.mkdir(mode=0o711, parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(dir=under, prefix="quota-"))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    return data


class QuotaWorld:
    def __init__(self, settings: Settings, *, on_close: Any = None) -> None:
        self.settings = settings
        self.data_dir = settings.data_dir
        self._on_close = on_close
        self.service = OrchestratorService(settings)
        self.client = TestClient(create_app(self.service), headers={"Authorization": f"Bearer {API_TOKEN}"})
        self.client.__enter__()
        self._runs: dict[int, str] = {}

    def restart(self, **overrides: object) -> None:
        """Stop the server (its mounts stay) and start a new one on the same data dir."""
        self.client.__exit__(None, None, None)
        self.service.close()
        self.settings = self.settings.model_copy(update=overrides)
        self.service = OrchestratorService(self.settings)
        self.client = TestClient(create_app(self.service), headers={"Authorization": f"Bearer {API_TOKEN}"})
        self.client.__enter__()
        self._runs.clear()

    def run_of(self, user_id: int) -> str:
        if user_id not in self._runs:
            session = self.client.post("/v1/sessions", json={"owner_user_id": user_id, "channel": "web"})
            assert session.status_code == 201, session.text
            self._runs[user_id] = start_run(self.client, session.json()["session_id"], trigger="web")["run_id"]
        return self._runs[user_id]

    def tool(self, user_id: int, name: str, **arguments: object) -> dict:
        return tool(self.client, self.run_of(user_id), name, **arguments)

    def shell(self, user_id: int, command: str) -> dict:
        answer = self.tool(user_id, "shell", command=command, timeout_s=60)
        assert answer["ok"], answer
        return answer["result"]

    def user_disk(self, user_id: int) -> dict:
        response = self.client.get(f"/v1/admin/users/{user_id}/disk", headers=admin_headers())
        assert response.status_code == 200, response.text
        return response.json()

    def close(self) -> None:
        try:
            self.client.__exit__(None, None, None)
            self.service.close()
            if self._on_close is not None:
                self._on_close(self.data_dir)
        finally:
            release_mounts(self.data_dir)
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)
