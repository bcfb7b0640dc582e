"""/healthz tells anyone that the service is up and its mode; what the host exposes (isolation,
uid block, disk figures, egress list, descriptors) only with the admin token."""

from __future__ import annotations

from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import API_TOKEN, admin_headers

PUBLIC = {"status", "version", "runtime_identity", "runtime_identity_source"}
HOST_DETAILS = {"isolation", "disk_quota", "egress", "descriptors", "kernel_boundary", "backend"}


def test_without_the_admin_token_healthz_says_only_up_and_the_mode(service: OrchestratorService) -> None:
    with TestClient(create_app(service)) as anonymous:
        answer = anonymous.get("/healthz")
        assert answer.status_code == 200 and set(answer.json()) == PUBLIC
        assert answer.json()["status"] == "ok" and answer.json()["runtime_identity"] == "execution"
        as_bot = anonymous.get("/healthz", headers={"Authorization": f"Bearer {API_TOKEN}"})
        assert set(as_bot.json()) == PUBLIC
        wrong = anonymous.get("/healthz", headers={"Authorization": "Bearer not-a-token"})
        assert wrong.status_code == 200 and set(wrong.json()) == PUBLIC


def test_with_the_admin_token_healthz_shows_the_host(client: TestClient) -> None:
    answer = client.get("/healthz", headers=admin_headers()).json()
    assert HOST_DETAILS <= set(answer)
    assert "uid_block" in answer["isolation"] and "mechanism" in answer["disk_quota"]
