"""Preview URLs with docker sandboxes (no network in the container): the sandbox's own
python3 http.server is reached through the agent's tunnel, its listing and a 5 MB file
byte-identical, a WebSocket echoes, a streamed answer arrives as it is written, a port with
nothing listening answers 503 at once, and a paused sandbox is resumed by a visitor."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import API_TOKEN
from tests.orchestrator.previews.apps import STREAMING_APP, WEBSOCKET_ECHO_APP, websocket_echo
from tests.orchestrator.previews.test_previews_live import FIVE_MB, expose, shell, start, wait_served, write_app
from tests.orchestrator.sandboxes.docker.conftest import docker_data_dir, docker_settings, sandbox_image  # noqa: F401
from tests.orchestrator.sandboxes.test_process_network import web_run

pytestmark = pytest.mark.docker


@pytest.fixture
def docker_previews(docker_data_dir: Path, sandbox_image: str) -> Iterator[tuple[TestClient, OrchestratorService]]:  # noqa: F811
    service = OrchestratorService(docker_settings(docker_data_dir, sandbox_image, preview_listen="127.0.0.1:0"))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield client, service
    finally:
        service.close()


def test_a_docker_sandbox_http_server_and_websocket_through_the_preview(
    docker_previews: tuple[TestClient, OrchestratorService],
) -> None:
    client, service = docker_previews
    run_id = web_run(client, 67)
    assert service.sandboxes.backend_name_for(67) == "docker"
    shell(client, run_id, f"mkdir -p site && head -c {FIVE_MB} /dev/urandom > site/big.bin")
    digest = shell(client, run_id, "sha256sum site/big.bin").split()[0]
    start(client, run_id, "cd site && exec python3 -m http.server 8000 --bind 127.0.0.1")
    preview = expose(client, run_id, 8000)
    listing = wait_served(preview["url"], timeout_s=30)
    assert listing.status_code == 200 and "big.bin" in listing.text
    body = httpx.get(preview["url"] + "big.bin", timeout=60).content
    assert len(body) == FIVE_MB and hashlib.sha256(body).hexdigest() == digest

    write_app(client, run_id, "ws_echo.py", WEBSOCKET_ECHO_APP)
    start(client, run_id, "exec python3 ws_echo.py 8105")
    ws = expose(client, run_id, 8105)
    assert wait_served(ws["url"], timeout_s=30).status_code == 426
    assert websocket_echo(ws["url"] + "ws", [b"ping", b"y" * 100_000]) == [b"ping", b"y" * 100_000]

    # A streamed answer arrives progressively: its first chunk before the app writes the last.
    write_app(client, run_id, "streaming.py", STREAMING_APP)
    start(client, run_id, "exec python3 streaming.py 8104")
    streamed = expose(client, run_id, 8104)
    assert wait_served(streamed["url"] + "ready", timeout_s=30).status_code == 200
    with httpx.stream("GET", streamed["url"] + "stream", timeout=30) as response:
        pieces = response.iter_raw()
        assert next(pieces).startswith(b"first")
        shell(client, run_id, "touch go")  # only now does the app send the rest
        assert b"".join(pieces).endswith(b"last\n")

    # Nothing listens on a port: 503 with Retry-After, at once.
    idle = expose(client, run_id, 8199)
    started = time.monotonic()
    refused = httpx.get(idle["url"], timeout=10)
    assert refused.status_code == 503 and refused.headers["retry-after"].isdigit()
    assert time.monotonic() - started < 2.0


def test_a_paused_docker_sandbox_is_resumed_by_a_visitor(docker_previews: tuple[TestClient, OrchestratorService]) -> None:
    client, service = docker_previews
    run_id = web_run(client, 29)
    shell(client, run_id, "true")
    preview = expose(client, run_id, 8197)
    service.sandboxes.backends["docker"].reap_idle(now=time.monotonic() + service.settings.pause_after_s + 1)
    assert any(s.user_id == 29 and s.state == "paused" and s.backend == "docker" for s in service.sandboxes.status())
    started = time.monotonic()
    response = httpx.get(preview["url"], timeout=30)
    assert response.status_code == 503 and "Retry-After" in response.headers  # thawed; nothing listens there
    assert time.monotonic() - started < 5.0
    assert any(s.user_id == 29 and s.state == "running" for s in service.sandboxes.status())
