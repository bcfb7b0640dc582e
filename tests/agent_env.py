"""Fixtures for tests that start real sandbox agents.

Agents run as unprivileged sandbox uids when the tests run as root, and those uids must be
able to traverse the data dir: pytest's own tmp dirs are 0700, so these fixtures use a fresh
0711 directory directly under the tests' TEST_ROOT (tests/conftest.py), removed afterwards.
Import the fixtures into a conftest.py to use them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.settings import Settings
from tests.conftest import API_TOKEN, TEST_ROOT, make_settings


@pytest.fixture
def traversable_tmp() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="orch-test-"))
    os.chmod(base, 0o711)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def agent_data_dir(traversable_tmp: Path) -> Path:
    path = traversable_tmp / "data"
    path.mkdir()
    return path


@pytest.fixture
def agent_service(agent_data_dir: Path) -> Iterator[OrchestratorService]:
    svc = OrchestratorService(make_settings(agent_data_dir))
    try:
        yield svc
    finally:
        svc.close()


@pytest.fixture
def agent_client(agent_service: OrchestratorService) -> Iterator[TestClient]:
    with TestClient(create_app(agent_service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
        yield client


def blocking_call(backend, user, tool: str, arguments: dict, *, cwd: str, context=None, calls=None):  # type: ignore[no-untyped-def]
    """One call to a backend's sandbox the router's way (`SandboxCaller`: ensure, count, the
    one retry, the error mapping), from a test thread: on an event loop of its own. A
    sandbox's failure is raised as `router.call_blocking` raises it (a `ToolError`). `calls`:
    the calls' settings section (a backend has only the sandboxes'); unset, the defaults'."""
    import functools

    import anyio

    from orchestrator.sandboxes.agent_calls import tool_error
    from orchestrator.sandboxes.calling import SandboxCaller
    from orchestrator.settings import CallSettings
    from sandbox_agent.errors import ToolFailure

    caller = SandboxCaller(calls or CallSettings.of(make_settings(backend.settings.layout.root)))
    result = anyio.run(functools.partial(caller.call, backend, user, tool, arguments, cwd=cwd, context=context))
    if isinstance(result, ToolFailure):
        raise tool_error(result)
    return result


Served = tuple[TestClient, OrchestratorService]


@contextmanager
def serving(settings: Settings) -> Iterator[Served]:
    """A service on `settings` and a bot-token client of it; the service is closed after."""
    service = OrchestratorService(settings)
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield client, service
    finally:
        service.close()
