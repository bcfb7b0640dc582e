"""The Kubernetes cluster of the `k8s` tests: the one `deploy/kubernetes/local/k8s-local.sh`
brings up (`.ci/run` starts it), found by its kubeconfig (ORCH_TEST_KUBECONFIG, default the
script's `/tmp/k8s-local/k8s/kubeconfig`). Tests marked `k8s` skip without it, except when
ORCH_REQUIRE_K8S=1 (CI): then a missing cluster is a failure."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCAL_SCRIPTS = REPO / "deploy" / "kubernetes" / "local"
# Read at import, before the tests' fixtures clear ORCH_* from the environment.
KUBECONFIG = Path(os.environ.get("ORCH_TEST_KUBECONFIG") or "/tmp/k8s-local/k8s/kubeconfig")
CLUSTER_ROOT = KUBECONFIG.parent.parent  # the script's ROOT
NODE_ENGINE = f"unix://{CLUSTER_ROOT / 'dockerd' / 'docker.sock'}"


@lru_cache(maxsize=1)
def cluster_problem() -> str | None:
    """None when the cluster's API answers with a Ready node, else why not."""
    if not KUBECONFIG.is_file():
        return f"no Kubernetes cluster: {KUBECONFIG} does not exist (deploy/kubernetes/local/README.md)"
    try:
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(KUBECONFIG), client_configuration=configuration)
        with client.ApiClient(configuration) as api:
            nodes = client.CoreV1Api(api).list_node(_request_timeout=5).items
    except Exception as exc:  # any failure means: no usable cluster
        return f"the Kubernetes cluster of {KUBECONFIG} does not answer: {exc}"
    ready = [n for n in nodes if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])]
    return None if ready else "the Kubernetes cluster has no Ready node"


def load_image_into_node(image: str, engine: str = NODE_ENGINE) -> None:
    """Copy `image` from the host's Docker engine into a node's own engine unless it has that
    very image id already (pods use imagePullPolicy Never: no registry here). The same code
    loads template images (ORCH_K8S_NODE_ENGINES)."""
    from orchestrator.templates.builder import load_into_engine

    load_into_engine(image, engine)
