"""What the kubernetes lifecycle, isolation and protocol tests share: one data dir and one
service per test module (a pod start costs ~2 s on the shared cluster), the backend, the
pods of a user as the admin sees them, and a call the router's way."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mounts.layout import GroupRef
from mounts.plan import plan_mounts
from orchestrator.sandboxes.base import SandboxUser
from orchestrator.sandboxes.kubernetes import KubernetesBackend
from orchestrator.sandboxes.kubernetes_spec import LABEL_USER, selector
from orchestrator.service import OrchestratorService
from tests.orchestrator.sandboxes.kubernetes.conftest import TEST_BASE


@contextmanager
def data_dir() -> Iterator[Path]:
    """A data dir under the tests' root (k8s_data_dir's, for a module's lifetime)."""
    TEST_BASE.mkdir(mode=0o711, parents=True, exist_ok=True)
    os.chmod(TEST_BASE, 0o711)
    base = Path(tempfile.mkdtemp(prefix="t-", dir=TEST_BASE))
    os.chmod(base, 0o711)
    (base / "data").mkdir()
    try:
        yield base / "data"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def backend_of(service: OrchestratorService) -> KubernetesBackend:
    backend = service.sandboxes.backend_named("kubernetes", KubernetesBackend)
    assert backend is not None
    return backend


def sandbox_user(service: OrchestratorService, user_id: int, groups: tuple[GroupRef, ...] = ()) -> SandboxUser:
    service.users.upsert(user_id, display_name=None, backend=None)  # a user the orchestrator knows
    gids = {group: service.group_gids.gid_of(group) for group in groups}
    return SandboxUser(user_id, plan_mounts(service.layout, user_id, groups, gids))


def workdir(service: OrchestratorService, user_id: int) -> str:
    return str(service.directories.ensure_session_runtime(user_id, "s1", is_owner=True))


def pods_of(kube: client.CoreV1Api, namespace: str, service: OrchestratorService, user_id: int) -> list[client.V1Pod]:
    """The user's pods of this service's instance that are not being deleted."""
    found = kube.list_namespaced_pod(namespace, label_selector=selector(backend_of(service).instance)).items
    return [
        p for p in found
        if p.metadata.labels.get(LABEL_USER) == str(user_id) and p.metadata.deletion_timestamp is None
    ]  # fmt: skip


def the_pod(kube: client.CoreV1Api, namespace: str, service: OrchestratorService, user_id: int) -> client.V1Pod:
    found = pods_of(kube, namespace, service, user_id)
    assert len(found) == 1, [(p.metadata.name, p.status.phase) for p in found]
    return found[0]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def gone(kube: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        kube.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def ended(kube: client.CoreV1Api, namespace: str, name: str) -> bool:
    """Gone, or its containers ended (what a deleted pod is until the kubelet's cleanup)."""
    try:
        phase = kube.read_namespaced_pod(name, namespace).status.phase
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return phase in ("Succeeded", "Failed")
