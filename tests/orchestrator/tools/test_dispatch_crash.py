"""Issue 12, defence in depth: a tool call is audited before it runs, so killing the server
(kill -9, no shutdown) mid-call leaves the audit row of every call that ran."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import sqlite3
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import API_TOKEN
from tests.live_server import free_port, serve_process

AS_ROOT = os.geteuid() == 0
USERS = (17, 18, 19)
PER_USER = 8  # the default per-user cap: all 24 run at once


def server_pid(port: int) -> int:
    for child in psutil.Process().children(recursive=True):
        if "serve" in child.cmdline() and str(port) in child.cmdline():
            return child.pid
    raise AssertionError("no orchestrator serve child")


@pytest.mark.skipif(not AS_ROOT, reason="agents run as their own uids only as root")
def test_every_call_that_ran_before_a_kill_9_has_its_audit_row(traversable_tmp: Path) -> None:
    data = traversable_tmp / "data"
    data.mkdir()
    port = free_port()
    env = {"ORCH_BACKEND": "process", "ORCH_API_TOKEN": API_TOKEN, "ORCH_ADMIN_TOKEN": "admin-" + API_TOKEN}
    pool = concurrent.futures.ThreadPoolExecutor(len(USERS) * PER_USER)
    try:
        with serve_process(str(data), port, env) as url:
            http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=60)
            runs: dict[int, tuple[str, str]] = {}
            for user in USERS:
                session = http.post("/v1/sessions", json={"owner_user_id": user, "channel": "web"}).json()["session_id"]
                runs[user] = (session, http.post(f"/v1/sessions/{session}/runs", json={"trigger": "web"}).json()["run_id"])
            markers = [
                data / "runtime" / str(user) / session / f"ran-{i}"
                for user, (session, _) in runs.items()
                for i in range(PER_USER)
            ]
            for user, (_, run_id) in runs.items():
                for i in range(PER_USER):
                    body = {"arguments": {"command": f"touch ran-{i}; sleep 30"}}
                    pool.submit(http.post, f"/v1/runs/{run_id}/tools/shell", json=body)
            deadline = time.monotonic() + 30
            while not all(marker.exists() for marker in markers):
                assert time.monotonic() < deadline, f"{sum(m.exists() for m in markers)} of 24 calls ran"
                time.sleep(0.05)
            os.kill(server_pid(port), signal.SIGKILL)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for proc in psutil.process_iter(["uids"]):
            if proc.info["uids"] and proc.info["uids"].real in {100000 + u for u in USERS}:
                proc.kill()
    with sqlite3.connect(data / "state" / "orchestrator.sqlite3") as db:
        rows = db.execute(
            "SELECT json_extract(detail, '$.run_id'), json_extract(detail, '$.outcome') FROM audit_log"
            " WHERE action = 'tool.call' AND json_extract(detail, '$.tool') = 'shell'"
        ).fetchall()
    executed = len(markers)
    assert executed == 24
    assert sorted(run for run, _ in rows) == sorted(run_id for _, run_id in runs.values() for _ in range(PER_USER))
    assert {outcome for _, outcome in rows} == {"started"}  # none had finished
