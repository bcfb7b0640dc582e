"""Reaching an agent in a pod through the Kubernetes API: each connection of the agent's
clients is one port-forward (a websocket to the API server, which the kubelet joins to the
agent's port on the pod's loopback). It works on any cluster, whether or not pod IPs are
reachable from the orchestrator, and needs only `pods/portforward` in the namespace.

A thread per forward (`_Relay`) copies between the websocket and one end of a socketpair,
whose other end the agent's clients use as their socket. Not the official client's
`PortForward`: whatever answers on the pod's port may be the sandbox's own code, and that
one buffers without bound what the pod sends faster than the orchestrator reads (an idle
pooled connection reads nothing), and blocks for good on a pod that stops reading (its
thread then outlives the connection by the kubelet's 4-hour stream timeout). `_Relay` holds
at most `RELAY_BUFFER_BYTES` each way (then it stops reading that side: the pressure goes
back to the pod, or to the caller), ends when the caller closes its end, and gives up on a
side that takes no bytes for `RELAY_STALL_S`. The websocket itself is opened here rather
than through `kubernetes.stream.portforward`, which sets no timeout: a stalled API server
would hold a caller forever. A refusal by the API server (RBAC, no such pod) is an
`AgentUnavailable` that says which, with nothing sent.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
from urllib.parse import quote

import certifi
from kubernetes.client import Configuration
from kubernetes.stream.ws_client import V4_CHANNEL_PROTOCOL, V5_CHANNEL_PROTOCOL
from websocket import ABNF, WebSocket, WebSocketBadStatusException, WebSocketException

from orchestrator.log import kv
from sandbox_agent.errors import AgentUnavailable

log = logging.getLogger(__name__)

RELAY_BUFFER_BYTES = 1024 * 1024  # held per direction of one forward, at most (plus one frame)
RELAY_READ_BYTES = 64 * 1024  # read from the caller's end at a time (one websocket frame)
# A side that takes no bytes for this long ends the forward (longer than a raw answer may
# wait for a transfer slot, ORCH_TRANSFER_WAIT_S, while its reading is paused).
RELAY_STALL_S = 60.0
DATA_CHANNEL, ERROR_CHANNEL = 0, 1  # of the one port forwarded


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
        # The relay waits in select(); this bounds a frame that stops arriving half-way and a
        # send the API server takes nothing of (the pod does not read).
        websocket.settimeout(RELAY_STALL_S)
        ours, theirs = socket.socketpair()
        _Relay(websocket, theirs, self.port, self.where).start()
        ours.settimeout(timeout_s)
        return ours

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


class _Relay(threading.Thread):
    """Copies between one port-forward's websocket and the relay's end of a socketpair, with
    bounded buffers both ways; ends (closing both) when either side closes or fails."""

    def __init__(self, websocket: WebSocket, local: socket.socket, port: int, where: str) -> None:
        super().__init__(name=f"port-forward {where}", daemon=True)
        self.websocket = websocket
        self.local = local
        self.port = port
        self.where = where
        self.to_caller = bytearray()  # from the pod, not yet taken by the caller
        self.to_pod = bytearray()  # from the caller, framed, not yet taken by the API server
        self.initialized = [False, False]  # each channel's first frame names the port

    def run(self) -> None:
        try:
            self.local.setblocking(False)
            while self._step():
                pass
        except (OSError, WebSocketException, ValueError) as exc:
            log.debug("port-forward ended %s", kv(where=self.where, error=repr(exc)))
        finally:
            self.local.close()
            # No closing handshake: its frame could wait for good behind bytes the pod never
            # reads. The API server sees the connection end and closes the stream.
            self.websocket.shutdown()

    def _step(self) -> bool:
        """One wait and what it allows; False when the forward is over."""
        remote = self.websocket.sock
        if remote is None:
            return False
        # The caller's close is seen even while its direction is full (POLLRDHUP).
        local_events = select.POLLRDHUP | (select.POLLIN if len(self.to_pod) < RELAY_BUFFER_BYTES else 0)
        local_events |= select.POLLOUT if self.to_caller else 0
        remote_events = (select.POLLIN if len(self.to_caller) < RELAY_BUFFER_BYTES else 0) | (
            select.POLLOUT if self.to_pod else 0
        )
        # TLS may hold decrypted bytes poll() cannot see.
        pending = remote_events & select.POLLIN and isinstance(remote, ssl.SSLSocket) and remote.pending() > 0
        poller = select.poll()
        poller.register(self.local, local_events)
        poller.register(remote, remote_events)
        events = dict(poller.poll(0 if pending else RELAY_STALL_S * 1000))
        if not events and not pending:
            # Nothing moved for RELAY_STALL_S: over if bytes wait for a side that takes none.
            return not (self.to_caller or self.to_pod)
        local, theirs = events.get(self.local.fileno(), 0), events.get(remote.fileno(), 0)
        if local & (select.POLLRDHUP | select.POLLHUP | select.POLLERR):
            return False  # the caller is done (or gave up): nothing of it is delivered later
        if theirs & (select.POLLHUP | select.POLLERR) and not theirs & select.POLLIN:
            return False
        if local & select.POLLIN:
            data = self.local.recv(RELAY_READ_BYTES)
            if not data:
                return False
            self.to_pod += ABNF.create_frame(bytes((DATA_CHANNEL,)) + data, ABNF.OPCODE_BINARY).format()
        if (theirs & select.POLLIN or pending) and not self._receive():
            return False
        if local & select.POLLOUT:
            try:
                sent = self.local.send(self.to_caller)
            except BlockingIOError:
                sent = 0
            del self.to_caller[:sent]
        if theirs & select.POLLOUT:
            sent = remote.send(bytes(self.to_pod[: 16 * 1024]))  # at most one TLS record
            del self.to_pod[:sent]
        return True

    def _receive(self) -> bool:
        opcode, frame = self.websocket.recv_data_frame(True)
        if opcode == ABNF.OPCODE_CLOSE:
            return False
        if opcode != ABNF.OPCODE_BINARY:
            return True  # a ping (answered by the library) or a pong
        data = frame.data
        if not data or data[0] > ERROR_CHANNEL:
            raise ValueError(f"a port-forward frame on channel {data[:1]!r}")
        channel = data[0]
        if not self.initialized[channel]:
            if len(data) != 3 or data[1] + data[2] * 256 != self.port:
                raise ValueError("a port-forward's first frame does not name its port")
            self.initialized[channel] = True
        elif channel == ERROR_CHANNEL:
            # The kubelet could not reach the port (nothing listens): the caller sees the end.
            log.info("port-forward refused %s", kv(where=self.where, error=data[1:300].decode("utf-8", "replace")))
            return False
        else:
            self.to_caller += data[1:]
        return True
