"""The kubernetes driver's (`kubernetes.py`) client of the Kubernetes API: where the API server
is and with which credentials, whether it answers at start-up, its errors in words, and the
few calls the driver makes on the pods of this instance in one namespace (read, list, create,
delete, wait until a name is free, a pod's last log lines) and on the sandboxes' NetworkPolicy.
What to do with a pod is the driver's (and the lifecycle engine's)."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from orchestrator.log import kv
from orchestrator.sandboxes.kubernetes_spec import CONTAINER, STOP_GRACE_S, network_policy, selector
from orchestrator.settings import KubernetesSettings

log = logging.getLogger(__name__)

API_ERRORS: tuple[type[BaseException], ...] = (ApiException, HTTPError, OSError)  # the API server failing
API_TIMEOUT_S = 15.0  # one request to the API server
POLL_S = 0.25  # how often a pod's status is read while waiting
LOG_TAIL_MAX_BYTES = 16 * 1024  # of a failed pod's log (its last 20 lines), read on a failed start


def kube_configuration(settings: KubernetesSettings) -> k8s.Configuration:
    """The API server and credentials: ORCH_K8S_KUBECONFIG, else the pod's service account
    when running in a cluster, else $KUBECONFIG or ~/.kube/config."""
    configuration = k8s.Configuration()
    if settings.kubeconfig is not None:
        k8s_config.load_kube_config(config_file=str(settings.kubeconfig), client_configuration=configuration)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=configuration)
    else:
        k8s_config.load_kube_config(client_configuration=configuration)
    return configuration


def cluster_problem(settings: KubernetesSettings, timeout: float = 5.0) -> str | None:
    """None when the cluster answers and the namespace exists, else why not (for start-up)."""
    try:
        api = k8s.ApiClient(kube_configuration(settings))
    except (k8s_config.ConfigException, OSError, ValueError) as exc:
        return f"no Kubernetes configuration: {exc}"
    try:
        k8s.CoreV1Api(api).list_namespaced_pod(settings.namespace, limit=1, _request_timeout=timeout)
        return None
    except ApiException as exc:
        return f"the Kubernetes API answered {exc.status} {exc.reason} for namespace {settings.namespace}"
    except (HTTPError, OSError) as exc:
        return f"the Kubernetes API does not answer: {exc}"
    finally:
        api.close()


def api_error(exc: BaseException) -> str:
    """One of `API_ERRORS` in words (the API server's own message when it gave one)."""
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")
    return repr(exc)


class PodApi:
    """The calls on this instance's pods in `namespace`; pods are plain dicts (the API's JSON)."""

    def __init__(self, configuration: k8s.Configuration, namespace: str, instance: str) -> None:
        self.namespace = namespace
        self.instance = instance
        self.api = k8s.ApiClient(configuration)
        self.core = k8s.CoreV1Api(self.api)

    def close(self) -> None:
        self.api.close()

    def read(self, name: str) -> dict[str, Any] | None:
        try:
            answer = self.core.read_namespaced_pod(
                name, self.namespace, _request_timeout=API_TIMEOUT_S, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(answer.data)

    def listed(self) -> list[dict[str, Any]]:
        answer = self.core.list_namespaced_pod(
            self.namespace, label_selector=selector(self.instance), _request_timeout=API_TIMEOUT_S, _preload_content=False
        )
        return list(json.loads(answer.data).get("items") or [])

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        created = self.core.create_namespaced_pod(
            self.namespace, manifest, _request_timeout=API_TIMEOUT_S, _preload_content=False
        )
        return dict(json.loads(created.data))

    def delete(self, name: str, *, grace_s: int) -> None:
        try:
            self.core.delete_namespaced_pod(
                name, self.namespace, grace_period_seconds=grace_s, _request_timeout=API_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def log_tail(self, name: str) -> str:
        """A pod's last 20 log lines ("" when there are none or the API fails)."""
        try:
            # None, not "", for a pod that never got a node (an unschedulable one).
            return (self.core.read_namespaced_pod_log(
                name, self.namespace, container=CONTAINER, tail_lines=20, limit_bytes=LOG_TAIL_MAX_BYTES,
                _request_timeout=API_TIMEOUT_S,
            ) or "").strip()  # fmt: skip
        except API_ERRORS:
            return ""

    def free_name(self, name: str, *, timeout_s: float, user_id: int) -> bool:
        """Wait until no pod is called `name` (a deleted pod terminates first), deleting the
        one there; False when it is still there after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            pod = self.read(name)
            if pod is None:
                return True
            deleting = (pod.get("metadata") or {}).get("deletionTimestamp") is not None
            phase = (pod.get("status") or {}).get("phase")
            # Once its containers ended, only the kubelet's cleanup round keeps the object
            # (measured: ~8 s after the agent exited): removed at once, as nothing runs.
            ended = phase in ("Succeeded", "Failed")
            if not deleting or ended:
                if not deleting and phase in ("Pending", "Running"):
                    # A live pod we did not decide to replace (created meanwhile by another
                    # orchestrator of the same data dir?): replaced all the same, as ours.
                    log.warning("replacing a sandbox pod this slot did not know %s", kv(user=user_id, pod=name))
                self.delete(name, grace_s=0 if ended else STOP_GRACE_S)
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)

    def ensure_network_policy(self) -> None:
        """The sandboxes' NetworkPolicy exists (effective only with a policy-enforcing network
        plugin; failing to make it is not fatal)."""
        policy = network_policy(self.instance)
        try:
            k8s.NetworkingV1Api(self.api).create_namespaced_network_policy(
                self.namespace, policy, _request_timeout=API_TIMEOUT_S
            )
            log.info("created the sandboxes' NetworkPolicy %s", kv(name=policy["metadata"]["name"], namespace=self.namespace))
        except ApiException as exc:
            if exc.status == 409:
                return  # there already
            log.warning(
                "could not create the sandboxes' NetworkPolicy %s",
                kv(name=policy["metadata"]["name"], status=exc.status, reason=exc.reason),
            )
