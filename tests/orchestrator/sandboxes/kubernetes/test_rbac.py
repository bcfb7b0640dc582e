"""The shipped deployment manifests (deploy/kubernetes/) on the real cluster.

- Least privilege: the orchestrator runs as the shipped ServiceAccount, bound to the shipped
  Role only (the very YAML, its namespace rewritten to the test's), with the token the
  cluster's token controller made for it. Everything works: a first call, the idle stop
  (the pod deleted) and the next call's new pod, adoption by a restarted orchestrator. The same Role
  without `pods/portforward` fails the call with a `sandbox_unavailable` that names it.
- Every shipped manifest (both data-volume variants, as kustomize renders them) passes the
  API server's own validation: a server-side dry run.
"""

from __future__ import annotations

import base64
import copy
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.api_calls import OWNER, group_session, start_run, tool
from tests.conftest import API_TOKEN
from tests.kube_cluster import REPO
from tests.orchestrator.sandboxes.kubernetes.conftest import (
    create_namespace,
    delete_namespace,
    k8s_settings,
    kube_configuration,
)

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

DEPLOY = REPO / "deploy" / "kubernetes"
SHIPPED_NAMESPACE = "sandbox-orchestrator"
SHIPPED_ACCOUNT = "sandbox-orchestrator"


def shipped(file: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / file).read_text()) if doc]


