"""A FIFO planted where the host opens a file to read it must be refused at once, never waited
on: an open(2) for reading blocks until a writer appears, and a sandbox would never write.

Each read runs in a worker thread with a short deadline. When the host does hang, the test
opens the FIFO for writing itself (which releases the blocked open), so a failure is a quick
red test instead of a stuck suite."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
from fastapi.testclient import TestClient

from orchestrator.deliveries.outbox import DeliveryStore, NewDelivery
from orchestrator.errors import Gone
from orchestrator.service import OrchestratorService
from tests.api_calls import MEMBER, group_session, start_run, tool

T = TypeVar("T")
DEADLINE_S = 5.0
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(40))


def answered_promptly(call: Callable[[], T], fifo: Path) -> T:
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(call)
        try:
            return future.result(timeout=DEADLINE_S)
        except TimeoutError:
            release = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # lets the stuck open return
            os.close(release)
            future.result(timeout=DEADLINE_S)
            pytest.fail(f"the host waited on the FIFO {fifo} for more than {DEADLINE_S}s instead of refusing it")


def test_a_sandbox_swaps_its_published_upload_for_a_fifo(agent_client: TestClient) -> None:
    """The attack as a sandbox makes it: publish, then replace the file by a FIFO of the same
    name in its own uploads dir (through its shell), then make the host read the upload."""
    sid = group_session(agent_client)
    run_id = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)["run_id"]
    assert tool(agent_client, run_id, "write_file", path="chart.txt", content="numbers\n")["ok"]
    published = tool(agent_client, run_id, "publish_artifact", path="chart.txt")
    assert published["ok"], published
    upload, url = Path(published["result"]["path"]), published["result"]["url"]
    planted = tool(agent_client, run_id, "shell", command=f"rm {upload} && mkfifo {upload} && test -p {upload}")
    assert planted["ok"] and planted["result"]["exit_code"] == 0, planted

    public = answered_promptly(lambda: agent_client.get(url), upload)
    assert public.status_code == 404 and public.json()["error"]["code"] == "not_found"
    head = answered_promptly(lambda: agent_client.head(url), upload)
    assert head.status_code == 404
    for name in ("send_file", "send_image"):
        sent = answered_promptly(lambda: tool(agent_client, run_id, name, path_or_url=url), upload)
        assert sent["ok"] is False and sent["error"]["code"] == "not_found", sent
    # ... and the same FIFO by its path: the sandbox's own read refuses it just as fast.
    fifo_in_workdir = tool(agent_client, run_id, "shell", command="mkfifo pipe.txt")
    assert fifo_in_workdir["ok"] and fifo_in_workdir["result"]["exit_code"] == 0
    by_path = answered_promptly(lambda: tool(agent_client, run_id, "send_file", path_or_url="pipe.txt"), upload)
    assert by_path["ok"] is False and by_path["error"]["code"] == "not_a_regular_file", by_path
    assert agent_client.get(f"/v1/runs/{run_id}/deliveries").json()["deliveries"] == []


def test_a_fifo_in_place_of_a_deliverys_bytes_is_gone_not_waited_on(agent_service: OrchestratorService) -> None:
    """The outbox is host-only (no sandbox mounts it), so this FIFO stands for any non-file a
    broken disk or an operator's mistake leaves there: the bot's fetch answers 410 at once."""
    store = DeliveryStore(agent_service.store, agent_service.layout, ttl_s=3600, copies=agent_service.host_copies)
    delivery = store.create(
        NewDelivery(
            run_id="r-1", session_id="s-1", runtime_user_id=MEMBER, tool="send_file", kind="file",
            file_name="a.txt", media_type="text/plain", source="/x/a.txt", data=b"bytes",
        )
    )
    path = agent_service.layout.outbox_file(delivery.delivery_id)
    path.unlink()
    os.mkfifo(path, 0o600)

    def fetch() -> Exception | None:
        try:
            store.read_bytes(delivery)
        except Gone as exc:
            return exc
        return None

    refused = answered_promptly(fetch, path)
    assert isinstance(refused, Gone) and refused.code == "gone"
    assert store.get(delivery.delivery_id).fetched_at is None  # nothing half-done counted as fetched
