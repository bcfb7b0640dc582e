"""Host-side copies of what a user's sandbox produced are charged to that user: outgoing
deliveries (outbox/), recorded tool results (state/) and transfers in flight. Past the user's
budget (ORCH_USER_HOST_COPIES_MB), or below the host watermark, they are refused with words a
model can act on, and the disk they take stays bounded. The attacks are a sandbox's own: a big
file sent again and again, a big result recorded under ever new tool_call_ids."""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.quotas.host_copies import HostCopies, HostCopyRefused, HostCopyUsage, host_copy_problem
from tests.orchestrator.quotas.test_watermark import small_data_fs  # noqa: F401 - a fixture
from tests.orchestrator.quotas.world import QuotaWorld, quota_settings, traversable_data_dir

MIB = 1024 * 1024
ALICE, BOB = 41, 42
BUDGET_MB = 8


@pytest.fixture
def world() -> Iterator[QuotaWorld]:
    w = QuotaWorld(quota_settings(traversable_data_dir(), disk_quota="off", user_host_copies_mb=BUDGET_MB))
    try:
        yield w
    finally:
        w.close()


def outbox_files(world: QuotaWorld) -> dict[str, int]:
    root = world.service.layout.outbox_root
    return {p.name: os.lstat(p).st_size for p in root.iterdir()} if root.exists() else {}


def recorded_bytes(world: QuotaWorld) -> int:
    with sqlite3.connect(world.service.layout.state_db) as db:
        return db.execute("SELECT COALESCE(SUM(length(CAST(body AS BLOB))), 0) FROM tool_call_results").fetchone()[0]