def moved(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """`doc` in `namespace` instead of the shipped one (a RoleBinding's subjects too)."""
    doc = copy.deepcopy(doc)
    if doc["kind"] == "Namespace":
        doc["metadata"]["name"] = namespace
        return doc
    assert doc["metadata"].get("namespace") == SHIPPED_NAMESPACE, doc["metadata"]
    doc["metadata"]["namespace"] = namespace
    for subject in doc.get("subjects") or []:
        subject["namespace"] = namespace
    return doc


def apply_rbac(api: client.ApiClient, namespace: str, *, without: str | None = None) -> None:
    """The shipped ServiceAccount, Role and RoleBinding in `namespace`; `without`: the Role
    less the rules that grant that resource."""
    for doc in shipped("rbac.yaml"):
        doc = moved(doc, namespace)
        if doc["kind"] == "Role" and without is not None:
            kept = [rule for rule in doc["rules"] if without not in rule["resources"]]
            assert len(kept) < len(doc["rules"]), f"the shipped Role has no rule for {without}"
            doc["rules"] = kept
        utils.create_from_dict(api, doc)


def account_token(core: client.CoreV1Api, namespace: str, timeout_s: float = 30.0) -> str:
    """The service account's token (1.20: a Secret the token controller creates for it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        account = core.read_namespaced_service_account(SHIPPED_ACCOUNT, namespace)
        for ref in account.secrets or []:
            secret = core.read_namespaced_secret(ref.name, namespace)
            if secret.type == "kubernetes.io/service-account-token" and (secret.data or {}).get("token"):
                return base64.b64decode(secret.data["token"]).decode()
        assert time.monotonic() < deadline, f"no token for service account {SHIPPED_ACCOUNT} in {namespace}"
        time.sleep(0.2)


def account_kubeconfig(path: Path, token: str) -> Path:
    """A kubeconfig of the test cluster that authenticates as the service account only."""
    admin = kube_configuration()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": admin.host, "certificate-authority": admin.ssl_ca_cert}}],
        "users": [{"name": SHIPPED_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": SHIPPED_ACCOUNT}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def admin_api(kube: client.CoreV1Api) -> Iterator[client.ApiClient]:
    with client.ApiClient(kube_configuration()) as api:
        yield api


@pytest.fixture
def kubeconfig_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="so-rbac-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def served(
    data_dir: Path, namespace: str, image: str, kubeconfig: Path
) -> Iterator[tuple[OrchestratorService, TestClient]]:
    service = OrchestratorService(k8s_settings(data_dir, namespace, image, k8s_kubeconfig=kubeconfig))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as test_client:
            yield service, test_client
    finally:
        service.close()


def shell(api: TestClient, command: str) -> dict[str, Any]:
    """The answer of a `shell` call of the group session's owner, in a run of its own."""
    run = start_run(api, group_session(api), trigger="web")
    return tool(api, run["run_id"], "shell", command=command)


def ran(answer: dict[str, Any]) -> str:
    assert answer["ok"] is True, answer
    return str(answer["result"]["stdout"])


def user_pods(kube: client.CoreV1Api, namespace: str) -> list[client.V1Pod]:
    return [p for p in kube.list_namespaced_pod(namespace).items if p.metadata.deletion_timestamp is None]


def test_with_only_the_shipped_role_the_backend_does_everything(
    kube: client.CoreV1Api,
    admin_api: client.ApiClient,
    k8s_namespace: str,
    k8s_image: str,
    k8s_data_dir: Path,
    kubeconfig_dir: Path,
) -> None:
    apply_rbac(admin_api, k8s_namespace)
    kubeconfig = account_kubeconfig(kubeconfig_dir / "kubeconfig", account_token(kube, k8s_namespace))
    with served(k8s_data_dir, k8s_namespace, k8s_image, kubeconfig) as (service, api):
        backend = service.sandboxes.backends["kubernetes"]
        # A first call: the pod is created, read, port-forwarded to; the NetworkPolicy made.
        assert ran(shell(api, "id -u")).strip() == str(service.directories.sandbox_uid(OWNER))
        (first,) = user_pods(kube, k8s_namespace)
        policies = client.NetworkingV1Api(admin_api).list_namespaced_network_policy(k8s_namespace).items
        assert len(policies) == 1, [p.metadata.name for p in policies]

        # The idle stop deletes the pod; the next call waits until its name is free and
        # creates it again.
        assert backend.reap_idle(now=time.monotonic() + service.settings.idle_timeout_s + 1) == [OWNER]
        ran(shell(api, "echo across pods > $HOME/kept.txt"))
        (second,) = user_pods(kube, k8s_namespace)
        assert second.metadata.uid != first.metadata.uid

    # A restarted orchestrator adopts the pod (listed by label) and calls it as it is.
    with served(k8s_data_dir, k8s_namespace, k8s_image, kubeconfig) as (service, api):
        backend = service.sandboxes.backends["kubernetes"]
        assert ran(shell(api, "cat $HOME/kept.txt")) == "across pods\n"
        (adopted,) = user_pods(kube, k8s_namespace)
        assert adopted.metadata.uid == second.metadata.uid
        assert [s.user_id for s in backend.status()] == [OWNER]

        # The idle stop of an adopted pod.
        assert backend.reap_idle(now=time.monotonic() + service.settings.idle_timeout_s + 1) == [OWNER]
        assert user_pods(kube, k8s_namespace) == []


def test_without_pods_portforward_the_call_says_so(
    kube: client.CoreV1Api, admin_api: client.ApiClient, k8s_image: str, k8s_data_dir: Path, kubeconfig_dir: Path
) -> None:
    namespace = create_namespace(kube, "so-test-noforward")
    try:
        apply_rbac(admin_api, namespace, without="pods/portforward")
        kubeconfig = account_kubeconfig(kubeconfig_dir / "kubeconfig", account_token(kube, namespace))
        with served(k8s_data_dir, namespace, k8s_image, kubeconfig) as (_, api):
            answer = shell(api, "echo never")
        assert answer["ok"] is False, answer
        error = answer["error"]
        assert error["code"] == "sandbox_unavailable", error
        assert "pods/portforward" in error["message"] and "403" in error["message"], error["message"]
        # The verb this API server wants for the websocket (an HTTP GET): `create` alone is refused.
        assert "`get`" in error["message"], error["message"]
        assert "did not run" in error["message"], error["message"]
        assert user_pods(kube, namespace) == []  # the pod it could not reach is not left running
    finally:
        delete_namespace(kube, namespace)


# --- every shipped manifest, validated by the API server ---------------------------------


def rendered(*components: str) -> list[dict[str, Any]]:
    """What `kubectl apply -k` would send: deploy/kubernetes rendered by kustomize (no cluster
    contacted), with the given components of it enabled."""
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl (its kustomize) renders the manifests; the local cluster's scripts need it too"
    with tempfile.TemporaryDirectory(prefix="so-kustomize-") as overlay:
        # kustomize takes no absolute paths: the overlay reaches the shipped one through a link.
        (Path(overlay) / "shipped").symlink_to(DEPLOY)
        (Path(overlay) / "kustomization.yaml").write_text(
            yaml.safe_dump({"resources": ["shipped"], "components": [f"shipped/{c}" for c in components]})
        )
        out = subprocess.run([kubectl, "kustomize", overlay], capture_output=True, text=True, timeout=60, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)


def test_the_kustomization_ships_every_manifest_file() -> None:
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    assert kinds(rendered()) == kinds([doc for file in listed for doc in shipped(file)])


def test_every_shipped_manifest_passes_a_server_side_dry_run(kube: client.CoreV1Api, admin_api: client.ApiClient) -> None:
    claim_variant, host_variant = rendered(), rendered("hostpath")
    assert "PersistentVolumeClaim/sandbox-orchestrator-data" in kinds(claim_variant)
    assert "PersistentVolumeClaim/sandbox-orchestrator-data" not in kinds(host_variant)
    (host_deployment,) = [d for d in host_variant if d["kind"] == "Deployment"]
    pod = host_deployment["spec"]["template"]["spec"]
    assert pod["volumes"][0] == {
        "name": "data",
        "hostPath": {"path": "/var/lib/sandbox-orchestrator", "type": "DirectoryOrCreate"},
    }
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert "ORCH_K8S_DATA_PVC" not in env and env["ORCH_DATA_DIR"]["value"] == "/var/lib/sandbox-orchestrator"
    namespace = create_namespace(kube, "so-test-dry")  # empty: nothing of the same name exists there
    try:
        for doc in claim_variant + host_variant:
            target = moved(doc, f"{namespace}-new" if doc["kind"] == "Namespace" else namespace)
            try:
                utils.create_from_dict(admin_api, target, dry_run="All")
            except utils.FailToCreateError as exc:
                reasons = [(e.status, e.reason, e.body) for e in exc.api_exceptions if isinstance(e, ApiException)]
                pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} refused by the API server: {reasons}")
        assert user_pods(kube, namespace) == []  # a dry run it was
    finally:
        delete_namespace(kube, namespace)
