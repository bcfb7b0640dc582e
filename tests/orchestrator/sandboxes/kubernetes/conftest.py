"""Fixtures of the kubernetes backend's tests, on the real cluster of deploy/kubernetes/local
(tests/kube_cluster.py): the sandbox image loaded into its node, a namespace of the test
module's own (deleted afterwards, its pods with it), settings that point a backend there."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.settings import Settings
from tests.conftest import API_TOKEN, TEST_ROOT, make_settings
from tests.kube_cluster import KUBECONFIG, cluster_problem, load_image_into_node
from tests.sandbox_image import IMAGE, ensure_sandbox_image, recipe_tag

pytestmark = pytest.mark.k8s


def kube_configuration() -> client.Configuration:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(KUBECONFIG), client_configuration=configuration)
    return configuration


@pytest.fixture(scope="session")
def kube() -> Iterator[client.CoreV1Api]:
    """The cluster's core API as its admin (the tests' own view; backends get their settings)."""
    if cluster_problem() is not None:
        pytest.skip(cluster_problem())  # the marker hook fails instead under ORCH_REQUIRE_K8S=1
    with client.ApiClient(kube_configuration()) as api:
        yield client.CoreV1Api(api)


@pytest.fixture(scope="session")
def k8s_image(kube: client.CoreV1Api) -> str:
    """The sandbox image by its recipe tag, present in the node's own engine."""
    image = recipe_tag(ensure_sandbox_image())
    load_image_into_node(image)
    return image


def create_namespace(kube: client.CoreV1Api, prefix: str = "so-test") -> str:
    name = f"{prefix}-{secrets.token_hex(4)}"
    kube.create_namespace({"metadata": {"name": name}})
    return name


def delete_namespace(kube: client.CoreV1Api, name: str, *, wait_s: float = 60.0) -> None:
    """Its pods first, at once (a namespace waits for its pods' graceful end), then itself.
    Waits until none of its pods is left on the API server (what later tests' pods compete
    for), not for the namespace controller to finalize the namespace itself: that takes about
    five seconds per namespace, runs on in the background, and nothing reuses a random name."""
    try:
        kube.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        kube.delete_namespace(name, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if not kube.list_namespaced_pod(name).items:
                return
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.1)
    raise AssertionError(f"the pods of namespace {name} were still there after {wait_s:.0f} s")


@pytest.fixture(scope="module")
def k8s_namespace(kube: client.CoreV1Api) -> Iterator[str]:
    name = create_namespace(kube)
    yield name
    delete_namespace(kube, name)


TEST_BASE = TEST_ROOT / "kubernetes"


@pytest.fixture
def k8s_data_dir() -> Iterator[Path]:
    """A data dir under the tests' root, not /tmp: a user's tmp/{uid} is mounted at /tmp in the
    pod, and a data dir under /tmp would nest every other mount inside it (the hostPath data
    volume is this directory itself)."""
    TEST_BASE.mkdir(mode=0o711, parents=True, exist_ok=True)
    os.chmod(TEST_BASE, 0o711)
    base = Path(tempfile.mkdtemp(prefix="t-", dir=TEST_BASE))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    try:
        yield data
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def k8s_service(
    request: pytest.FixtureRequest, k8s_data_dir: Path, k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api
) -> Iterator[OrchestratorService]:
    """The backend of k8s_settings; a test marked `k8s_settings(name=value, ...)` changes them."""
    marker = request.node.get_closest_marker("k8s_settings")
    overrides = marker.kwargs if marker is not None else {}
    service = OrchestratorService(k8s_settings(k8s_data_dir, k8s_namespace, k8s_image, **overrides))
    try:
        yield service
    finally:
        service.close()
        kube.delete_collection_namespaced_pod(k8s_namespace, grace_period_seconds=0)


@pytest.fixture
def k8s_client(k8s_service: OrchestratorService) -> Iterator[TestClient]:
    with TestClient(create_app(k8s_service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as test_client:
        yield test_client


def separate_uid_block(settings: Settings, index: int = 0) -> dict[str, int]:
    """Settings for a second service alive at the same time as the one of `settings` (their
    uid blocks must not overlap on one host, whatever ORCH_MAX_USER_ID is): just above its
    block, 100 000 users wide; `index` tells several such services apart."""
    width = 100_000
    return {"sandbox_uid_base": settings.sandbox_uid_base + settings.max_user_id + 1 + index * (width + 1), "max_user_id": width}


def k8s_settings(data_dir: Path, namespace: str, image: str, **overrides: object) -> Settings:
    """Settings of a kubernetes backend in `namespace` of the test cluster: small sandboxes
    (the node has two cores; pods request what they limit, as the local cluster runs only
    Guaranteed pods: its kubelet's OOM-score patch leaves Burstable ones no valid score), images
    loaded, not pulled. A quarter of a core: at a tenth, the agent's start alone (half a second
    of CPU) took five seconds of every pod's start, and every call was throttled likewise."""
    values: dict[str, object] = {
        "backend": "kubernetes",
        "k8s_kubeconfig": KUBECONFIG,
        "k8s_namespace": namespace,
        "k8s_image_pull_policy": "Never",
        "sandbox_image": image,
        "sandbox_cpus": 0.25,
        "sandbox_memory_mb": 256,
        "sandbox_ready_timeout_s": 60.0,
    }
    values.update(overrides)
    return make_settings(data_dir, **values)


__all__ = ["IMAGE", "create_namespace", "delete_namespace", "k8s_settings", "kube_configuration", "served"]


@contextmanager
def served(kube: client.CoreV1Api, namespace: str, image: str, **overrides: object) -> Iterator[tuple[TestClient, OrchestratorService]]:
    """A service on the cluster and its API as the bot, with a data dir of its own (for a
    module-scoped fixture: one pod serves a module's tests); its pods deleted afterwards."""
    TEST_BASE.mkdir(mode=0o711, parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="t-", dir=TEST_BASE))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    service = OrchestratorService(k8s_settings(data, namespace, image, **overrides))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as test_client:
            yield test_client, service
    finally:
        service.close()
        kube.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        shutil.rmtree(base, ignore_errors=True)
