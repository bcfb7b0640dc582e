"""`orchestrator smoke` against live servers: a real `orchestrator serve` subprocess on the
process backend (and on the Docker backend, marked `docker`), and a server whose identity mode
breaks the group scenario, which the smoke must report."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.client import OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.smoke import SmokeOptions, run_smoke
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures
from tests.orchestrator.backends.docker.conftest import docker_data_dir, sandbox_image  # noqa: F401 - fixtures
from tests.conftest import ADMIN_TOKEN, API_TOKEN, make_settings
from tests.live_server import free_port, live_server, serve_process

CHECKS = 21


def run_smoke_command(url: str, data_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "smoke", "--url", url, "--token", API_TOKEN, "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=600,
    )


def assert_all_passed(result: subprocess.CompletedProcess) -> None:
    lines = result.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAIL")]
    assert not failed and result.returncode == 0, result.stdout + result.stderr
    assert len([line for line in lines if line.startswith("PASS")]) == CHECKS, result.stdout
    assert lines[-1] == f"{CHECKS} passed, 0 failed"


@pytest.mark.slow
def test_smoke_passes_against_orchestrator_serve_on_the_process_backend(agent_data_dir: Path) -> None:
    port = free_port()
    env = {"ORCH_BACKEND": "process", "ORCH_API_TOKEN": API_TOKEN, "ORCH_ADMIN_TOKEN": ADMIN_TOKEN}
    with serve_process(str(agent_data_dir), port, env) as url:
        result = run_smoke_command(url, agent_data_dir)
    assert_all_passed(result)
    assert "backend process" in result.stdout
    assert not (agent_data_dir / "skills" / "orch-smoke").exists()  # the smoke removed its skill


@pytest.mark.docker
@pytest.mark.slow
def test_smoke_passes_against_orchestrator_serve_on_the_docker_backend(docker_data_dir: Path, sandbox_image: str) -> None:
    port = free_port()
    env = {
        "ORCH_BACKEND": "docker",
        "ORCH_SANDBOX_IMAGE": sandbox_image,
        "ORCH_API_TOKEN": API_TOKEN,
        "ORCH_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    with serve_process(str(docker_data_dir), port, env) as url:
        result = run_smoke_command(url, docker_data_dir)
    assert_all_passed(result)
    assert "backend docker" in result.stdout


def test_the_smoke_reports_a_server_that_runs_group_members_as_the_owner(agent_data_dir: Path) -> None:
    port = free_port()
    settings = make_settings(agent_data_dir, public_base_url=f"http://127.0.0.1:{port}", runtime_identity="owner")
    service = OrchestratorService(settings)
    out = io.StringIO()
    with live_server(create_app(service), port) as url, OrchestratorClient(url, token=API_TOKEN) as client:
        code = run_smoke(client, SmokeOptions(data_dir=agent_data_dir), out)
    report = out.getvalue()
    assert code == 1
    assert re.search(r"^FAIL B speaks in A's group session.*runtime identity \d+, expected B=", report, re.M), report
    assert re.search(r"^FAIL last_runtime_user_id follows the speakers", report, re.M)
    assert re.search(r"^PASS A speaks", report, re.M)  # what holds in owner mode still passes
    assert report.splitlines()[-1].endswith("failed") and " 0 failed" not in report.splitlines()[-1]
