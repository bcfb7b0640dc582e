"""Preview URLs on the kubernetes backend (the local cluster, tests/kube_cluster.py): the pod's
own python3 http.server is reached through the agent's tunnel over the pod's port-forward
(the pod keeps no network), its listing and a file byte-identical, and a WebSocket echoes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from kubernetes import client

from orchestrator.service import OrchestratorService
from tests.orchestrator.previews.apps import WEBSOCKET_ECHO_APP, websocket_echo
from tests.orchestrator.previews.test_previews_live import FIVE_MB, expose, shell, start, wait_served, write_app
from tests.orchestrator.sandboxes.kubernetes.conftest import k8s_image, k8s_namespace, kube, served  # noqa: F401
from tests.orchestrator.sandboxes.test_process_network import web_run

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


@pytest.fixture
def k8s_previews(kube: client.CoreV1Api, k8s_namespace: str, k8s_image: str) -> Iterator[tuple[TestClient, OrchestratorService]]:  # noqa: F811
    with served(kube, k8s_namespace, k8s_image, preview_listen="127.0.0.1:0") as pair:
        yield pair


def test_a_pod_http_server_and_websocket_through_the_preview(k8s_previews: tuple[TestClient, OrchestratorService]) -> None:
    client, service = k8s_previews
    run_id = web_run(client, 67)
    assert service.sandboxes.backend_name_for(67) == "kubernetes"
    shell(client, run_id, f"mkdir -p site && head -c {FIVE_MB} /dev/urandom > site/big.bin && echo hi > site/hello.txt")
    digest = shell(client, run_id, "sha256sum site/big.bin").split()[0]
    start(client, run_id, "cd site && exec python3 -m http.server 8000 --bind 127.0.0.1")
    preview = expose(client, run_id, 8000)
    listing = wait_served(preview["url"], timeout_s=60)
    assert listing.status_code == 200, listing.text
    assert "big.bin" in listing.text and "hello.txt" in listing.text
    assert httpx.get(preview["url"] + "hello.txt", timeout=30).text == "hi\n"
    body = httpx.get(preview["url"] + "big.bin", timeout=120).content
    assert len(body) == FIVE_MB and hashlib.sha256(body).hexdigest() == digest

    write_app(client, run_id, "ws_echo.py", WEBSOCKET_ECHO_APP)
    start(client, run_id, "exec python3 ws_echo.py 8105")
    ws = expose(client, run_id, 8105)
    assert wait_served(ws["url"], timeout_s=60).status_code == 426
    assert websocket_echo(ws["url"] + "ws", [b"ping", b"y" * 100_000]) == [b"ping", b"y" * 100_000]

    # Nothing listens on this port in the pod: a quick 503 with Retry-After, not a hang.
    idle = expose(client, run_id, 8199)
    refused = httpx.get(idle["url"], timeout=30)
    assert refused.status_code == 503 and "Retry-After" in refused.headers
