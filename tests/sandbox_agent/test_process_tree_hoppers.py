"""The end-of-call sweep (sandbox_agent/process_tree.py), in a docker sandbox and in a
process-backend one, attacked by fork-hoppers: processes that fork their successor, leave for
a session of their own and exit, over and over, with their environment wiped (no call marker).
A sweep that only reads /proc and signals the pids it found loses to them (each has forked the
next and gone); the sweep freezes the sandbox uid first (`kill(-1, SIGSTOP)`, atomic with
respect to fork), so none outlives its call. Written by a red-team pass as an independent
attack; it failed (as a strict xfail) before the freeze landed and passes since."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.agent_env import agent_data_dir  # noqa: F401
from tests.orchestrator.sandboxes.docker.conftest import (  # noqa: F401
    docker_client,
    docker_data_dir,
    docker_service,
    sandbox_image,
    sandbox_runtime,
)
from tests.orchestrator.sandboxes.test_process_lifetime import new_run, served, tool

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids need a root orchestrator")]

# Hops for 30 s at most, so a failing run does not leave it behind for long; each generation
# adds a byte to `hops` in the call's working directory (the host watches the file).
HOPPER = """
import os, time
log = os.open("hops", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
end = time.monotonic() + 30
while time.monotonic() < end:
    try:
        if os.fork():
            os._exit(0)
        os.setsid()
        os.write(log, b"x")
    except OSError:
        time.sleep(0.01)
"""


def hoppers(count: int) -> str:
    """`count` hoppers at once, started from the call's own shell with the environment wiped.
    More is not surer: their exited generations are zombies until the agent reaps them, and a
    hopper that meets the process limit waits (and is caught) until a sweep reaps some."""
    return (
        f"cat > hop.py <<'EOF'{HOPPER}EOF\n"
        f'for i in $(seq {count}); do env -i /usr/bin/python3 hop.py >/dev/null 2>&1 & done; sleep 0.5; echo "$PWD"'
    )


def no_hopper_outlives_its_call(client: TestClient, count: int, attempts: int = 3) -> None:
    """The attack is made `attempts` times (a scan alone wins the race now and then): no hopper
    may outlive its call."""
    run_id = new_run(client)
    for _ in range(attempts):
        started = tool(client, run_id, "shell", {"command": hoppers(count)})
        hops = Path(started["stdout"].strip()) / "hops"
        assert hops.exists() and hops.stat().st_size > 0, "the hopper did not get going"
        # The call has returned: its sweep is done. A second call sweeps once more.
        assert tool(client, run_id, "shell", {"command": "echo next"})["stdout"] == "next\n"
        size = hops.stat().st_size
        time.sleep(1.0)
        assert hops.stat().st_size == size, "the hopper outlived its call and the next call's sweep"


@pytest.mark.docker
def test_a_fork_hopper_does_not_outlive_its_call_in_a_container(docker_client: TestClient) -> None:
    no_hopper_outlives_its_call(docker_client, 4)


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_a_fork_hopper_does_not_outlive_its_call_in_a_process_sandbox(agent_data_dir: Path, sandbox: str) -> None:
    with served(agent_data_dir, process_sandbox=sandbox) as (client, _backend, _service):
        no_hopper_outlives_its_call(client, 8)