def keyed_call(world: QuotaWorld, user: int, name: str, tool_call_id: str, **arguments: object) -> dict:
    response = world.client.post(
        f"/v1/runs/{world.run_of(user)}/tools/{name}", json={"arguments": arguments, "tool_call_id": tool_call_id}
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_repeated_send_file_is_refused_past_the_budget_and_the_outbox_stays_bounded(world: QuotaWorld) -> None:
    world.shell(ALICE, "head -c 3145728 /dev/urandom > big.bin")
    answers = [world.tool(ALICE, "send_file", path_or_url="big.bin") for _ in range(5)]
    assert [a["ok"] for a in answers] == [True, True, False, False, False], answers
    # the third passed the budget mid-stream (6 of 8 MiB used, 3 more coming): aborted, removed
    for refused in answers[2:]:
        error = refused["error"]
        assert error["code"] == "no_space", error
        assert "ORCH_USER_HOST_COPIES_MB" in error["message"] and "expire" in error["message"], error
        assert "Nothing was sent" in error["message"], error
    sent = {a["result"]["delivery_id"] for a in answers[:2]}
    assert set(outbox_files(world)) == sent  # no spool left behind
    assert sum(outbox_files(world).values()) <= BUDGET_MB * MIB
    shown = world.user_disk(ALICE)["host_copies"]  # what the operator sees
    assert shown == {"deliveries": 2 * 3145728, "results": 0, "transfers": 0, "bytes_used": 2 * 3145728,
                     "bytes_limit": BUDGET_MB * MIB}  # fmt: skip
    # another user's sends still work
    world.shell(BOB, "head -c 3145728 /dev/urandom > big.bin")
    assert world.tool(BOB, "send_file", path_or_url="big.bin")["ok"]
    # the bot posted and deleted one: its bytes are free again
    deleted = world.client.delete(f"/v1/deliveries/{answers[0]['result']['delivery_id']}")
    assert deleted.status_code == 200, deleted.text
    assert world.tool(ALICE, "send_file", path_or_url="big.bin")["ok"]


def test_recorded_results_are_bounded_by_the_same_budget(world: QuotaWorld) -> None:
    world.shell(ALICE, "head -c 614400 /dev/urandom > r.bin")  # 600 KiB: about 800 KB of base64
    live = [keyed_call(world, ALICE, "read_bytes", f"c{i}", path="r.bin") for i in range(16)]
    assert all(a["ok"] for a in live), [a.get("error") for a in live]  # every caller got its result
    assert recorded_bytes(world) <= BUDGET_MB * MIB
    first = keyed_call(world, ALICE, "read_bytes", "c0", path="r.bin")
    assert first["ok"] and first["result"]["size"] == 614400  # kept while the budget had room
    last = keyed_call(world, ALICE, "read_bytes", "c15", path="r.bin")
    assert not last["ok"] and last["error"]["code"] == "result_not_kept", last
    assert "ORCH_USER_HOST_COPIES_MB" in last["error"]["message"], last
    # another user's results are still kept
    world.shell(BOB, "head -c 614400 /dev/urandom > r.bin")
    keyed_call(world, BOB, "read_bytes", "b0", path="r.bin")
    assert keyed_call(world, BOB, "read_bytes", "b0", path="r.bin")["ok"]


def test_a_large_read_bytes_is_refused_before_its_spool_would_pass_the_budget(world: QuotaWorld) -> None:
    world.shell(ALICE, "head -c 3145728 /dev/urandom > big.bin")
    assert world.tool(ALICE, "send_file", path_or_url="big.bin")["ok"]
    assert world.tool(ALICE, "send_file", path_or_url="big.bin")["ok"]
    read = world.tool(ALICE, "read_bytes", path="big.bin")  # 3 MiB: spooled on the host on its way
    assert not read["ok"] and read["error"]["code"] == "no_space", read
    assert world.service.host_copies.usage(ALICE).transfers == 0  # its charge went back
    world.shell(BOB, "head -c 3145728 /dev/urandom > big.bin")
    assert world.tool(BOB, "read_bytes", path="big.bin")["ok"]
    assert world.service.host_copies.usage(BOB).transfers == 0


def test_the_budget_is_rebuilt_from_disk_at_start(world: QuotaWorld) -> None:
    world.shell(ALICE, "head -c 3145728 /dev/urandom > big.bin")
    assert world.tool(ALICE, "send_file", path_or_url="big.bin")["ok"]
    assert world.tool(ALICE, "send_file", path_or_url="big.bin")["ok"]
    world.restart()
    assert world.service.host_copies.usage(ALICE).deliveries == 2 * 3145728
    world.shell(ALICE, "head -c 3145728 /dev/urandom > big.bin")  # a new session: a new working directory
    refused = world.tool(ALICE, "send_file", path_or_url="big.bin")
    assert not refused["ok"] and refused["error"]["code"] == "no_space", refused


def test_below_the_watermark_these_copies_are_refused_too(
    small_data_fs: Path,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = QuotaWorld(quota_settings(small_data_fs, disk_quota="off", min_free_disk_pct=10))
    try:
        world.shell(ALICE, "head -c 65536 /dev/urandom > small.bin")  # deploys the agent
        filler = small_data_fs.parent / "filler"
        st = os.statvfs(small_data_fs)
        with open(filler, "wb") as f:  # someone else's bytes, until 5% is left free
            f.write(b"\0" * ((st.f_bavail - st.f_blocks // 20) * st.f_frsize))
        with caplog.at_level(logging.ERROR, logger="orchestrator.quotas.service"):
            sent = world.tool(ALICE, "send_file", path_or_url="small.bin")
        assert not sent["ok"] and sent["error"]["code"] == "host_disk_low", sent
        assert "ORCH_MIN_FREE_DISK_PCT=10%" in sent["error"]["message"], sent
        assert outbox_files(world) == {}
        assert any("host disk watermark" in r.getMessage() for r in caplog.records)
        live = keyed_call(world, ALICE, "read_bytes", "w1", path="small.bin")
        assert live["ok"], live  # the call runs; its result is not copied onto the full disk
        repeat = keyed_call(world, ALICE, "read_bytes", "w1", path="small.bin")
        assert not repeat["ok"] and repeat["error"]["code"] == "result_not_kept", repeat
        assert "ORCH_MIN_FREE_DISK_PCT" in repeat["error"]["message"], repeat
        filler.unlink()
        assert world.tool(ALICE, "send_file", path_or_url="small.bin")["ok"]
    finally:
        world.close()


# --- the pure decider and the counters --------------------------------------------------


def test_host_copy_problem_names_what_is_full() -> None:
    assert host_copy_problem(HostCopyUsage(deliveries=MIB), adding=MIB, budget=4 * MIB) is None
    problem = host_copy_problem(HostCopyUsage(deliveries=3 * MIB, results=MIB // 2), adding=MIB, budget=4 * MIB)
    assert problem is not None and "3.5 of 4.0 MiB" in problem and "deliveries 3.0 MiB" in problem


def test_charges_are_per_user_and_released() -> None:
    copies = HostCopies(budget_bytes=4 * MIB, watermark=lambda: None)
    copies.charge(ALICE, "deliveries", 3 * MIB)
    with pytest.raises(HostCopyRefused) as refused:
        copies.charge(ALICE, "transfers", 2 * MIB)
    assert refused.value.code == "no_space" and copies.usage(ALICE).transfers == 0
    copies.charge(BOB, "transfers", 2 * MIB)
    copies.release(ALICE, "deliveries", 3 * MIB)
    copies.charge(ALICE, "transfers", 2 * MIB)
    assert copies.usage(ALICE).total == 2 * MIB and copies.usage(BOB).total == 2 * MIB
