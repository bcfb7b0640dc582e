"""Shared fixtures. Tests marked `docker` skip without an engine, except when
ORCH_REQUIRE_DOCKER=1 (CI): then a missing engine is a failure. Those also marked `runsc` (the
gVisor runs) skip without `runsc` registered with the engine, except when ORCH_REQUIRE_RUNSC=1.
Tests marked `k8s` likewise skip without a cluster (tests/kube_cluster.py), except when
ORCH_REQUIRE_K8S=1.

Every test dir lives under TEST_ROOT, not /tmp: the service refuses a data dir inside a
directory others can write (orchestrator/startup_checks.py), and agents' sandbox uids must
traverse it (0711). That is `<repo>/.pytest-tmp` when the checkout's parents allow both, else
a root-owned /var/lib/sandbox-orchestrator-tests/<checkout hash> (e.g. a CI clone below a 0700
home)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.settings import Settings
from orchestrator.startup_checks import path_chain, unsafe_ancestor_problem
from tests.uid_block import claim_for_this_run

REPO = Path(__file__).resolve().parent.parent
SHARED_TEST_ROOT = Path("/var/lib/sandbox-orchestrator-tests")


def _usable_for_tests(path: Path) -> bool:
    """Safe for a data dir, and (as root) traversable by every sandbox uid."""
    chain = path_chain(path)
    if unsafe_ancestor_problem(chain, own_gid=os.getegid(), as_root=os.geteuid() == 0, sandbox_ids=()) is not None:
        return False
    return os.geteuid() != 0 or all(entry.is_link or entry.mode & stat.S_IXOTH for entry in chain)


def _test_root() -> Path:
    if _usable_for_tests(REPO):
        root = REPO / ".pytest-tmp"
    else:
        SHARED_TEST_ROOT.mkdir(mode=0o711, parents=True, exist_ok=True)
        os.chmod(SHARED_TEST_ROOT, 0o711)
        root = SHARED_TEST_ROOT / hashlib.sha256(str(REPO).encode()).hexdigest()[:12]
    root.mkdir(mode=0o711, exist_ok=True)
    os.chmod(root, 0o711)
    return root


TEST_ROOT = _test_root()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Before pytest's own tmpdir plugin reads it. Explicit --basetemp still wins.
    if config.option.basetemp is None:
        config.option.basetemp = str(TEST_ROOT / "pytest")
    # Before any test reads it: a uid block no live orchestrator or other test run holds.
    claim_for_this_run()


API_TOKEN = "bot-token-for-tests"
ADMIN_TOKEN = "admin-token-for-tests"


@lru_cache(maxsize=1)
def docker_engine_problem() -> str | None:
    """None when a Docker engine answers, else why not."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
        return None
    except Exception as exc:  # any failure means: no usable engine
        return f"no Docker engine answers: {exc}"


@lru_cache(maxsize=1)
def runsc_problem() -> str | None:
    """None when the engine runs containers under gVisor (`runsc` registered with dockerd:
    deploy/docker/register-runsc), else why not."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        try:
            runtimes = client.info().get("Runtimes") or {}
        finally:
            client.close()
    except Exception as exc:
        return f"no Docker engine answers: {exc}"
    return None if "runsc" in runtimes else "runsc is not a runtime of the Docker engine (deploy/docker/register-runsc)"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("k8s") is not None:
        from tests.kube_cluster import cluster_problem

        k8s_problem = cluster_problem()
        if k8s_problem is not None:
            if os.environ.get("ORCH_REQUIRE_K8S") == "1":
                pytest.fail(f"ORCH_REQUIRE_K8S=1 but {k8s_problem}", pytrace=False)
            pytest.skip(k8s_problem)
    if item.get_closest_marker("docker") is None:
        return
    problem = docker_engine_problem()
    if problem is not None:
        if os.environ.get("ORCH_REQUIRE_DOCKER") == "1":
            pytest.fail(f"ORCH_REQUIRE_DOCKER=1 but {problem}", pytrace=False)
        pytest.skip(problem)
    if item.get_closest_marker("runsc") is None:
        return
    problem = runsc_problem()
    if problem is not None:
        if os.environ.get("ORCH_REQUIRE_RUNSC") == "1":
            pytest.fail(f"ORCH_REQUIRE_RUNSC=1 but {problem}", pytrace=False)
        pytest.skip(problem)


# The uid registry dir too: a test run may keep its block in a registry of its own.
KEPT_ENV = frozenset(
    {"ORCH_REQUIRE_DOCKER", "ORCH_SANDBOX_UID_BASE", "ORCH_MAX_USER_ID", "ORCH_UID_REGISTRY_DIR", "ORCH_DISK_QUOTA",
     "ORCH_REQUIRE_LOOP", "ORCH_REQUIRE_K8S", "ORCH_TEST_KUBECONFIG", "ORCH_REQUIRE_RUNSC"}
)


@pytest.fixture(autouse=True)
def _clean_identity_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests build their own settings; the developer's environment must not leak in. The uid
    # block stays: parallel test runs on one host each give theirs, or their agents' sweeps of
    # "every process of my uid" would kill each other's agents.
    for key in list(os.environ):
        if key.startswith("ORCH_") and key not in KEPT_ENV:
            monkeypatch.delenv(key, raising=False)
    # Every server a test starts (in process or as a subprocess) runs without disk quotas: a
    # loop image costs an mkfs and a loop device. tests/orchestrator/quotas/ turns them on.
    monkeypatch.setenv("ORCH_DISK_QUOTA", "off")


def make_settings(data_dir: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "data_dir": data_dir,
        "api_token": API_TOKEN,
        "admin_token": ADMIN_TOKEN,
        "public_base_url": "http://testserver",
        "backend": "process",
        # Loop images per user would cost an mkfs and a loop device in every test: only the
        # disk-quota tests (tests/orchestrator/quotas/) turn a mechanism on.
        "disk_quota": "off",
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def sandbox_runtime() -> str:
    """ORCH_SANDBOX_RUNTIME of the docker fixtures' service: runc unless a test parametrizes it
    (tests/orchestrator/sandboxes/docker/conftest.py, RUNTIMES)."""
    return "runc"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def settings(data_dir: Path) -> Settings:
    return make_settings(data_dir)


@pytest.fixture
def service(settings: Settings) -> Iterator[OrchestratorService]:
    svc = OrchestratorService(settings)
    yield svc
    svc.close()


@pytest.fixture
def client(service: OrchestratorService) -> Iterator[TestClient]:
    with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as c:
        yield c


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}
