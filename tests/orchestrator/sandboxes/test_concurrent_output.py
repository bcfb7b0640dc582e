"""Issue 14 item 15: no `shell` answer claims output it lost. Many concurrent calls in one
sandbox while a CPU hog loads every core; each call must come back with its own line, or
say plainly that it failed; never `exit_code 0` with empty or foreign stdout.

The scenario takes the client and the service; the docker test runs it with a container
(`tests/orchestrator/sandboxes/docker/test_concurrent_output.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.agent_env import Served, serving
from tests.api_calls import MEMBER, group_session, start_run, tool
from tests.conftest import make_settings
from tests.uid_block import block

# A uid block of its own (tests/uid_block.py): agents sweep every process of their uid.
UID_BLOCK = block(7)
CALLS = int(os.environ.get("STRESS_CALLS", 64))
STRESSED = {**UID_BLOCK, "user_max_concurrent_calls": CALLS, **({"sandbox_cpus": float(os.environ["STRESS_CPUS"])} if "STRESS_CPUS" in os.environ else {})}
ROUNDS = int(os.environ.get("STRESS_ROUNDS", 2))
HOG = "import os\nfor _ in range(os.cpu_count() or 1):\n    if os.fork() == 0:\n        break\nwhile True: pass\n"


@contextmanager
def cpu_hog() -> Iterator[None]:
    """One busy process per core (a process group of their own), stopped afterwards."""
    hog = subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True)
    try:
        yield
    finally:
        os.killpg(hog.pid, 9)
        hog.wait()


def _one(client: TestClient, run_id: str, n: int) -> tuple[int, dict]:
    # The second line comes from a child process: its output reaches the pipe only through
    # another writer, and a sweep that took a concurrent call's processes would lose it.
    return n, tool(client, run_id, "shell", command=f"echo hello-{n}; /bin/echo child-{n}")


def concurrent_calls_keep_their_output(client: TestClient, service: OrchestratorService) -> None:
    sid = group_session(client)
    run = start_run(client, sid, trigger="group_message", speaker_user_id=MEMBER)
    assert tool(client, run["run_id"], "shell", command="true")["ok"]  # the sandbox is up
    bad: list[str] = []
    with cpu_hog(), ThreadPoolExecutor(CALLS) as pool:
        for _ in range(ROUNDS):
            for n, answer in pool.map(lambda n: _one(client, run["run_id"], n), range(CALLS)):
                result = answer.get("result") or {}
                if answer["ok"] and result.get("exit_code") == 0:
                    if result["stdout"] != f"hello-{n}\nchild-{n}\n" or result.get("output_complete") is False:
                        bad.append(f"call {n} claimed success with {result!r}")
                elif answer["ok"] and result.get("output_complete") is not False:
                    bad.append(f"call {n} failed without saying its output is incomplete: {result!r}")
                elif not answer["ok"]:
                    bad.append(f"call {n}: {answer['error']!r}")
    assert bad == [], f"{len(bad)} of {CALLS * ROUNDS} calls: " + "\n".join(bad[:5])


@pytest.fixture
def stressed(agent_data_dir: Path) -> Iterator[Served]:
    with serving(make_settings(agent_data_dir, **STRESSED)) as served:
        yield served


def test_item15_concurrent_shell_calls_keep_their_output_under_load(stressed: Served) -> None:
    concurrent_calls_keep_their_output(*stressed)
