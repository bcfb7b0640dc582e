"""`orchestrator smoke` against live servers: exactly what the README says after `make run`
(a real `make run` on a fresh data dir, then `.venv/bin/orchestrator smoke --url ...` from
another directory, no tokens, no `--data-dir`) on the process backend and, marked `docker`, on
the Docker backend; a server with tokens, where the smoke installs its skill with the admin
token or writes it into `--data-dir`, or says what it needs; and a server whose identity mode
breaks the group scenario, which the smoke must report."""

from __future__ import annotations

import io
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator.client import OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.settings import Settings
from orchestrator.smoke import SMOKE_SKILL, SmokeOptions, run_smoke
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures
from tests.orchestrator.sandboxes.docker.conftest import docker_data_dir, sandbox_image  # noqa: F401 - fixtures
from tests.conftest import ADMIN_TOKEN, API_TOKEN, make_settings
from tests.live_server import free_port, live_server, serve_process, wait_for_health

REPO = Path(__file__).resolve().parents[2]
ORCHESTRATOR = Path(sys.executable).parent / "orchestrator"  # the venv's console script, as the README uses it
CHECKS = 22


def run_smoke_command(
    url: str, data_dir: Path | None = None, *flags: str, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    command = [str(ORCHESTRATOR), "smoke", "--url", url, *owner_flags(), *flags]
    if data_dir is not None:
        command += ["--data-dir", str(data_dir)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def block_owner() -> int | None:
    """A fresh random owner A (member B = A + 1) inside a test run's own uid block: the smoke's
    own random ids (700 million and up) lie beyond a small ORCH_MAX_USER_ID. Without a block
    given, None: the smoke picks its ids as the README runs it."""
    if "ORCH_MAX_USER_ID" not in os.environ:
        return None
    top = Settings().max_user_id  # the value the servers started here parse from the same env
    return 1 + secrets.randbelow(top - 1)  # B = A + 1 <= top


def owner_flags() -> list[str]:
    owner = block_owner()
    return [] if owner is None else ["--owner-user", str(owner)]


@contextmanager
def make_run(data_dir: Path, port: int, extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """`make run` in a fresh terminal: the repository's Makefile, its venv, no tokens."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "MAKE", "MFLAGS"))}
    # A test run's own uid block and registry (tests/conftest.py): parallel runs neither refuse
    # each other nor share sandbox uids (an agent sweeps every process of its uid).
    kept = ("ORCH_SANDBOX_UID_BASE", "ORCH_MAX_USER_ID", "ORCH_UID_REGISTRY_DIR", "ORCH_DISK_QUOTA")
    env.update({k: os.environ[k] for k in kept if k in os.environ})
    env.update({"ORCH_DATA_DIR": str(data_dir), **(extra_env or {})})
    log_path = Path(f"{data_dir}.make-run.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            ["make", "-C", str(REPO), "run", f"PORT={port}"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(process, url, log_path, 120, "make run")  # make may have to refresh the venv first
        yield url
    finally:
        stop_process_group(process)


def stop_process_group(process: subprocess.Popen) -> None:
    """Ctrl-C in that terminal: the whole group (make and the server it started) is told to
    stop, and waited for. Docker sandboxes outlive the server by design (the next start adopts
    them); the data-dir fixture removes them."""
    group = process.pid
    os.killpg(group, signal.SIGINT)
    process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)


def assert_all_passed(result: subprocess.CompletedProcess) -> None:
    lines = result.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAIL")]
    assert not failed and result.returncode == 0, result.stdout + result.stderr
    assert len([line for line in lines if line.startswith("PASS")]) == CHECKS, result.stdout
    assert lines[-1] == f"{CHECKS} passed, 0 failed"


def assert_only_pass_lines(result: subprocess.CompletedProcess) -> None:
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines[-1] == f"{CHECKS} passed, 0 failed", result.stdout
    assert lines[0] == "runtime identity mode: execution (source: default)", result.stdout  # the mode comes first
    assert all(line.startswith("PASS ") for line in lines[1:-1]) and len(lines) == CHECKS + 2, result.stdout


@pytest.mark.slow
def test_make_run_then_the_smoke_prints_only_pass_lines_on_the_process_backend(agent_data_dir: Path) -> None:
    port = free_port()
    with make_run(agent_data_dir, port, {"ORCH_BACKEND": "process"}) as url:
        result = run_smoke_command(url, cwd=agent_data_dir.parent)
    assert_only_pass_lines(result)
    assert "backend process" in result.stdout
    assert f"installed {SMOKE_SKILL} through the admin API" in result.stdout
    assert not (agent_data_dir / "skills" / SMOKE_SKILL).exists()  # removed again through the API


@pytest.mark.docker
@pytest.mark.slow
def test_make_run_then_the_smoke_prints_only_pass_lines_on_the_docker_backend(
    docker_data_dir: Path, sandbox_image: str
) -> None:
    port = free_port()
    # ORCH_BACKEND stays `auto`, as in `make run`: the engine answers and the image exists.
    with make_run(docker_data_dir, port, {"ORCH_SANDBOX_IMAGE": sandbox_image}) as url:
        result = run_smoke_command(url, cwd=docker_data_dir.parent)
    assert_only_pass_lines(result)
    assert "backend docker" in result.stdout
    assert not (docker_data_dir / "skills" / SMOKE_SKILL).exists()


@pytest.mark.slow
def test_with_tokens_the_smoke_installs_its_skill_with_the_admin_token_or_writes_it_into_the_data_dir(
    agent_data_dir: Path,
) -> None:
    port = free_port()
    env = {"ORCH_BACKEND": "process", "ORCH_API_TOKEN": API_TOKEN, "ORCH_ADMIN_TOKEN": ADMIN_TOKEN}
    with serve_process(str(agent_data_dir), port, env) as url:
        through_api = run_smoke_command(url, None, "--token", API_TOKEN, "--admin-token", ADMIN_TOKEN)
        into_data_dir = run_smoke_command(url, agent_data_dir, "--token", API_TOKEN)
    assert_all_passed(through_api)
    assert f"installed {SMOKE_SKILL} through the admin API" in through_api.stdout
    assert_all_passed(into_data_dir)
    assert f"wrote {SMOKE_SKILL} into {agent_data_dir}/skills" in into_data_dir.stdout
    assert not (agent_data_dir / "skills" / SMOKE_SKILL).exists()


def test_without_admin_access_or_data_dir_the_smoke_says_what_it_needs(agent_data_dir: Path) -> None:
    port = free_port()
    settings = make_settings(agent_data_dir, public_base_url=f"http://127.0.0.1:{port}")
    service = OrchestratorService(settings)
    out = io.StringIO()
    with live_server(create_app(service), port) as url, OrchestratorClient(url, token=API_TOKEN) as client:
        code = run_smoke(client, SmokeOptions(owner_user_id=block_owner()), out)
    report = out.getvalue()
    assert code == 1
    (catalog,) = [line for line in report.splitlines() if line.startswith("FAIL B's skill catalog")]
    assert "403 forbidden" in catalog and "--admin-token" in catalog and "ORCH_ADMIN_TOKEN" in catalog
    assert "--data-dir" in catalog
    failed = [line.split(" — ")[0] for line in report.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 3, report  # the catalog and the two checks that need a skill from it
    assert not (agent_data_dir / "skills").exists() or not os.listdir(agent_data_dir / "skills")


def test_the_smoke_reports_a_server_that_runs_group_members_as_the_owner(agent_data_dir: Path) -> None:
    port = free_port()
    settings = make_settings(agent_data_dir, public_base_url=f"http://127.0.0.1:{port}", runtime_identity="owner")
    service = OrchestratorService(settings)
    out = io.StringIO()
    with live_server(create_app(service), port) as url, OrchestratorClient(url, token=API_TOKEN) as client:
        code = run_smoke(client, SmokeOptions(data_dir=agent_data_dir, owner_user_id=block_owner()), out)
    report = out.getvalue()
    assert code == 1
    assert re.search(r"^FAIL B speaks in A's group session.*runtime identity \d+, expected B=", report, re.M), report
    assert re.search(r"^FAIL last_runtime_user_id follows the speakers", report, re.M)
    assert re.search(r"^PASS A speaks", report, re.M)  # what holds in owner mode still passes
    # The mode and its source come first, and every failure says owner mode is why.
    assert report.splitlines()[0] == "runtime identity mode: owner (source: environment)", report
    failed = [line for line in report.splitlines() if line.startswith("FAIL")]
    assert all(" (owner mode) — " in line or " — not run: " in line for line in failed), report
    assert "ORCH_RUNTIME_IDENTITY=execution" in report.splitlines()[1]
    assert report.splitlines()[-1].endswith("failed") and " 0 failed" not in report.splitlines()[-1]


def test_the_smoke_against_no_server_prints_one_line_and_fails() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = run_smoke_command(url)
    assert result.returncode == 2, result
    assert result.stdout.splitlines() == [result.stdout.strip()] and "FAIL" not in result.stdout, result.stdout
    assert result.stdout.startswith(f"cannot reach {url}: ") and "orchestrator serve" in result.stdout


def test_with_egress_off_the_smoke_skips_the_package_install_with_a_clear_line(agent_data_dir: Path) -> None:
    port = free_port()
    settings = make_settings(agent_data_dir, public_base_url=f"http://127.0.0.1:{port}", egress="off")
    service = OrchestratorService(settings)
    out = io.StringIO()
    try:
        with live_server(create_app(service), port) as url, OrchestratorClient(url, token=API_TOKEN, admin_token=ADMIN_TOKEN) as client:
            # Users within any uid block a test run is given (ORCH_MAX_USER_ID may be small).
            code = run_smoke(client, SmokeOptions(owner_user_id=417, member_user_id=467), out)
    finally:
        service.close()
    report = out.getvalue()
    assert code == 0, report
    (skip,) = [line for line in report.splitlines() if line.startswith("SKIP")]
    assert skip.startswith("SKIP B installs a real package into deps/B/ through the egress proxy") and "egress is off" in skip
    assert report.splitlines()[-1] == f"{CHECKS - 1} passed, 1 skipped, 0 failed", report


def test_with_credentials_on_the_smoke_checks_one_end_to_end_against_a_local_https_upstream(agent_data_dir: Path) -> None:
    from cryptography.fernet import Fernet

    from orchestrator.smoke import CREDENTIAL_CHECK

    port = free_port()
    upstream_ca = agent_data_dir.parent / "smoke-upstream-ca.pem"
    settings = make_settings(
        agent_data_dir, public_base_url=f"http://127.0.0.1:{port}", credentials_key=Fernet.generate_key().decode(),
        egress_allow_loopback=True, egress_upstream_ca_bundle=upstream_ca,
    )  # fmt: skip
    service = OrchestratorService(settings)
    out = io.StringIO()
    try:
        with live_server(create_app(service), port) as url, OrchestratorClient(url, token=API_TOKEN, admin_token=ADMIN_TOKEN) as client:
            options = SmokeOptions(owner_user_id=417, member_user_id=467, credential_upstream_ca=upstream_ca)
            code = run_smoke(client, options, out)
    finally:
        service.close()
    report = out.getvalue()
    assert code == 0, report
    assert f"PASS {CREDENTIAL_CHECK}" in report, report
    assert report.splitlines()[-1] == f"{CHECKS + 1} passed, 0 failed", report
    rows = [r for r in service_audit(settings) if r["action"] == "credential_used"]
    assert rows and rows[-1]["runtime_user_id"] == 467


def service_audit(settings: Settings) -> list[dict]:
    import sqlite3

    with sqlite3.connect(settings.layout.state_db) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT action, runtime_user_id FROM audit_log ORDER BY id")]


def test_smoke_user_ids_fit_the_servers_uid_block() -> None:
    from orchestrator.client.models import Health
    from orchestrator.smoke import max_user_id_of, smoke_user_ids

    health = Health.model_validate(
        {"status": "ok", "version": "0", "backend": "process", "runtime_identity": "execution",
         "isolation": {"uid_block": [90_000_000, 90_100_000]}}
    )  # fmt: skip
    assert max_user_id_of(health) == 100_000
    for draw in (lambda n: 0, lambda n: n - 1, lambda n: n // 2):
        a, b = smoke_user_ids(None, None, 100_000, draw)
        assert 90_000 <= a < b == a + 1 <= 100_000, (a, b)
    # the default block takes the usual far-away ids; given ids always win
    assert smoke_user_ids(None, None, 1_000_000_000, lambda n: 5) == (700_000_005, 700_000_006)
    assert smoke_user_ids(None, None, None, lambda n: 5) == (700_000_005, 700_000_006)
    assert smoke_user_ids(42, None, 100, lambda n: 0) == (42, 43)
    assert smoke_user_ids(42, 7, 100, lambda n: 0) == (42, 7)
    # a /healthz without a usable block changes nothing
    for isolation in (None, {}, {"uid_block": "x"}, {"uid_block": [5, 5]}, {"uid_block": [1, True]}):
        bare = Health.model_validate(
            {"status": "ok", "version": "0", "backend": "process", "runtime_identity": "execution", "isolation": isolation}
        )
        assert max_user_id_of(bare) is None, isolation
