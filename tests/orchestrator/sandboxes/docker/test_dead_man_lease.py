"""The dead-man switch rests on the orchestrator's lease, not on the tenant's good will.

A hostile sandbox can read its own agent token and call its own agent, and it can SIGSTOP or
kill its agent. Neither may keep its container alive once no orchestrator renews the lease:
the container's PID 1 (the sandbox supervisor, which no process of the sandbox can signal,
trace or read) ends it when the lease has expired. While the orchestrator lives it renews the
lease, and the container runs on."""

from __future__ import annotations

import json
import time
from pathlib import Path

import docker
import pytest

from orchestrator.service import OrchestratorService
from sandbox_agent.wire import CallContext
from tests.agent_env import blocking_call
from tests.orchestrator.sandboxes.docker.conftest import docker_settings
from tests.orchestrator.sandboxes.docker.test_lifecycle import backend_of, sandbox_user, the_container, workdir

pytestmark = [pytest.mark.docker, pytest.mark.slow]

KEEPER = 17  # calls its own agent with its own token, forever
FREEZER = 18  # SIGSTOPs its own agent, whose idle timer then never runs
KILLER = 19  # kills its own agent: the container ends with it, nothing of the sandbox stays


def keep_alive_command(token_path: Path, socket_path: Path, cwd: str) -> str:
    """A background process of the tenant that calls its own agent every half second, the
    way the red team kept its sandbox alive: the agent counts each as a call."""
    return f"""python3 - <<'PY'
import socket, time
token = open({str(token_path)!r}).read().strip().encode()
body = {json.dumps({"arguments": {"path": "."}, "cwd": cwd}).encode()!r}
while True:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect({str(socket_path)!r})
        s.sendall(b"POST /v1/tools/list_dir HTTP/1.1\\r\\nHost: agent\\r\\nAuthorization: Bearer " + token
                  + b"\\r\\nContent-Type: application/json\\r\\nConnection: close\\r\\nContent-Length: "
                  + str(len(body)).encode() + b"\\r\\n\\r\\n" + body)
        print(s.recv(200)[:12], flush=True)
        s.close()
    except OSError as exc:
        print(exc, flush=True)
    time.sleep(0.5)
PY"""


def session_context(service: OrchestratorService, user_id: int) -> CallContext:
    """Background processes belong to a session (the one `workdir` made)."""
    return CallContext(run_id="r1", session_id="s1", output_dir=str(service.layout.shell_output_dir(user_id, "s1")))


def _running_after(container, seconds: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        container.reload()
        if container.status != "running":
            return False
        time.sleep(0.2)
    return True


def test_neither_calling_freezing_nor_killing_its_own_agent_keeps_an_orphaned_sandbox_alive(
    docker_data_dir: Path, sandbox_image: str, engine: docker.DockerClient
) -> None:
    # Dead-man limit: 1.5 + 0.5 = 2 s. No reaper runs (service.start() is never called), so
    # nothing but the lease and the sandbox's own logic can stop a container here.
    settings = docker_settings(docker_data_dir, sandbox_image, idle_timeout_s=1.5, dead_man_margin_s=0.5)
    service = OrchestratorService(settings)
    try:
        backend = backend_of(service)
        keeper, freezer = sandbox_user(service, KEEPER), sandbox_user(service, FREEZER)
        cwd = workdir(service, KEEPER)
        layout = service.layout
        started = blocking_call(
            backend, keeper, "process_start",
            {"command": keep_alive_command(layout.token_path(KEEPER), layout.socket_path(KEEPER), cwd)},
            cwd=cwd, context=session_context(service, KEEPER),
        )  # fmt: skip
        assert started, started
        agent_pid = backend.ensure(freezer).blocking.health().pid
        freeze = blocking_call(
            backend, freezer, "process_start", {"command": f"sleep 1; kill -STOP {agent_pid}"},
            cwd=workdir(service, FREEZER), context=session_context(service, FREEZER),
        )
        assert freeze, freeze
        killer = sandbox_user(service, KILLER)
        killed_pid = backend.ensure(killer).blocking.health().pid
        kill = blocking_call(
            backend, killer, "process_start", {"command": f"sleep 1; kill -KILL {killed_pid}"},
            cwd=workdir(service, KILLER), context=session_context(service, KILLER),
        )  # fmt: skip
        assert kill, kill
        kept, frozen = the_container(engine, service, KEEPER), the_container(engine, service, FREEZER)
        killed = the_container(engine, service, KILLER)
        # While the orchestrator lives its lease is renewed: both run on past the limit.
        time.sleep(4)
        kept.reload(), frozen.reload(), killed.reload()
        assert kept.status == frozen.status == "running"
        assert killed.status == "exited" and killed.attrs["State"]["ExitCode"] == 137  # replaced at the next call
    finally:
        service.close()  # the orchestrator is gone: nobody renews the lease any more
    assert not _running_after(kept, 12), "the tenant kept its sandbox alive by calling its own agent"
    assert not _running_after(frozen, 6), "a frozen agent kept its sandbox alive"
    for container in (kept, frozen):
        assert container.attrs["State"]["ExitCode"] == 0, container.attrs["State"]  # a clean, expected stop
