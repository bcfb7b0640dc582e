"""`kill -9` of a real `orchestrator serve` while a background process runs (issue 15).

Docker: the container and its agent outlive the orchestrator; the restarted one adopts the
container, `process_list` shows the process with its output intact, and it still ends with
its exit code reported. Process backend: its agents exit with the orchestrator that started
them (docs/processes.md), so the process dies with it and the new orchestrator lists none.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.api_calls import MEMBER, OWNER
from tests.conftest import API_TOKEN, KEPT_ENV, TEST_ROOT
from tests.live_server import free_port, wait_for_health
from tests.orchestrator.sandboxes.docker.conftest import TEST_BASE, remove_containers

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids need root"), pytest.mark.slow]

# Prints a numbered line every 0.2 s, then waits for a file to appear and exits 7.
COMMAND = "for i in $(seq 1 5); do echo tick$i; sleep 0.2; done; while [ ! -e go ]; do sleep 0.1; done; echo done; exit 7"


@contextmanager
def _serve(data: Path, port: int, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_") or k in KEPT_ENV}
    full.update({"ORCH_DATA_DIR": str(data), "ORCH_API_TOKEN": API_TOKEN, **env})
    log_path = f"{data}.serve.log"
    with open(log_path, "a") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "serve", "--port", str(port)], env=full, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_for_health(process, f"http://127.0.0.1:{port}", log_path, 60, "orchestrator serve")
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _tool(http: httpx.Client, run_id: str, name: str, **arguments: object) -> dict:
    response = http.post(f"/v1/runs/{run_id}/tools/{name}", json={"arguments": arguments}, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ok"], body
    return body["result"]


@pytest.fixture(params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def backend_env(request: pytest.FixtureRequest) -> Iterator[tuple[str, Path, dict[str, str]]]:
    if request.param == "docker":
        from tests.sandbox_image import ensure_sandbox_image, recipe_tag

        TEST_BASE.mkdir(mode=0o711, parents=True, exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="t-", dir=TEST_BASE))
        env = {"ORCH_BACKEND": "docker", "ORCH_SANDBOX_IMAGE": recipe_tag(ensure_sandbox_image())}
    else:
        base = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="orch-restart-"))
        env = {"ORCH_BACKEND": "process"}
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    try:
        yield request.param, data, env
    finally:
        if request.param == "docker":
            remove_containers(data)
        shutil.rmtree(base, ignore_errors=True)


def test_kill_9_of_the_orchestrator_with_a_process_running(backend_env: tuple[str, Path, dict[str, str]]) -> None:
    backend, data, env = backend_env
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    with _serve(data, port, env) as first, httpx.Client(base_url=url, headers=headers, timeout=120) as http:
        body = {"owner_user_id": OWNER, "channel": "feishu_group", "group": {"channel": "feishu", "chat_id": "oc_restart"}}
        session_id = http.post("/v1/sessions", json=body).json()["session_id"]
        run = http.post(f"/v1/sessions/{session_id}/runs", json={"trigger": "group_message", "speaker_user_id": MEMBER})
        run_id = run.json()["run_id"]
        started = _tool(http, run_id, "process_start", command=COMMAND)
        deadline = time.monotonic() + 20
        while "tick5" not in str(_tool(http, run_id, "process_output", process_id=started["process_id"])["chunks"]):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        first.send_signal(signal.SIGKILL)
        first.wait()

    with _serve(data, port, env), httpx.Client(base_url=url, headers=headers, timeout=120) as http:
        listed = _tool(http, run_id, "process_list")["processes"]
        if backend == "process":
            # Its agent exited with the orchestrator that started it: nothing of it is left.
            assert listed == []
            deadline = time.monotonic() + 10
            while Path(f"/proc/{started['pid']}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not Path(f"/proc/{started['pid']}").exists()
            return
        assert [p["process_id"] for p in listed] == [started["process_id"]] and listed[0]["state"] == "running"
        output = _tool(http, run_id, "process_output", process_id=started["process_id"])
        assert "".join(c["text"] for c in output["chunks"]) == "".join(f"tick{i}\n" for i in range(1, 6))
        _tool(http, run_id, "write_file", path="go", content="")
        since, text = output["next"], ""
        while True:
            answer = _tool(http, run_id, "process_output", process_id=started["process_id"], since=since, wait_s=5)
            text += "".join(c["text"] for c in answer["chunks"])
            since = answer["next"]
            if answer["complete"]:
                break
        assert text == "done\n" and answer["exit_code"] == 7
