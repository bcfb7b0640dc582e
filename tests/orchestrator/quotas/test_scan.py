"""The fallback where loop images cannot be used: a periodic usage scan (forced here with
ORCH_DISK_QUOTA=scan) stops an over-quota user's sandbox within its interval and refuses its
writes until it is under again; the scan follows no link a sandbox planted and its cost is
bounded by the inode quota. share/ is measured per member too: one member past its share of it
is stopped, its writes there refused, and an admin frees its files."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import pytest

from mounts.layout import GroupRef
from orchestrator.quotas.model import group_volume
from orchestrator.quotas.scan import scan_usage
from tests.api_calls import tool
from tests.conftest import admin_headers
from tests.orchestrator.quotas.world import QuotaWorld, quota_settings, traversable_data_dir
from tests.orchestrator.sandboxes.test_group_workspaces import group_session, shell, speak

OVER, PLANTER = 31, 32
HOG, NEIGHBOUR = 41, 42
TEAM = GroupRef("feishu", "oc_shared_space")
INTERVAL_S = 1.0


@pytest.fixture(scope="module")
def world() -> Iterator[QuotaWorld]:
    settings = quota_settings(
        traversable_data_dir(), disk_quota="scan", user_disk_quota_mb=8, user_inode_quota=500,
        disk_scan_interval_s=INTERVAL_S,
    )  # fmt: skip
    world = QuotaWorld(settings)
    try:
        yield world
    finally:
        world.close()


def running_users(world: QuotaWorld) -> set[int]:
    return {s.user_id for s in world.service.sandboxes.status()}


def over_share(world: QuotaWorld) -> dict[str, list[int]]:
    return world.client.get("/healthz", headers=admin_headers()).json()["disk_quota"].get("over_share", {})


def test_the_scan_stops_an_over_quota_sandbox_within_its_interval_and_refuses_writes_until_under(world: QuotaWorld) -> None:
    health = world.client.get("/healthz", headers=admin_headers()).json()["disk_quota"]
    assert health["mechanism"] == "scan"
    world.shell(OVER, "echo kept > note.txt")
    assert OVER in running_users(world)  # before it goes over: a scan may stop it right after
    world.shell(OVER, "head -c 9500000 /dev/urandom > big")
    written = time.monotonic()
    # The decision is the scan's and comes within its interval (plus one round's own time);
    # the stop it triggers takes what a stop takes on this host, which is not what is tested.
    deadline = written + 2 * INTERVAL_S + 5
    while not world.client.get("/healthz", headers=admin_headers()).json()["disk_quota"]["over_quota_users"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert world.client.get("/healthz", headers=admin_headers()).json()["disk_quota"]["over_quota_users"] == [OVER]
    assert time.monotonic() - written < 2 * INTERVAL_S + 5, "no scan noticed the over-quota user"
    deadline = time.monotonic() + 60
    while OVER in running_users(world) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert OVER not in running_users(world), "the over-quota sandbox kept running"

    refused = world.tool(OVER, "write_file", path="more.txt", content="x")
    assert not refused["ok"] and refused["error"]["code"] == "no_space", refused
    assert "disk quota of user 31 is exceeded" in refused["error"]["message"]
    assert "of 8.0 MiB" in refused["error"]["message"]
    upload = world.client.put(f"/v1/runs/{world.run_of(OVER)}/files/incoming/x.txt", content=b"data")
    assert upload.status_code == 507 and upload.json()["error"]["code"] == "no_space", upload.text
    usage = world.user_disk(OVER)["usage"]
    assert usage["mechanism"] == "scan" and usage["over_quota"] and usage["bytes_used"] > 9_000_000

    # Reading and the shell still work, so the user can make room; the next scan lifts it.
    read = world.tool(OVER, "read_file", path="note.txt")
    assert read["ok"] is True and "kept" in read["result"]["content"], read
    world.shell(OVER, "rm big")
    deadline = time.monotonic() + 2 * INTERVAL_S + 2
    while world.client.get("/healthz", headers=admin_headers()).json()["disk_quota"]["over_quota_users"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert world.tool(OVER, "write_file", path="more.txt", content="x")["ok"]


def test_a_member_past_its_share_of_share_is_stopped_refused_there_and_freed_by_an_admin(world: QuotaWorld) -> None:
    # share/ has no image in scan mode: it was not scanned at all, so one member could fill the
    # data filesystem through it, counted on no one's quota.
    share = world.service.layout.share_dir
    world.shell(NEIGHBOUR, f"head -c 100000 /dev/urandom > {share}/neighbour.bin")
    world.shell(HOG, f"head -c 6000000 /dev/urandom > {share}/hog.bin")  # past 25 % of 16 MiB
    written = time.monotonic()
    # The decision is the round's and comes within its interval; the stop it triggers takes what
    # a stop takes on this host.
    deadline = written + 2 * INTERVAL_S + 5
    while not over_share(world) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert over_share(world) == {"share": [HOG]}, "no round noticed the member over its share"
    deadline = time.monotonic() + 60
    while HOG in running_users(world) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert HOG not in running_users(world), "the member over its share kept running"

    refused = world.tool(HOG, "write_file", path=f"{share}/more.bin", content="x")
    assert not refused["ok"] and refused["error"]["code"] == "no_space", refused
    # what it holds when the round noticed (the stop may cut the write short), past the share
    held = re.search(r"your files there hold (\d+\.\d) MiB", refused["error"]["message"])
    assert held and float(held.group(1)) >= 4.0, refused
    assert "over the 4.0 MiB / 64 files one member may hold" in refused["error"]["message"], refused
    assert world.tool(HOG, "write_file", path="private.txt", content="x")["ok"]  # its own places are not affected
    assert world.tool(NEIGHBOUR, "write_file", path=f"{share}/fine.txt", content="y")["ok"]

    overview = world.client.get("/v1/admin/disk", headers=admin_headers()).json()
    assert overview["over_share"] == {"share": [HOG]}
    assert "share" in {v["volume"] for v in overview["volumes"]}  # an admin learns the shared volumes' names
    listed = world.client.get("/v1/admin/disk/volumes/share/members", headers=admin_headers())
    assert listed.status_code == 200, listed.text
    by_user = {m["user_id"]: m for m in listed.json()["members"]}
    assert by_user[HOG]["over_share"] and by_user[HOG]["bytes_used"] > 5_900_000
    assert not by_user[NEIGHBOUR]["over_share"]
    freed = world.client.delete(f"/v1/admin/disk/volumes/share/members/{HOG}", headers=admin_headers())
    assert freed.status_code == 200 and freed.json()["removed"] == 1, freed.text
    assert HOG not in {m["user_id"] for m in freed.json()["members"]}
    assert world.tool(HOG, "write_file", path=f"{share}/more.bin", content="x")["ok"]
    assert world.shell(NEIGHBOUR, f"wc -c < {share}/neighbour.bin")["stdout"].strip() == "100000"  # not the hog's


def test_a_member_past_its_share_of_a_group_workspace_is_refused_there_and_freed(world: QuotaWorld) -> None:
    client = world.client
    sid = group_session(client, HOG, TEAM)
    hog_run, neighbour_run = speak(client, sid, HOG), speak(client, sid, NEIGHBOUR)
    workspace = world.service.layout.group_dir(TEAM)
    shell(client, neighbour_run, f"echo mine > {workspace}/neighbour.txt")
    shell(client, hog_run, f"mkdir {workspace}/hog && head -c 6000000 /dev/urandom > {workspace}/hog/big.bin")
    key = group_volume(world.service.layout, TEAM).key
    deadline = time.monotonic() + 2 * INTERVAL_S + 5
    while HOG not in over_share(world).get(key, []):
        assert time.monotonic() < deadline, "the member over its share of the workspace was not found"
        time.sleep(0.05)

    refused = tool(client, hog_run, "write_file", path=f"{workspace}/more.txt", content="x")
    assert not refused["ok"] and refused["error"]["code"] == "no_space", refused
    assert f"shared place ({key})" in refused["error"]["message"]
    assert tool(client, neighbour_run, "write_file", path=f"{workspace}/fine.txt", content="y")["ok"]

    freed = client.delete(f"/v1/admin/disk/volumes/{key}/members/{HOG}", headers=admin_headers())
    assert freed.status_code == 200 and freed.json()["removed"] == 2, freed.text  # big.bin, hog/
    assert sorted(os.listdir(workspace)) == ["fine.txt", "neighbour.txt"]
    assert tool(client, hog_run, "write_file", path=f"{workspace}/more.txt", content="x")["ok"]


def test_the_scan_follows_no_planted_link_and_counts_a_hard_linked_file_once(world: QuotaWorld) -> None:
    layout = world.service.layout
    victim = layout.home_dir(OVER)
    world.shell(OVER, f"head -c 3000000 /dev/urandom > {victim}/victim.bin")
    world.shell(
        PLANTER,
        f"ln -s / root-of-host; ln -s {victim} neighbour; head -c 2000000 /dev/urandom > one.bin; "
        "for i in 1 2 3 4 5; do ln one.bin link$i.bin; done",
    )
    world.service.disk_quotas.scan_round()
    usage = world.user_disk(PLANTER)["usage"]
    assert 1_900_000 < usage["bytes_used"] < 2_600_000, usage  # one 2 MB inode, neither link followed
    assert not usage["over_quota"]


def test_the_scan_cost_is_bounded_by_the_inode_quota(tmp_path) -> None:  # type: ignore[no-untyped-def]
    place = tmp_path / "place"
    place.mkdir()
    for n in range(2000):
        (place / f"f{n}").touch()
    usage = scan_usage(tmp_path, [place], volume="user-1", bytes_limit=2**30, inodes_limit=100, max_entries=101)
    assert usage.partial and usage.over_quota and usage.inodes_used <= 101


def test_limits_change_only_with_loop_images(world: QuotaWorld) -> None:
    answer = world.client.put(f"/v1/admin/users/{OVER}/disk", json={"disk_mb": 64}, headers=admin_headers())
    assert answer.status_code == 409 and "only with loop images" in answer.json()["error"]["message"]


def _scan_with_fd_limit(root: str, place: str, fd_limit: int) -> dict[str, object]:
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    script = (
        "import json, resource, sys\n"
        "from pathlib import Path\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "from orchestrator.quotas.scan import scan_usage\n"
        "u = scan_usage(Path(sys.argv[1]), [Path(sys.argv[2])], volume='user-1', bytes_limit=16 << 20, inodes_limit=100_000, max_entries=100_001)\n"
        "print(json.dumps({'bytes': u.bytes_used, 'over': u.over_quota, 'partial': u.partial}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, root, place, str(fd_limit)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_more_directories_than_descriptors_do_not_hide_usage_from_the_scan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A sandbox spreads 24 MiB over 600 directories. The walk held a descriptor for every
    # directory still to visit: past the process's descriptor limit the rest were silently
    # not walked (their bytes uncounted, the user under its 16 MiB quota), and every other
    # thread of the server met EMFILE meanwhile.
    place = tmp_path / "place"
    for n in range(600):
        (place / "wide" / f"d{n}").mkdir(parents=True)
        with open(place / "wide" / f"d{n}" / "blob", "wb") as f:
            f.write(b"x" * (40 << 10))
    usage = _scan_with_fd_limit(str(tmp_path), str(place), 128)
    assert usage["bytes"] >= 600 * (40 << 10) and usage["over"], usage


def test_a_chain_nested_past_the_walks_bound_counts_as_over_quota(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Hiding bytes below a chain deeper than the walk may hold open is not a way under quota.
    from orchestrator.quotas.scan import MAX_DEPTH

    place = tmp_path / "place"
    deep = place
    for _ in range(MAX_DEPTH + 5):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "hidden").write_bytes(b"x" * 1024)
    usage = _scan_with_fd_limit(str(tmp_path), str(place), MAX_DEPTH + 64)
    assert usage["partial"] and usage["over"], usage
