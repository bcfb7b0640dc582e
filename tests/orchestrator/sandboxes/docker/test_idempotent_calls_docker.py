"""A retried tool call (same tool_call_id) in a docker sandbox runs once: the repeat sent while
the first runs waits for it and returns its result (real engine, real container agent)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from orchestrator.client import OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import API_TOKEN
from tests.live_server import free_port, live_server
from tests.orchestrator.sandboxes.docker.conftest import docker_settings

pytestmark = pytest.mark.docker


def test_a_repeat_in_a_docker_sandbox_waits_for_the_first_and_runs_once(docker_data_dir: Path, sandbox_image: str) -> None:
    port = free_port()
    service = OrchestratorService(docker_settings(docker_data_dir, sandbox_image, public_base_url=f"http://127.0.0.1:{port}"))
    try:
        with live_server(create_app(service), port) as base, OrchestratorClient(base, token=API_TOKEN) as bot:
            session = bot.create_session(owner_user_id=17, channel="web")
            run = bot.start_run(session.session_id, trigger="web")
            count = Path(run.workdir) / "count.txt"
            command = {"command": "echo ran >> count.txt; sleep 2; echo done-$RANDOM"}
            first = []
            thread = threading.Thread(target=lambda: first.append(bot.call_tool(run.run_id, "shell", command, tool_call_id="d1")))
            thread.start()
            deadline = time.monotonic() + 60
            while not (count.exists() and count.read_text() == "ran\n"):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            repeat = bot.call_tool(run.run_id, "shell", command, tool_call_id="d1")
            thread.join()
            assert repeat.ok and repeat.result == first[0].result and repeat.typed.stdout.startswith("done-")
            assert count.read_text() == "ran\n"
    finally:
        service.close()
