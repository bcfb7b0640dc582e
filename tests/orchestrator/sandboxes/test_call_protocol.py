"""The one sandbox call protocol (orchestrator/sandboxes/calling.py) with real process-backend
agents: a call whose agent dies mid-way says only that it may have run (the docker backend's
words: tests/orchestrator/sandboxes/docker/test_lifecycle.py), and a call that never reached
its agent is sent once more, to a fresh one."""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from orchestrator.errors import ToolError
from orchestrator.service import OrchestratorService
from tests.orchestrator.sandboxes.call_wording import died_mid_call

USER = 17


def workdir(service: OrchestratorService) -> str:
    return str(service.directories.ensure_session_runtime(USER, "s1", is_owner=True))


def agent_pid(service: OrchestratorService) -> int:
    (status,) = service.sandboxes.status()
    return status.detail["pid"]  # type: ignore[index]


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


def dead(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("path", ["async", "blocking"])
def test_a_call_whose_agent_is_killed_mid_way_says_only_that_it_may_have_run(
    agent_service: OrchestratorService, path: str
) -> None:
    cwd = workdir(agent_service)
    call(agent_service, path, "list_dir", {"path": "."}, cwd)
    pid = agent_pid(agent_service)
    outcome: dict[str, object] = {}

    def long_shell() -> None:
        try:
            outcome["answer"] = call(agent_service, path, "shell", {"command": "touch started; sleep 30"}, cwd)
        except ToolError as exc:
            outcome["error"] = exc

    caller = threading.Thread(target=long_shell)
    caller.start()
    wait_for((Path(cwd) / "started").exists, "the shell call did not start")
    os.kill(pid, signal.SIGKILL)  # the agent dies while the shell runs in it
    caller.join(20)
    assert not caller.is_alive()
    error = outcome.get("error")
    assert isinstance(error, ToolError), outcome
    assert error.code == "sandbox_unavailable"
    assert error.message == died_mid_call(USER)
    assert "did not run" not in error.message
    # The next call gets a fresh agent.
    assert call(agent_service, path, "list_dir", {"path": "."}, cwd)["path"] == cwd
    assert agent_pid(agent_service) != pid


@pytest.mark.parametrize("path", ["async", "blocking"])
def test_a_call_that_never_reached_its_agent_is_sent_once_more_to_a_fresh_one(
    agent_service: OrchestratorService, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    cwd = workdir(agent_service)
    socket = agent_service.layout.socket_path(USER)
    # The user's own shell removes its agent's socket: the agent lives on, but no new
    # connection reaches it, so the next request is certainly not delivered.
    assert call(agent_service, path, "shell", {"command": f"rm {socket}"}, cwd)["exit_code"] == 0
    first = agent_pid(agent_service)
    if path == "blocking":
        time.sleep(3.2)  # the blocking client reuses a connection idle for at most 3 s
    with caplog.at_level(logging.WARNING, logger="orchestrator.sandboxes.calling"):
        answer = call(agent_service, path, "shell", {"command": "echo run >> runs.txt"}, cwd)
    assert answer["exit_code"] == 0
    assert (Path(cwd) / "runs.txt").read_text() == "run\n"  # ran exactly once
    assert agent_pid(agent_service) != first
    wait_for(lambda: dead(first), "the unreachable agent was not stopped")
    retried = [r for r in caplog.records if "was unreachable" in r.getMessage()]
    assert len(retried) == 1, [r.getMessage() for r in caplog.records]
