"""The one sandbox call protocol (orchestrator/sandboxes/calling.py) with real agents of the
process backend and of the kubernetes backend (pods on the test cluster): a call whose agent
dies mid-way says only that it may have run (the docker backend's words:
tests/orchestrator/sandboxes/docker/test_lifecycle.py), and a call that never reached its
agent is sent once more, to a fresh one."""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from kubernetes import client
from kubernetes.stream import stream

from orchestrator.errors import ToolError
from orchestrator.sandboxes.kubernetes_api import kube_configuration
from orchestrator.service import OrchestratorService
from orchestrator.settings import KubernetesSettings
from sandbox_agent.client import REUSE_IDLE_S
from sandbox_agent.errors import ToolFailure
from tests.orchestrator.sandboxes.call_wording import died_mid_call
from tests.orchestrator.sandboxes.kubernetes.conftest import k8s_image, k8s_namespace, k8s_settings, kube, separate_uid_block  # noqa: F401 - fixtures
from tests.orchestrator.sandboxes.kubernetes.life_env import data_dir, ended

USER = 17
BACKENDS = ["process", pytest.param("kubernetes", marks=[pytest.mark.k8s, pytest.mark.slow])]


@pytest.fixture(scope="module")
def k8s_protocol_service(k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api) -> Iterator[OrchestratorService]:  # noqa: F811
    """One service for the module's kubernetes cases (a pod start costs ~2 s)."""
    with data_dir() as data:
        settings = k8s_settings(data, k8s_namespace, k8s_image)
        # A uid block of its own: the process cases' services start while this one lives.
        service = OrchestratorService(k8s_settings(data, k8s_namespace, k8s_image, **separate_uid_block(settings, 1)))
        try:
            yield service
        finally:
            service.close()
            kube.delete_collection_namespaced_pod(k8s_namespace, grace_period_seconds=0)


@pytest.fixture(params=BACKENDS)
def service(request: pytest.FixtureRequest) -> OrchestratorService:
    return request.getfixturevalue("agent_service" if request.param == "process" else "k8s_protocol_service")


def workdir(service: OrchestratorService) -> str:
    return str(service.directories.ensure_session_runtime(USER, "s1", is_owner=True))


def agent_of(service: OrchestratorService) -> int | str:
    """Which agent serves the user: its pid (process backend), its pod's uid (kubernetes)."""
    (status,) = [s for s in service.sandboxes.status() if s.state != "stopped"]
    return status.detail["pid"] if status.backend == "process" else status.detail["pod_uid"]  # type: ignore[index]


def pod_of(service: OrchestratorService) -> tuple[str, str]:
    (status,) = [s for s in service.sandboxes.status() if s.state != "stopped"]
    return status.detail["namespace"], status.detail["pod"]  # type: ignore[index]


def kill_agent(service: OrchestratorService, agent: int | str) -> None:
    """SIGKILL the user's agent from outside its calls: the process, or the agent in the pod
    through the API's exec (as `kubectl exec` would; the pod's uid may signal its agent)."""
    if isinstance(agent, int):
        os.kill(agent, signal.SIGKILL)
        return
    namespace, pod = pod_of(service)
    program = (
        "import os\n"
        "for p in filter(str.isdigit, os.listdir('/proc')):\n"
        "    if b'-m\\0sandbox_agent\\0' in open(f'/proc/{p}/cmdline', 'rb').read(): os.kill(int(p), 9)"
    )
    with client.ApiClient(kube_configuration(KubernetesSettings.of(service.settings))) as api:
        session = stream(
            client.CoreV1Api(api).connect_get_namespaced_pod_exec, pod, namespace, container="sandbox",
            command=["python3", "-c", program], stderr=True, stdin=False, stdout=True, tty=False,
            _preload_content=False,
        )  # fmt: skip
        # Not waited for to its end: the exec of a container whose main process died may
        # never be closed by the kubelet.
        session.run_forever(timeout=2)
        session.close()


def make_unreachable(service: OrchestratorService, cwd: str) -> None:
    """The agent's next connection certainly reaches no agent: the user's own shell removes
    its socket (the agent lives on), or the pod is deleted (`kubectl delete pod`)."""
    if service.settings.backend != "kubernetes":
        socket = service.layout.socket_path(USER)
        assert call(service, "blocking", "shell", {"command": f"rm {socket}"}, cwd)["exit_code"] == 0
        return
    namespace, pod = pod_of(service)
    with client.ApiClient(kube_configuration(KubernetesSettings.of(service.settings))) as api:
        core = client.CoreV1Api(api)
        core.delete_namespaced_pod(pod, namespace)
        wait_for(lambda: ended(core, namespace, pod), "the deleted pod's agent did not end", 30)


