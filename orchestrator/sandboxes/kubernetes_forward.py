"""Reaching an agent in a pod through the Kubernetes API: each connection of the agent's
clients is one port-forward (a websocket to the API server, which the kubelet joins to the
agent's port on the pod's loopback). It works on any cluster, whether or not pod IPs are
reachable from the orchestrator, and needs only `pods/portforward` in the namespace.

The official client's `PortForward` does the websocket framing (a thread per forward
copies between the websocket and one end of a socketpair, whose other end the agent's
clients use as their socket). The websocket itself is opened here rather than through
`kubernetes.stream.portforward`, which sets no timeout: a stalled API server would hold a
caller forever. A refusal by the API server (RBAC, no such pod) is an `AgentUnavailable`
that says which, with nothing sent.
"""

from __future__ import annotations

import socket
import ssl
from urllib.parse import quote

import certifi
from kubernetes.client import Configuration
from kubernetes.stream.ws_client import V4_CHANNEL_PROTOCOL, V5_CHANNEL_PROTOCOL, PortForward
from websocket import WebSocket, WebSocketBadStatusException, WebSocketException

from sandbox_agent.errors import AgentUnavailable


def forward_url(host: str, namespace: str, pod: str, port: int) -> str:
    """Pure: the websocket URL of a port-forward to `port` of `pod`."""
    base = host.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    return f"{base}/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/portforward?ports={port}"


def refusal_message(status: int, namespace: str, pod: str) -> str:
    """Pure: what an API server's refusal of a port-forward means, for the operator. The
    websocket is an HTTP GET, authorized as `get`; newer API servers ask for `create` too."""
    if status == 403:
        return (
            f"the Kubernetes API refused to port-forward to pod {pod} in {namespace} (403): the orchestrator's "
            "service account needs `get` and `create` on `pods/portforward` there (deploy/kubernetes/rbac.yaml)"
        )
    if status == 401:
        return "the Kubernetes API rejected the orchestrator's credentials (401)"
    if status == 404:
        return f"pod {pod} is not in namespace {namespace} (404)"
    return f"the Kubernetes API refused to port-forward to pod {pod} in {namespace} ({status})"


class PodPortForwarder:
    """A `Connector` (sandbox_agent.client) of one pod's agent port."""

    def __init__(self, configuration: Configuration, namespace: str, pod: str, port: int) -> None:
        self.configuration = configuration
        self.namespace = namespace
        self.pod = pod
        self.port = port
        self.where = f"pod {namespace}/{pod} port {port}"

    def __call__(self, timeout_s: float) -> socket.socket:
        websocket = WebSocket(sslopt=self._ssl_options(), skip_utf8_validation=True)
        try:
            websocket.connect(
                forward_url(self.configuration.host, self.namespace, self.pod, self.port),
                header=self._headers(),
                timeout=timeout_s,
            )
        except WebSocketBadStatusException as exc:
            websocket.close()
            raise AgentUnavailable(refusal_message(exc.status_code, self.namespace, self.pod), delivered=False) from None
        except (WebSocketException, OSError) as exc:
            websocket.close()
            raise AgentUnavailable(f"the Kubernetes API did not open a port-forward to {self.where}: {exc!r}", delivered=False) from None
        # The proxy thread waits in select(); a timeout left on the socket would cut a frame
        # that arrives in pieces.
        websocket.settimeout(None)
        forward = PortForward(websocket, [self.port])
        # The socketpair end itself (the library wraps it to ignore TCP options): asyncio
        # needs a real socket.
        sock = forward.socket(self.port)._socket
        sock.settimeout(timeout_s)
        return sock

    def _headers(self) -> list[str]:
        headers = [f"sec-websocket-protocol: {V5_CHANNEL_PROTOCOL},{V4_CHANNEL_PROTOCOL}"]
        # The credentials as the client's REST calls send them (a bearer token, refreshed by
        # the in-cluster loader when it rotates).
        for auth in self.configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers.append(f"{auth['key']}: {auth['value']}")
        return headers

    def _ssl_options(self) -> dict[str, object]:
        config = self.configuration
        if config.verify_ssl:
            options: dict[str, object] = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": config.ssl_ca_cert or certifi.where()}
            if config.assert_hostname is not None:
                options["check_hostname"] = config.assert_hostname
        else:
            options = {"cert_reqs": ssl.CERT_NONE}
        if config.cert_file:
            options["certfile"] = config.cert_file
        if config.key_file:
            options["keyfile"] = config.key_file
        if config.tls_server_name:
            options["server_hostname"] = config.tls_server_name
        return options
