"""Issue 12 item 4 with containers: a user who pauses their own sandbox (or whose agent stops
answering) gets an answer within the short deadline, and the next call a fresh container."""

from __future__ import annotations

from pathlib import Path

import docker
import httpx
import pytest

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import API_TOKEN
from tests.live_server import live_server
from tests.orchestrator.sandboxes.docker.conftest import docker_settings
from tests.orchestrator.tools.test_call_isolation import ATTACKER, call, personal_run, timed

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_item4_a_paused_sandbox_answers_within_the_short_timeout_and_is_replaced(
    docker_data_dir: Path, sandbox_image: str
) -> None:
    service = OrchestratorService(docker_settings(docker_data_dir, sandbox_image, agent_call_timeout_s=2.0))
    engine = docker.from_env()
    with live_server(create_app(service)) as url, httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=60
    ) as http:
        run = personal_run(http, ATTACKER)
        assert call(http, run, "write_file", path="a.txt", content="a\n")["ok"]
        [status] = [s for s in service.sandboxes.status() if s.user_id == ATTACKER]
        paused = engine.containers.get(status.detail["container_id"])  # type: ignore[index]
        paused.pause()
        try:
            answer, seconds = timed(call, http, run, "read_file", timeout=20, path="a.txt")
            assert answer["ok"] is False and answer["error"]["code"] == "sandbox_unavailable", answer
            assert "may have run" in answer["error"]["message"] and seconds < 4.0, (answer, seconds)
            again = call(http, run, "read_file", timeout=60, path="a.txt")
            assert again["ok"] and again["result"]["content"] == "a\n", again
            [status] = [s for s in service.sandboxes.status() if s.user_id == ATTACKER]
            assert status.detail["container_id"] != paused.id  # type: ignore[index]
        finally:
            try:
                paused.reload()
                if paused.status == "paused":
                    paused.unpause()
            except docker.errors.NotFound:
                pass
            engine.close()