def call(service: OrchestratorService, path: str, tool: str, arguments: dict[str, Any], cwd: str) -> Any:
    """Through the router as the server calls it: on the event loop (`call`, each time on a
    loop of its own, so on a new connection) or from a worker thread (`call_blocking`)."""
    router = service.sandboxes
    if path == "async":
        return anyio.run(functools.partial(router.call, USER, tool, arguments, cwd=cwd))
    return router.call_blocking(USER, tool, arguments, cwd=cwd)


def wait_for(condition: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def dead(service: OrchestratorService, agent: int | str) -> bool:
    if isinstance(agent, int):
        return not psutil.pid_exists(agent) or psutil.Process(agent).status() == psutil.STATUS_ZOMBIE
    return all(s.detail.get("pod_uid") != agent or s.state == "stopped" for s in service.sandboxes.status())  # type: ignore[union-attr]


@pytest.mark.parametrize("path", ["async", "blocking"])
def test_a_call_whose_agent_is_killed_mid_way_says_only_that_it_may_have_run(service: OrchestratorService, path: str) -> None:
    cwd = workdir(service)
    call(service, path, "list_dir", {"path": "."}, cwd)
    agent = agent_of(service)
    outcome: dict[str, object] = {}

    def long_shell() -> None:
        try:
            outcome["answer"] = call(service, path, "shell", {"command": "touch started; sleep 30"}, cwd)
        except ToolError as exc:
            outcome["error"] = exc

    (Path(cwd) / "started").unlink(missing_ok=True)
    caller = threading.Thread(target=long_shell)
    caller.start()
    wait_for((Path(cwd) / "started").exists, "the shell call did not start")
    kill_agent(service, agent)  # the agent dies while the shell runs in it
    caller.join(20)
    assert not caller.is_alive()
    error = outcome.get("error")
    assert isinstance(error, ToolError), outcome
    assert error.code == "sandbox_unavailable"
    assert error.message == died_mid_call(USER)
    assert "did not run" not in error.message
    # The next call gets a fresh agent.
    assert call(service, path, "list_dir", {"path": "."}, cwd)["path"] == cwd
    assert agent_of(service) != agent


@pytest.mark.parametrize("path", ["async", "blocking"])
def test_a_call_that_never_reached_its_agent_is_sent_once_more_to_a_fresh_one(
    service: OrchestratorService, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    cwd = workdir(service)
    (Path(cwd) / "runs.txt").unlink(missing_ok=True)
    call(service, path, "list_dir", {"path": "."}, cwd)
    first = agent_of(service)
    made_at = time.monotonic()
    make_unreachable(service, cwd)
    if path == "blocking":  # the blocking client reuses a connection idle for at most 3 s
        time.sleep(max(0.0, REUSE_IDLE_S + 0.2 - (time.monotonic() - made_at)))
    with caplog.at_level(logging.WARNING, logger="orchestrator.sandboxes.calling"):
        answer = call(service, path, "shell", {"command": "echo run >> runs.txt"}, cwd)
    assert answer["exit_code"] == 0
    assert (Path(cwd) / "runs.txt").read_text() == "run\n"  # ran exactly once
    assert agent_of(service) != first
    wait_for(lambda: dead(service, first), "the unreachable agent was not stopped")
    retried = [r for r in caplog.records if "was unreachable" in r.getMessage()]
    assert len(retried) == 1, [r.getMessage() for r in caplog.records]


def test_a_tools_failure_is_the_calls_value_and_raised_only_for_a_thread(agent_service: OrchestratorService) -> None:
    """The agent's `{"ok": false, "error": ...}` is returned, not raised, on the loop's road to
    the dispatcher; a host tool's thread (`call_blocking`) gets it raised, with the same body."""
    cwd = workdir(agent_service)
    failure = call(agent_service, "async", "read_file", {"path": "missing.txt"}, cwd)
    assert isinstance(failure, ToolFailure), failure
    assert failure.code == "not_found" and failure.path == f"{cwd}/missing.txt"
    with pytest.raises(ToolError) as raised:
        call(agent_service, "blocking", "read_file", {"path": "missing.txt"}, cwd)
    assert raised.value.body() == failure.body()
