"""Fixtures of the disk-quota tests: servers with loop images (root, real loop devices) or the
usage scan, each cleaned up so no mount and no loop device of ours outlives its test."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.quotas.loopfs import loop_problem
from orchestrator.quotas.mountinfo import read_mounts
from orchestrator.quotas.volumes import LoopVolumes
from orchestrator.service import OrchestratorService
from orchestrator.settings import Settings
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures
from tests.conftest import API_TOKEN, make_settings

AS_ROOT = os.geteuid() == 0
# CI (.ci/run) provides loop devices and e2fsprogs and sets this: then a missing one fails.
REQUIRE_LOOP = os.environ.get("ORCH_REQUIRE_LOOP") == "1"


def loop_available() -> str | None:
    if not AS_ROOT:
        return "loop images need root"
    return loop_problem()


@pytest.fixture
def need_loop() -> None:
    problem = loop_available()
    if problem is None:
        return
    if REQUIRE_LOOP:
        pytest.fail(f"ORCH_REQUIRE_LOOP=1 but {problem}", pytrace=False)
    pytest.skip(problem)


def loop_settings(data_dir: Path, **overrides: object) -> Settings:
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


def our_loop_devices(data_dir: Path) -> list[str]:
    """`losetup -a` lines whose backing file is below `data_dir`."""
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if str(data_dir) in line]


def our_mounts(data_dir: Path) -> list[Path]:
    return [e.mount_point for e in read_mounts() if data_dir in e.mount_point.parents]


@pytest.fixture
def unmount_after(agent_data_dir: Path) -> Iterator[Path]:  # noqa: F811 - the fixture above
    """Yields the data dir; afterwards unmounts everything of ours below it and checks that no
    loop device of ours is left (autoclear frees each one at its last unmount)."""
    try:
        yield agent_data_dir
    finally:
        LoopVolumes(Settings(data_dir=agent_data_dir).layout).unmount_all()
        assert our_mounts(agent_data_dir) == []
        for _ in range(50):
            if not our_loop_devices(agent_data_dir):
                break
            import time

            time.sleep(0.1)
        assert our_loop_devices(agent_data_dir) == []


@pytest.fixture
def loop_service(need_loop: None, unmount_after: Path) -> Iterator[OrchestratorService]:
    service = OrchestratorService(loop_settings(unmount_after))
    try:
        yield service
    finally:
        service.close()


@pytest.fixture
def loop_client(loop_service: OrchestratorService) -> Iterator[TestClient]:
    with TestClient(create_app(loop_service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
        yield client
