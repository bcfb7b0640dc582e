"""A shared place (share/) with loop images, seen from docker sandboxes: one member who fills it
is named in the no_space the others get (with who can free it), its own writes there past its
share are refused, and an admin lists each member's usage there and frees that member's files
without following a link the member planted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import admin_headers
from tests.orchestrator.quotas.conftest import require_loop
from tests.orchestrator.quotas.world import QuotaWorld, quota_settings, traversable_data_dir
from tests.orchestrator.sandboxes.docker.conftest import TEST_BASE, remove_containers, sandbox_image  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FILLER, OTHER = 61, 62


@pytest.fixture(scope="module")
def world(sandbox_image: str) -> Iterator[QuotaWorld]:  # noqa: F811 - the fixture imported above
    require_loop()
    settings = quota_settings(
        traversable_data_dir(TEST_BASE), backend="docker", sandbox_image=sandbox_image, shared_member_share_pct=50
    )
    world = QuotaWorld(settings, on_close=remove_containers)
    try:
        yield world
    finally:
        world.close()


def members(world: QuotaWorld, volume: str) -> dict[int, dict]:
    response = world.client.get(f"/v1/admin/disk/volumes/{volume}/members", headers=admin_headers())
    assert response.status_code == 200, response.text
    return {m["user_id"]: m for m in response.json()["members"] if m["user_id"] is not None}


def test_one_member_filling_share_is_named_refused_and_freed_by_an_admin(world: QuotaWorld) -> None:
    share = world.service.layout.share_dir
    assert world.tool(OTHER, "write_file", path=f"{share}/other-small.txt", content="o" * 100_000)["ok"]
    # The filler plants a link to the other member's file and a directory of its own, then fills
    # the place to the last block with its shell.
    world.shell(
        FILLER,
        f"mkdir -p {share}/filler && ln -s {share}/other-small.txt {share}/filler/link-to-other && "
        f"head -c 20000000 /dev/zero > {share}/filler/big 2>/dev/null; true",
    )

    refused = world.tool(OTHER, "write_file", path=f"{share}/other.txt", content="y" * 200_000)
    assert not refused["ok"] and refused["error"]["code"] == "no_space", refused
    message = refused["error"]["message"]
    assert "delete files to free space" not in message  # the sticky directory forbids it
    assert f"user {FILLER} holds" in message, message
    assert "cannot delete" in message and "/v1/admin/disk/volumes/share/members" in message, message
    holders = {h["user_id"]: h for h in refused["error"]["holders"]}
    assert holders[FILLER]["bytes_used"] > 14 * 2**20 and holders[FILLER]["over_share"]

    # The filler is over its share: its own writes there are refused, naming its share.
    again = world.tool(FILLER, "write_file", path=f"{share}/more.txt", content="x")
    assert not again["ok"] and again["error"]["code"] == "no_space", again
    assert "your files there hold" in again["error"]["message"], again
    # The round (what the periodic task runs) stops its sandbox, once while it stays put.
    assert world.service.disk_quotas.shared_round() == [FILLER]
    assert world.service.disk_quotas.shared_round() == []
    # Its private places are not affected.
    assert world.tool(FILLER, "write_file", path="private.txt", content="x")["ok"]

    seen = members(world, "share")
    assert seen[FILLER]["bytes_used"] > 14 * 2**20 and seen[FILLER]["over_share"]
    assert 90_000 < seen[OTHER]["bytes_used"] < 200_000 and not seen[OTHER]["over_share"]

    freed = world.client.delete(f"/v1/admin/disk/volumes/share/members/{FILLER}", headers=admin_headers())
    assert freed.status_code == 200, freed.text
    assert freed.json()["removed"] >= 3  # big, the link, the directory
    # The planted link was removed as a link: the other member's file is intact.
    assert world.shell(OTHER, f"wc -c < {share}/other-small.txt")["stdout"].strip() == "100000"
    assert members(world, "share").get(FILLER, {"bytes_used": 0})["bytes_used"] == 0
    assert world.tool(OTHER, "write_file", path=f"{share}/other.txt", content="y" * 200_000)["ok"]
    assert world.tool(FILLER, "write_file", path=f"{share}/more.txt", content="x")["ok"]


def test_a_member_found_past_its_share_is_stopped_and_the_others_keep_their_room(world: QuotaWorld) -> None:
    share = world.service.layout.share_dir
    world.shell(FILLER, f"head -c 9000000 /dev/zero > {share}/filler-9mb")  # past its half of ~14.7 MiB
    assert world.service.disk_quotas.shared_round() == [FILLER]  # what the periodic round runs
    assert FILLER not in {s.user_id for s in world.service.sandboxes.status() if s.state == "running"}
    refused = world.tool(FILLER, "write_file", path=f"{share}/more.txt", content="x")
    assert not refused["ok"] and "your files there hold 8." in refused["error"]["message"], refused
    # The place is not full: the other member still writes its share there.
    assert world.tool(OTHER, "write_file", path=f"{share}/other-3mb.txt", content="z" * 3_000_000)["ok"]
    freed = world.client.delete(f"/v1/admin/disk/volumes/share/members/{FILLER}", headers=admin_headers())
    assert freed.status_code == 200 and freed.json()["removed"] == 2, freed.text  # and more.txt of the test above


def test_the_member_routes_refuse_an_unknown_volume_and_need_the_admin_token(world: QuotaWorld) -> None:
    unknown = world.client.get("/v1/admin/disk/volumes/nope/members", headers=admin_headers())
    assert unknown.status_code == 404, unknown.text
    assert world.client.get("/v1/admin/disk/volumes/share/members").status_code == 403
