"""No other tenant's metadata through /sys or /proc: the host's block devices (every loop
image of every instance: its backing file names data dirs, user ids and sizes) and their
write counters (a live side channel on other users' activity) are masked in a sandbox.

The test attaches a loop device of its own, as the disk quotas do, so there is something to
find; the sandbox's shell then looks everywhere the kernel publishes it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.api_calls import group_session, start_run, tool
from tests.orchestrator.quotas.conftest import loop_unavailable

pytestmark = [pytest.mark.docker, pytest.mark.slow]

LOOK = r"""for f in /sys/block/*/loop/backing_file /sys/devices/virtual/block/*/loop/backing_file \
         /sys/class/block/*/loop/backing_file /sys/dev/block/*/loop/backing_file; do
  cat "$f" 2>/dev/null
done
for f in /sys/block/*/stat /sys/class/block/*/stat /sys/dev/block/*/stat /sys/devices/virtual/block/*/stat \
         /sys/block/*/size /sys/fs/ext4/*/lifetime_write_kbytes /proc/fs/ext4/*/options /proc/fs/jbd2/*/info; do
  [ -r "$f" ] && echo "READABLE $f"
done
grep -h loop /proc/partitions /proc/diskstats 2>/dev/null | sed 's/^/LISTED /'
echo done"""


@pytest.fixture
def foreign_loop_image(docker_data_dir: Path) -> Iterator[str]:
    """A loop device backed by a file of another 'instance' (the sandbox must not see its name)."""
    why = loop_unavailable()
    if why is not None:
        pytest.skip(why)
    image = docker_data_dir.parent / "other-instance-user-4242.img"
    subprocess.run(["truncate", "-s", "8M", str(image)], check=True)
    device = subprocess.run(["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True).stdout.strip()
    try:
        yield str(image)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


def test_no_loop_backing_file_size_or_write_counter_is_visible_in_a_sandbox(
    foreign_loop_image: str, docker_client: TestClient
) -> None:
    run = start_run(docker_client, group_session(docker_client), trigger="web")
    answer = tool(docker_client, run["run_id"], "shell", command=LOOK)
    assert answer["ok"], answer
    out = answer["result"]["stdout"]
    assert out.rstrip().endswith("done"), out
    assert foreign_loop_image not in out and "other-instance" not in out, out
    assert "READABLE" not in out and "LISTED" not in out, out
