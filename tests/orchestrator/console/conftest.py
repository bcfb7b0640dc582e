"""The console over https (so its cookie carries Secure), with the service behind it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import make_settings


@pytest.fixture
def console(data_dir) -> Iterator[tuple[TestClient, OrchestratorService]]:
    service = OrchestratorService(make_settings(data_dir))
    try:
        with TestClient(create_app(service), base_url="https://testserver") as client:
            yield client, service
    finally:
        service.close()
