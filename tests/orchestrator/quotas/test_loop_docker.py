"""Per-user loop images seen from docker sandboxes and from bwrap namespaces: the container's
binds of the usual layout paths are the images' filesystems, so the kernel refuses a write past
the quota inside the container too, and the file tools name the quota."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.orchestrator.quotas.conftest import require_loop
from tests.orchestrator.quotas.world import QuotaWorld, quota_settings, traversable_data_dir
from tests.orchestrator.sandboxes.docker.conftest import TEST_BASE, remove_containers, sandbox_image  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FILLER, NEIGHBOUR = 51, 52


@pytest.fixture(scope="module")
def world(sandbox_image: str) -> Iterator[QuotaWorld]:  # noqa: F811 - the fixture imported above
    require_loop()
    # Below TEST_BASE, not /tmp: the container mounts tmp/{uid} at /tmp (docker/conftest.py).
    settings = quota_settings(traversable_data_dir(TEST_BASE), backend="docker", sandbox_image=sandbox_image)
    world = QuotaWorld(settings, on_close=remove_containers)
    try:
        yield world
    finally:
        world.close()


def test_in_a_container_a_write_past_the_quota_is_no_space_naming_the_quota(world: QuotaWorld) -> None:
    seen = world.shell(FILLER, "df -k --output=size . /tmp $HOME | tail -n 3")
    sizes = [int(line) for line in seen["stdout"].split()]
    assert all(size < 17 * 1024 for size in sizes), seen  # the 16 MiB image, not the host's disk
    world.shell(FILLER, "head -c 20000000 /dev/zero > /tmp/big 2>/dev/null; true")
    answer = world.tool(FILLER, "write_file", path="more.txt", content="x" * 200_000)
    assert not answer["ok"] and answer["error"]["code"] == "no_space", answer
    assert "disk quota" in answer["error"]["message"] and "user-51" in answer["error"]["message"]
    assert world.tool(NEIGHBOUR, "write_file", path="fine.txt", content="y" * 200_000)["ok"]
    assert world.user_disk(FILLER)["usage"]["bytes_used"] > 14 * 2**20
    assert {s.backend for s in world.service.sandboxes.status()} == {"docker"}


def test_in_a_container_sends_are_bounded_by_the_host_copy_budget(world: QuotaWorld) -> None:
    """The outbox is outside the 16 MiB image: a sandbox rewriting and sending a file again and
    again is bounded by its host-copy budget instead, mid-stream."""
    world.restart(user_host_copies_mb=16)
    answers = []
    for _ in range(4):
        world.shell(NEIGHBOUR, "head -c 6000000 /dev/urandom > /tmp/out.bin")  # new bytes each time
        answers.append(world.tool(NEIGHBOUR, "send_file", path_or_url="/tmp/out.bin"))
    assert [a["ok"] for a in answers] == [True, True, False, False], answers
    assert answers[2]["error"]["code"] == "no_space" and "ORCH_USER_HOST_COPIES_MB" in answers[2]["error"]["message"]
    outbox = world.service.layout.outbox_root
    assert sum(p.stat().st_size for p in outbox.iterdir()) <= 16 * 2**20
    assert {s.backend for s in world.service.sandboxes.status()} == {"docker"}


def test_in_a_bwrap_namespace_the_quota_holds_too(world: QuotaWorld) -> None:
    world.restart(backend="process", process_sandbox="bwrap")
    try:
        world.shell(NEIGHBOUR, "head -c 20000000 /dev/zero > big 2>/dev/null; true")
        answer = world.tool(NEIGHBOUR, "write_file", path="more.txt", content="x" * 200_000)
        assert not answer["ok"] and answer["error"]["code"] == "no_space", answer
        assert "user-52" in answer["error"]["message"]
    finally:
        remove_containers(world.data_dir)
