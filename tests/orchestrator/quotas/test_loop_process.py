"""Per-user loop images for real (root, real loop devices, real agents on the process
backend): the kernel refuses a write past the quota, the file tools say it is the quota and how
full, the other users write on, the admin route shows usage and grows a limit online, and a
restarted orchestrator adopts the mounts instead of mounting again."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator

import httpx
import pytest

from mounts.layout import GroupRef
from orchestrator.client import AsyncOrchestratorClient
from orchestrator.client.models import DiskOverview, UserDisk
from orchestrator.http.app import create_app
from orchestrator.quotas.loopfs import can_resize_online
from orchestrator.quotas.model import group_volume
from tests.api_calls import OWNER, group_session, start_run, tool
from orchestrator.quotas.mountinfo import read_mounts
from tests.conftest import ADMIN_TOKEN, API_TOKEN, admin_headers
from tests.orchestrator.quotas.conftest import require_loop
from tests.orchestrator.quotas.world import QuotaWorld, quota_settings, traversable_data_dir

FILLER, NEIGHBOUR, MANY_FILES = 11, 12, 13


@pytest.fixture(scope="module")
def world() -> Iterator[QuotaWorld]:
    require_loop()
    world = QuotaWorld(quota_settings(traversable_data_dir()))
    try:
        yield world
    finally:
        world.close()


def test_a_write_past_the_quota_is_no_space_naming_the_quota_and_the_neighbour_still_writes(world: QuotaWorld) -> None:
    health = world.client.get("/healthz", headers=admin_headers()).json()["disk_quota"]
    assert health["mechanism"] == "loop" and health["reason"] == "ORCH_DISK_QUOTA=loop"
    filled = world.shell(FILLER, "head -c 20000000 /dev/zero > big; echo exit=$?")
    assert "No space left on device" in filled["stderr"], filled
    answer = world.tool(FILLER, "write_file", path="more.txt", content="x" * 200_000)
    assert not answer["ok"] and answer["error"]["code"] == "no_space", answer
    message = answer["error"]["message"]
    assert "disk quota" in message and "user-11" in message and "MiB" in message and "files" in message, message
    assert answer["error"]["quota"]["volume"] == "user-11"
    assert world.tool(NEIGHBOUR, "write_file", path="fine.txt", content="y" * 200_000)["ok"]

    usage = world.user_disk(FILLER)["usage"]
    assert usage["mechanism"] == "loop" and usage["image_mb"] == 16
    assert usage["bytes_used"] > 0.9 * usage["bytes_limit"], usage
    neighbour = world.user_disk(NEIGHBOUR)["usage"]
    assert neighbour["bytes_used"] < 0.2 * neighbour["bytes_limit"]
    listed = world.client.get("/v1/admin/disk", headers=admin_headers()).json()
    assert {"user-11", "user-12", "share"} <= {v["volume"] for v in listed["volumes"]}

    # The SDK reads the same answers as typed models.
    async def through_the_client() -> tuple[DiskOverview, UserDisk]:
        transport = httpx.ASGITransport(app=create_app(world.service))
        async with AsyncOrchestratorClient(
            "http://orchestrator.test", API_TOKEN, admin_token=ADMIN_TOKEN, transport=transport
        ) as client:
            return await client.disk(), await client.get_user_disk(FILLER)

    overview, filler = asyncio.run(through_the_client())
    assert overview.mechanism == "loop" and "user-11" in {v.volume for v in overview.volumes}
    assert filler.usage is not None and filler.usage.bytes_used == usage["bytes_used"]


def test_an_online_grow_takes_effect_and_a_shrink_is_refused_with_its_reason(world: QuotaWorld) -> None:
    world.shell(FILLER, "head -c 20000000 /dev/zero > big 2>/dev/null; true")  # full, whatever ran before
    assert world.tool(FILLER, "write_file", path="after.txt", content="z" * 500_000)["error"]["code"] == "no_space"
    grown = world.client.put(f"/v1/admin/users/{FILLER}/disk", json={"disk_mb": 32}, headers=admin_headers())
    assert grown.status_code == 200, grown.text
    assert grown.json()["usage"]["image_mb"] == 32
    assert grown.json()["usage"]["bytes_limit"] > 30 * 2**20
    # Online where the host has CAP_SYS_RESOURCE; else offline, the sandbox stopped for it.
    assert grown.json()["grown_online"] is can_resize_online()
    assert world.tool(FILLER, "write_file", path="after.txt", content="z" * 500_000)["ok"]
    shrink = world.client.put(f"/v1/admin/users/{FILLER}/disk", json={"disk_mb": 16}, headers=admin_headers())
    assert shrink.status_code == 409, shrink.text
    assert shrink.json()["error"]["code"] == "quota_change_refused"
    assert "only grow online" in shrink.json()["error"]["message"]
    assert world.user_disk(FILLER)["usage"]["image_mb"] == 32
    unknown = world.client.put("/v1/admin/users/99/disk", json={"disk_mb": 64}, headers=admin_headers())
    assert unknown.status_code == 404


def test_creating_files_past_the_inode_quota_fails_the_same_way(world: QuotaWorld) -> None:
    made = world.shell(MANY_FILES, "mkdir many && cd many && i=0; while : > f$i 2>/dev/null; do i=$((i+1)); done; echo $i")
    assert int(made["stdout"].strip()) < 256
    answer = world.tool(MANY_FILES, "write_file", path="one-more.txt", content="tiny")
    assert not answer["ok"] and answer["error"]["code"] == "no_space", answer
    assert "256 of 256 files" in answer["error"]["message"], answer


def test_a_sandbox_reaches_neither_the_image_files_nor_their_mount_points(world: QuotaWorld) -> None:
    layout = world.service.layout
    image, mount_point = layout.disk_image("user-12"), layout.disk_mount("user-12")
    seen = world.shell(NEIGHBOUR, f"cat {image} >/dev/null; ls {mount_point}; ls {layout.disk_images_dir}; echo done")
    assert seen["stderr"].count("Permission denied") == 3, seen
    st = os.stat(layout.disks_dir)
    assert (st.st_uid, st.st_mode & 0o077) == (0, 0)
    # And what they see at their usual paths is the image (the same device as its mount).
    entries = {e.mount_point: e for e in read_mounts()}
    assert entries[layout.home_dir(NEIGHBOUR)].device == entries[mount_point].device
    assert entries[layout.home_dir(NEIGHBOUR)].root == "/home"


def test_the_socket_directory_is_no_way_around_the_quota(world: QuotaWorld) -> None:
    # The sandbox's socket directory is writable by it and outside its image (it must work
    # when the image is full): on the data filesystem a sandbox wrote 40 MB there past its
    # 16 MiB quota, on a disk every other user shares.
    sockets = world.service.layout.socket_dir(NEIGHBOUR)
    filled = world.shell(NEIGHBOUR, f"head -c 40000000 /dev/zero > {sockets}/fill; echo exit=$?; du -k {sockets}/fill")
    assert "No space left on device" in filled["stderr"], filled
    assert int(filled["stdout"].split("\n")[1].split()[0]) <= 64, filled
    world.shell(NEIGHBOUR, f"rm -f {sockets}/fill")
    # The agent and the egress socket still work there (one tmpfs of its own, nosuid, nodev).
    entry = next(e for e in read_mounts() if e.mount_point == sockets)
    assert entry.fstype == "tmpfs", entry
    assert world.tool(NEIGHBOUR, "write_file", path="after-sockets.txt", content="ok")["ok"]
    assert stat.S_ISSOCK(os.lstat(sockets / "egress.sock").st_mode)
    import json

    from tests.orchestrator.egress.sandbox_client import command

    answer = json.loads(world.shell(NEIGHBOUR, command("get", "nowhere.invalid/x"))["stdout"])
    assert answer["status"] == 403 and "nowhere.invalid" in answer["body"], answer  # the proxy answers there


def test_share_and_a_group_workspace_have_images_of_their_own(world: QuotaWorld) -> None:
    layout = world.service.layout
    entries = {e.mount_point: e for e in read_mounts()}
    assert entries[layout.share_dir].device == entries[layout.disk_mount("share")].device
    # A group chat's session: its new workspace gets its own image when first planned.
    sid = group_session(world.client)
    run = start_run(world.client, sid, trigger="group_message", speaker_user_id=OWNER)["run_id"]
    workspace = layout.group_dir(GroupRef("feishu", "oc_team"))
    shell = tool(world.client, run, "shell", command=f"head -c 20000000 /dev/zero > {workspace}/big 2>/dev/null; true")
    assert shell["ok"], shell
    entries = {e.mount_point: e for e in read_mounts()}
    group_key = group_volume(layout, GroupRef("feishu", "oc_team")).key
    assert entries[workspace].device == entries[layout.disk_mount(group_key)].device
    answer = tool(world.client, run, "write_file", path=f"{workspace}/more.txt", content="x" * 100_000)
    assert answer["error"]["code"] == "no_space" and group_key in answer["error"]["message"], answer
    # The group's full image takes nothing from the user's own nor from share/.
    assert tool(world.client, run, "write_file", path="mine.txt", content="x" * 100_000)["ok"]
    assert tool(world.client, run, "write_file", path=f"{layout.share_dir}/s.txt", content="x" * 100_000)["ok"]


def test_a_restarted_orchestrator_adopts_the_mounts_and_never_mounts_twice(world: QuotaWorld) -> None:
    kept = str(world.service.layout.home_dir(NEIGHBOUR) / "kept.txt")
    assert world.tool(NEIGHBOUR, "write_file", path=kept, content="still here")["ok"]
    before = [e.mount_point for e in read_mounts() if world.data_dir in e.mount_point.parents]
    world.restart()
    after = [e.mount_point for e in read_mounts() if world.data_dir in e.mount_point.parents]
    assert sorted(after) == sorted(before) and len(after) == len(set(after)), (before, after)
    assert world.tool(NEIGHBOUR, "read_file", path=kept)["result"]["content"].startswith("still here")
    assert world.user_disk(FILLER)["usage"]["image_mb"] == 32  # the grown image, as it was
