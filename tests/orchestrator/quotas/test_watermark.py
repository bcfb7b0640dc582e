"""The host watermark: with the data filesystem nearly full (a real small filesystem, filled),
a new sandbox start and a host write are refused with a clear error and an error log line."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import API_TOKEN, TEST_ROOT, admin_headers
from tests.orchestrator.quotas.world import QuotaWorld, quota_settings


@pytest.fixture
def small_data_fs() -> Iterator[Path]:
    """A 256 MiB tmpfs as the data filesystem (root only: mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small data filesystem needs root")
    base = TEST_ROOT / f"watermark-{os.getpid()}"
    base.mkdir(mode=0o711, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=0711", "tmpfs", str(base)], check=True)
    try:
        data = base / "data"
        data.mkdir()
        yield data
    finally:
        subprocess.run(["umount", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_a_nearly_full_data_filesystem_refuses_a_new_sandbox_and_host_writes(
    small_data_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    world = QuotaWorld(quota_settings(small_data_fs, disk_quota="off", min_free_disk_pct=10))
    try:
        assert world.tool(41, "write_file", path="a.txt", content="before")["ok"]  # deploys the agent
        run_id = world.run_of(42)
        filler = small_data_fs.parent / "filler"
        st = os.statvfs(small_data_fs)
        with open(filler, "wb") as f:  # someone else's bytes, until 5% is left free
            f.write(b"\0" * ((st.f_bavail - st.f_blocks // 20) * st.f_frsize))
        assert world.client.get("/healthz", headers=admin_headers()).json()["disk_quota"]["watermark_problem"]
        with caplog.at_level(logging.ERROR, logger="orchestrator.quotas.service"):
            answer = world.tool(42, "write_file", path="a.txt", content="hello")
        assert not answer["ok"], answer
        assert answer["error"]["code"] == "host_disk_low", answer
        assert "ORCH_MIN_FREE_DISK_PCT=10%" in answer["error"]["message"]
        assert any("host disk watermark" in r.getMessage() for r in caplog.records)
        assert {s.user_id for s in world.service.sandboxes.status()} == {41}  # 42's was not started
        upload = world.client.put(
            f"/v1/runs/{run_id}/files/incoming/x.txt", content=b"data", headers={"Authorization": f"Bearer {API_TOKEN}"}
        )
        assert upload.status_code == 507 and upload.json()["error"]["code"] == "host_disk_low", upload.text
        filler.unlink()
        assert world.tool(42, "write_file", path="a.txt", content="hello")["ok"]
    finally:
        world.close()
