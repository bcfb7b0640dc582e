"""ORCH_SANDBOX_PIDS on the process backend: a sandbox uid's processes are capped (RLIMIT_NPROC,
set hard by its agent), so one user's fork bomb cannot fill the host's process table. Docker
has its pids limit besides."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import API_TOKEN, make_settings

PIDS = 48
# Forks until the kernel refuses, then removes its children: "<children> <errno>".
FORKER = """
import os, signal, time
kids, err = [], None
try:
    for _ in range(400):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError as exc:
    err = exc.errno
for pid in kids:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print(len(kids), err)
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a process limit needs a sandbox uid of its own")


@pytest.fixture
def limited_client(agent_data_dir: Path) -> Iterator[TestClient]:
    service = OrchestratorService(make_settings(agent_data_dir, sandbox_pids=PIDS))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield client
    finally:
        service.close()


def shell(client: TestClient, run_id: str, command: str) -> dict:
    response = client.post(f"/v1/runs/{run_id}/tools/shell", json={"arguments": {"command": command}})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["ok"], answer
    return answer["result"]


def test_a_fork_bomb_stops_at_the_sandbox_process_limit(limited_client: TestClient, agent_data_dir: Path) -> None:
    sid = limited_client.post("/v1/sessions", json={"owner_user_id": 17, "channel": "web"}).json()["session_id"]
    run_id = limited_client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web"}).json()["run_id"]
    script = agent_data_dir.parent / "forker.py"
    script.write_text(FORKER)
    script.chmod(0o644)

    limits = shell(limited_client, run_id, "ulimit -Su; ulimit -Hu; ulimit -u 100000 2>&1; ulimit -u")
    assert limits["stdout"].split("\n")[:2] == [str(PIDS), str(PIDS)]
    assert str(PIDS) == limits["stdout"].strip().split("\n")[-1]  # the shell cannot raise it

    forked = shell(limited_client, run_id, f"/usr/bin/python3.11 {script}")
    children, err = forked["stdout"].split()
    assert err == str(errno.EAGAIN), forked
    assert 0 < int(children) < PIDS  # the agent's own threads count too
    # The agent is still there and serving once the children are gone.
    assert shell(limited_client, run_id, "echo alive")["stdout"] == "alive\n"
