"""Attacks on the port-forward to a pod's agent, as a hostile sandbox makes them: its own code
runs as the agent's uid in the pod (it can kill or ptrace its agent: the node has no Yama
restriction), so whatever answers on a port of the pod's loopback may lie. Here the
sandbox's shell starts such listeners on ports of its own (the forward behaves the same
whatever port it joins), and the orchestrator's forwarder and blocking client talk to them:

- a listener that floods a connection nobody reads: the orchestrator must not buffer it
  without bound (its memory is everybody's);
- a listener that never reads what it is sent: the forward's thread must end once the
  orchestrator gave up, not stay blocked on the API server for hours;
- a listener that trickles an answer a byte at a time: a call's deadline is its whole
  duration, not the time between two bytes (a host tool's thread is everybody's too).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psutil
import pytest
from kubernetes import client

from orchestrator.service import OrchestratorService
from orchestrator.sandboxes.kubernetes import KubernetesBackend
from orchestrator.sandboxes.kubernetes_forward import PodPortForwarder
from orchestrator.sandboxes.kubernetes_spec import pod_name
from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentTimedOut, AgentUnavailable
from tests.api_calls import OWNER, group_session, start_run, tool
from tests.orchestrator.sandboxes.kubernetes.conftest import served

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

FLOOD, SINK, TRICKLE = 7101, 7102, 7103

# What the sandbox runs: three listeners on its loopback, like a taken-over agent.
HOSTILE = f"""
import os, socket, threading, time

def serve(port, handle):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()

def flood(conn):  # endless bytes, whatever was asked; how many went out, in flood.count
    chunk = b"x" * (64 << 10)
    sent = 0
    try:
        while True:
            conn.sendall(chunk)
            sent += len(chunk)
            with open("flood.count.tmp", "w") as out:
                out.write(str(sent))
            os.replace("flood.count.tmp", "flood.count")
    except OSError:
        conn.close()

def sink(conn):  # never reads, never answers
    time.sleep(3600)

def trickle(conn):  # reads the request, then answers one byte a second
    conn.recv(65536)
    answer = b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\n" + b"X-Pad: " + b"a" * 60000 + b"\\r\\n\\r\\n"
    try:
        for byte in answer:
            conn.sendall(bytes([byte]))
            time.sleep(0.5)
    except OSError:
        conn.close()

for port, handle in (({FLOOD}, flood), ({SINK}, sink), ({TRICKLE}, trickle)):
    threading.Thread(target=serve, args=(port, handle), daemon=True).start()
print("listening", flush=True)
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def hostile_pod(kube: client.CoreV1Api, k8s_namespace: str, k8s_image: str) -> Iterator[tuple[OrchestratorService, str]]:
    """One user's real pod (made by its first call) whose sandbox runs the listeners above."""
    with served(kube, k8s_namespace, k8s_image) as (api, service):
        run = start_run(api, group_session(api), trigger="web")["run_id"]
        assert tool(api, run, "write_file", path="hostile.py", content=HOSTILE)["ok"]
        started = tool(api, run, "process_start", command="python3 hostile.py")
        assert started["ok"], started
        pod = pod_name(backend_of(service).instance, OWNER)
        wait_listening(forwarder(service, pod, FLOOD))  # the three listeners start together
        yield service, pod


def backend_of(service: OrchestratorService) -> KubernetesBackend:
    backend = service.sandboxes.backends["kubernetes"]
    assert isinstance(backend, KubernetesBackend)
    return backend


def forwarder(service: OrchestratorService, pod: str, port: int) -> PodPortForwarder:
    backend = backend_of(service)
    return PodPortForwarder(backend.configuration, backend.namespace, pod, port)


def wait_listening(connect: PodPortForwarder) -> None:
    """The listener answers (the sandbox's process may take a moment to bind)."""
    deadline = time.monotonic() + 20
    while True:
        sock = connect(5.0)
        try:
            sock.settimeout(2.0)
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
            if sock.recv(1):
                return
        except OSError:
            pass
        finally:
            sock.close()
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing listens at {connect.where}")
        time.sleep(0.5)


def rss() -> int:
    return psutil.Process().memory_info().rss


def forward_threads(port: int) -> set[threading.Thread]:
    """The threads of port-forwards to `port` (the library's and ours name it)."""
    return {t for t in threading.enumerate() if "port" in t.name.lower() and t.name.endswith(str(port))}


def flooded(service: OrchestratorService) -> int:
    """Bytes the flood listener got rid of so far (it counts them in its home, on the host)."""
    try:
        return int((service.layout.home_dir(OWNER) / "flood.count").read_text() or 0)
    except FileNotFoundError:
        return 0


def test_a_flood_on_an_unread_connection_is_not_buffered_without_bound(hostile_pod: tuple[OrchestratorService, str]) -> None:
    service, pod = hostile_pod
    sock = forwarder(service, pod, FLOOD)(5.0)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\n\r\n")
        # The agent floods; the orchestrator reads nothing (an idle pooled connection). Once
        # the bounded buffers on the way are full, the flood must stall: nobody takes more.
        time.sleep(5.0)
        early = flooded(service)
        time.sleep(4.0)
        late = flooded(service)
    finally:
        sock.close()
    assert late - early < 1024 * 1024, f"the orchestrator took {(late - early) >> 20} MiB more of an unread flood in 4 s"


def test_the_forward_ends_when_the_orchestrator_gives_up_on_an_agent_that_reads_nothing(
    hostile_pod: tuple[OrchestratorService, str],
) -> None:
    service, pod = hostile_pod
    connect = forwarder(service, pod, SINK)
    baseline = forward_threads(SINK)
    body = b"x" * (64 << 20)  # a large write_file, say, to an agent that never reads it
    before = rss()
    sock = connect(5.0)
    sock.settimeout(3.0)
    pushed = 0
    try:
        while pushed < len(body):  # the forward pushes back, as a socket to a peer that does not read
            pushed += sock.send(body[pushed : pushed + (1 << 20)])
    except TimeoutError:
        pass
    buffered = rss() - before
    sock.close()
    deadline = time.monotonic() + 15
    while (left := forward_threads(SINK) - baseline) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"a port-forward thread outlived its connection: {left}"
    assert buffered < 48 * 1024 * 1024, f"the forward took {buffered >> 20} MiB of a request nobody read"


def test_a_trickled_answer_ends_at_the_calls_deadline(hostile_pod: tuple[OrchestratorService, str]) -> None:
    service, pod = hostile_pod
    connect = forwarder(service, pod, TRICKLE)
    agent = AgentClient(connect.where, "t" * 43, connector=connect)
    failures: list[BaseException] = []

    def health() -> None:
        try:
            agent.health(timeout_s=3.0)
        except BaseException as exc:  # noqa: BLE001 - what it ended with is the result
            failures.append(exc)

    caller = threading.Thread(target=health, daemon=True)  # a host tool's thread, say
    caller.start()
    caller.join(timeout=10.0)
    alive = caller.is_alive()
    agent.close()
    assert not alive, "a trickled answer held the caller past its deadline"
    assert len(failures) == 1 and isinstance(failures[0], (AgentTimedOut, AgentUnavailable)), failures
