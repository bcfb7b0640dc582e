"""Streamed answers hold descriptors for as long as they run (the bot's connection and the
call into the sandbox): one user's streams stop at its share of the streams pool, with a 429
that says so and a `code`, and neither another user's streams nor /healthz are held back. A
real server on a loopback port, real process-backend agents."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.descriptors.process_limit import descriptor_limit
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import ADMIN_TOKEN, API_TOKEN, TEST_ROOT, make_settings
from tests.live_server import live_server

AS_ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(not AS_ROOT, reason="agents run as their own uids only as root")

SSE = {"Accept": "text/event-stream"}
BOT = {"Authorization": f"Bearer {API_TOKEN}"}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    base = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="streams-"))
    os.chmod(base, 0o711)
    (base / "data").mkdir()
    # 1,000 descriptors past the reserve; streams get 1 % of them: a pool of 10, 4 a user
    # (two streams of 2 each).
    settings = make_settings(base / "data", fd_reserve=descriptor_limit() - 1000, fd_streams_pct=1, fd_user_pct=40)
    service = OrchestratorService(settings)
    try:
        with live_server(create_app(service)) as base_url:
            yield base_url
    finally:
        service.close()
        shutil.rmtree(base, ignore_errors=True)


def _run(url: str, user_id: int) -> str:
    session = httpx.post(f"{url}/v1/sessions", json={"owner_user_id": user_id, "channel": "web"}, headers=BOT, timeout=30)
    assert session.status_code == 201, session.text
    run = httpx.post(f"{url}/v1/sessions/{session.json()['session_id']}/runs", json={"trigger": "web"}, headers=BOT, timeout=60)
    assert run.status_code == 201, run.text
    return run.json()["run_id"]


def _stream(url: str, run_id: str, command: str) -> tuple[int, str]:
    with httpx.stream(
        "POST", f"{url}/v1/runs/{run_id}/tools/shell", json={"arguments": {"command": command}},
        headers={**BOT, **SSE}, timeout=60,
    ) as response:  # fmt: skip
        return response.status_code, response.read().decode()


def _mcp_stream(url: str, run_id: str) -> httpx.Response:
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "list_dir", "arguments": {}, "_meta": {"progressToken": "p1"}}}  # fmt: skip
    headers = {**BOT, "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    return httpx.post(f"{url}/v1/runs/{run_id}/mcp", json=call, headers=headers, timeout=60)


def _streams_in_use(url: str, count: int) -> None:
    """Wait until the streams pool holds `count` descriptors (the admin's /healthz)."""
    deadline = time.monotonic() + 30
    while True:
        health = httpx.get(f"{url}/healthz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5).json()
        if health["descriptors"]["pools"]["streams"]["in_use"] == count:
            return
        assert time.monotonic() < deadline, health
        time.sleep(0.05)


def test_one_users_streams_stop_at_its_share_and_others_stream_on(url: str) -> None:
    hoarder, other = _run(url, 41), _run(url, 42)
    assert _stream(url, hoarder, "true")[0] == 200  # the sandbox is up
    held: list[tuple[int, str]] = []
    # Each holds its stream until the test is done with them (a file it writes last).
    hold = "echo held; for _ in $(seq 600); do [ -e released ] && break; sleep 0.05; done"
    streams = [threading.Thread(target=lambda: held.append(_stream(url, hoarder, hold))) for _ in range(2)]
    for thread in streams:
        thread.start()
    _streams_in_use(url, 4)  # both are streaming now
    third = httpx.post(
        f"{url}/v1/runs/{hoarder}/tools/shell", json={"arguments": {"command": "echo third"}}, headers={**BOT, **SSE}, timeout=30
    )
    assert third.status_code == 429, third.text
    error = third.json()["error"]
    assert error["code"] == "descriptor_share_exceeded" and error["feature"] == "streams", error
    assert "holds 4 of its 4 server descriptors for streams" in error["message"]
    mcp = _mcp_stream(url, hoarder)  # an MCP request answered as a stream: the same share
    assert mcp.status_code == 429 and mcp.json()["error"]["code"] == "descriptor_share_exceeded", mcp.text
    assert httpx.post(f"{url}/v1/runs/{hoarder}/tools/shell", json={"arguments": {"command": "echo plain"}},
                      headers=BOT, timeout=30).json()["ok"]  # a plain answer holds nothing: still served  # fmt: skip
    status, events = _stream(url, other, "echo other")
    assert status == 200 and "event: result" in events and "other" in events
    health = httpx.get(f"{url}/healthz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5).json()
    streams_pool = health["descriptors"]["pools"]["streams"]
    assert streams_pool["in_use"] == 4 and streams_pool["top_users"] == [{"user_id": 41, "in_use": 4}], health
    released = httpx.post(f"{url}/v1/runs/{hoarder}/tools/write_file", json={"arguments": {"path": "released", "content": ""}},
                          headers=BOT, timeout=30).json()  # fmt: skip
    assert released["ok"], released
    for thread in streams:
        thread.join(30)
    assert [s for s, _ in held] == [200, 200] and all("event: result" in e for _, e in held), held
    # Given back when they ended: the user streams again, and MCP streams too.
    status, events = _stream(url, hoarder, "echo again")
    assert status == 200 and "again" in events
    assert _mcp_stream(url, hoarder).status_code == 200
    health = httpx.get(f"{url}/healthz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5).json()
    assert health["descriptors"]["pools"]["streams"]["in_use"] == 0, health
    assert health["descriptors"]["refused"] == {"streams:descriptor_share_exceeded": 2}, health


def test_healthz_tells_the_budget_to_the_admin_only(url: str) -> None:
    public = httpx.get(f"{url}/healthz", timeout=5).json()
    assert "descriptors" not in public and set(public) == {"status", "version", "runtime_identity", "runtime_identity_source"}
    admin = httpx.get(f"{url}/healthz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5).json()["descriptors"]
    assert admin["limit"] == descriptor_limit() and admin["reserve"] == descriptor_limit() - 1000
    assert admin["pools"]["egress"]["size"] == 600 and admin["pools"]["egress"]["user_share"] == 240
    assert admin["pools"]["streams"]["size"] == 10 and admin["pools"]["streams"]["user_share"] == 4
    assert 0 < admin["open"] < admin["limit"]
