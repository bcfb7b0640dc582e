"""`/metrics` with a real agent: the admin token only, Prometheus text that prometheus_client's
own parser reads, and counters that move with the calls made."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from orchestrator import metrics
from tests.agent_env import agent_client, agent_data_dir, agent_service, traversable_tmp  # noqa: F401 - fixtures
from tests.api_calls import group_session, start_run, tool
from tests.metrics_text import sample_value, scrape


def test_metrics_need_the_admin_token(agent_client: TestClient) -> None:
    assert agent_client.get("/metrics").status_code == 403  # the bot token is not enough
    assert agent_client.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_metrics_parse_and_move_with_calls(agent_client: TestClient) -> None:
    run = start_run(agent_client, group_session(agent_client), trigger="web")["run_id"]
    tool(agent_client, run, "write_file", path="m.txt", content="x")
    before = scrape(agent_client)
    for _ in range(3):
        assert tool(agent_client, run, "read_file", path="m.txt")["ok"]
    assert not tool(agent_client, run, "read_file", path="missing.txt")["ok"]
    tool(agent_client, run, "send_file", path_or_url="m.txt")
    after = scrape(agent_client)
    ok = ("orchestrator_tool_calls_total", {"tool": "read_file", "backend": "process", "outcome": "ok"})
    assert sample_value(after, ok[0], **ok[1]) == sample_value(before, ok[0], **ok[1]) + 3
    missing = {"tool": "read_file", "backend": "process", "outcome": "not_found"}
    assert sample_value(after, "orchestrator_tool_calls_total", **missing) == sample_value(before, "orchestrator_tool_calls_total", **missing) + 1
    count = "orchestrator_tool_call_seconds_count"
    assert sample_value(after, count, tool="read_file", backend="process") == sample_value(before, count, tool="read_file", backend="process") + 4
    host = {"tool": "send_file", "backend": "host", "outcome": "ok"}
    assert sample_value(after, "orchestrator_tool_calls_total", **host) == sample_value(before, "orchestrator_tool_calls_total", **host) + 1
    assert sample_value(after, "orchestrator_sandboxes", backend="process", state="running") == 1
    assert sample_value(after, "orchestrator_sandbox_starts_total", backend="process", kind="cold") >= 1
    assert sample_value(after, "orchestrator_audit_write_seconds_count") > sample_value(before, "orchestrator_audit_write_seconds_count")
    assert sample_value(after, "orchestrator_state_write_seconds_count") > sample_value(before, "orchestrator_state_write_seconds_count")
    assert sample_value(after, "orchestrator_calls_in_flight", user="other") == 0


def test_the_disk_usage_seam_and_the_bounded_labels(agent_client: TestClient) -> None:
    metrics.register_disk_usage(lambda: [metrics.VolumeUsage("user-17", 5 << 20, 1 << 30, 12, 100_000)])
    try:
        samples = scrape(agent_client)
    finally:
        metrics.register_disk_usage(None)
    assert sample_value(samples, "orchestrator_disk_used_bytes", volume="user-17") == 5 << 20
    assert sample_value(samples, "orchestrator_disk_quota_inodes", volume="user-17") == 100_000
    # A lying agent cannot mint label values without end.
    assert metrics.outcome_label("Not A Code\n") == "other"
    assert metrics.top_users([(5, 1), (9, 3), (2, 3), (4, 0)], 2) == ([("2", 3), ("9", 3)], 1)


def test_disk_usage_per_volume_shows_on_metrics_with_the_scan_quota() -> None:
    from tests.orchestrator.quotas.world import QuotaWorld, quota_settings, traversable_data_dir

    settings = quota_settings(
        traversable_data_dir(), disk_quota="scan", user_disk_quota_mb=8, user_inode_quota=500, disk_scan_interval_s=0.5,
    )  # fmt: skip
    world = QuotaWorld(settings)
    try:
        world.shell(33, "head -c 3000000 /dev/urandom > some")
        deadline = time.monotonic() + 10
        while True:
            samples = scrape(world.client)
            used = sample_value(samples, "orchestrator_disk_used_bytes", volume="user-33")
            if used >= 3_000_000 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert used >= 3_000_000
        assert world.user_disk(33)["usage"]["bytes_used"] >= 3_000_000  # the admin route agrees
        assert sample_value(samples, "orchestrator_disk_quota_bytes", volume="user-33") == 8 * 1024 * 1024
        assert sample_value(samples, "orchestrator_disk_quota_inodes", volume="user-33") == 500
    finally:
        world.close()
