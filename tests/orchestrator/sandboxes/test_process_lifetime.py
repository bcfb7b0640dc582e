"""A process-backend sandbox's lifetime and share of the host are kernel facts (its cgroup, bwrap's
PID namespace), attacked the way a hostile sandbox would: a fork-hopper outliving the stop, a
busy hopper running on through a pause, memory and /dev/shm filled past their bounds."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.sandboxes.cgroups import SandboxCgroups, SandboxLimits
from orchestrator.sandboxes.process import ProcessBackend
from orchestrator.service import OrchestratorService
from tests.conftest import API_TOKEN, admin_headers, make_settings
from tests.orchestrator.sandboxes.test_bwrap import bwrap_problem

USER, OTHER = 17, 18
# A hopper's exited generations are zombies until the agent reaps them, and they count against
# the sandbox uid's process limit: a small limit keeps their number (and the test's) small.
HOPPER_PIDS = 200

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids and cgroups need root")

# The process process_start started stays (the agent keeps it and its descendants); its child
# hops: each generation forks its successor, which leaves for a session (and process group) of
# its own, and exits. A pid list is stale by the time it is used, and no signal to a group
# reaches the next generation. Each generation adds a byte to `hops` in its working directory
# (what the test watches: a scan of /proc misses most generations). It starts hopping after the
# agent's sweep at the end of the call that started it, and is bounded (60 s) so a failing run
# does not leave it behind for ever.
HOP = """
import os, time
if os.fork():
    time.sleep(60)
    os._exit(0)
time.sleep(0.5)
log = os.open("hops", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
end = time.monotonic() + 60
while time.monotonic() < end:
    {work}
    try:
        if os.fork():
            os._exit(0)
        os.setsid()
        os.write(log, b"x")
    except OSError:
        time.sleep(0.01)
"""
HOPPER = HOP.format(work="pass")
# The same, spending 3 ms of CPU in each generation: something to see running.
BUSY_HOPPER = HOP.format(work="spin = time.monotonic() + 0.003\n    while time.monotonic() < spin: pass")


def uid_processes(uid: int) -> dict[int, int]:
    """pid -> CPU ticks used, of every live (not zombie) process of `uid`."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as status:
                uids = next(line for line in status if line.startswith("Uid:")).split()
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, StopIteration):
            continue
        if int(uids[1]) == uid and fields[0] != "Z":
            found[int(name)] = int(fields[11]) + int(fields[12])
    return found


def nothing_of_uid_runs_for(uid: int, seconds: float) -> list[dict[int, int]]:
    """Samples of the uid's processes over `seconds`; every one must be empty."""
    seen, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        procs = uid_processes(uid)
        if procs:
            seen.append(procs)
        time.sleep(0.05)
    return seen


@contextmanager
def served(agent_data_dir: Path, **overrides: object) -> Iterator[tuple[TestClient, ProcessBackend, OrchestratorService]]:
    if overrides.get("process_sandbox") == "bwrap" and (problem := bwrap_problem()) is not None:
        pytest.skip(problem)
    service = OrchestratorService(make_settings(agent_data_dir, **overrides))
    try:
        backend = service.sandboxes.backends["process"]
        assert isinstance(backend, ProcessBackend)
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield client, backend, service
    finally:
        service.close()


def new_run(client: TestClient, user_id: int = USER) -> str:
    sid = client.post("/v1/sessions", json={"owner_user_id": user_id, "channel": "web"}).json()["session_id"]
    return client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web"}).json()["run_id"]


def tool(client: TestClient, run_id: str, name: str, arguments: dict) -> dict:
    response = client.post(f"/v1/runs/{run_id}/tools/{name}", json={"arguments": arguments})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["ok"], answer
    return answer["result"]


def start_hopper(client: TestClient, run_id: str, source: str) -> Path:
    """Start a hopper and wait until it hops; returns its `hops` file."""
    started = tool(client, run_id, "process_start", {"command": 'exec python3 -c "$SOURCE"', "env": {"SOURCE": source}})
    hops = Path(started["cwd"]) / "hops"
    deadline = time.monotonic() + 10
    while (not hops.exists() or hops.stat().st_size < 20) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert hops.exists() and hops.stat().st_size >= 20, "the hopper did not get going"
    return hops


def nothing_of_the_sandbox_runs_for(uid: int, hops: Path, seconds: float) -> None:
    """No live process of the uid, and no new generation of the hopper, for `seconds`. A killed
    process leaves its cgroup early in its exit (the stop then returns) and shows in /proc until
    its exit is done: a moment for that first."""
    time.sleep(0.1)
    size = hops.stat().st_size
    assert nothing_of_uid_runs_for(uid, seconds) == []
    assert hops.stat().st_size == size, "the hopper went on"


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_a_fork_hopper_dies_with_its_sandbox_on_stop(agent_data_dir: Path, sandbox: str) -> None:
    with served(agent_data_dir, process_sandbox=sandbox, sandbox_pids=HOPPER_PIDS) as (client, backend, service):
        uid = service.directories.sandbox_uid(USER)
        hops = start_hopper(client, new_run(client), HOPPER)
        backend.stop(USER)
        nothing_of_the_sandbox_runs_for(uid, hops, 2.5)


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_a_fork_hopper_dies_with_its_sandbox_at_the_idle_stop(
    agent_data_dir: Path, sandbox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = {"process_sandbox": sandbox, "idle_timeout_s": 600, "sandbox_pids": HOPPER_PIDS}
    with served(agent_data_dir, **settings) as (client, backend, service):
        uid = service.directories.sandbox_uid(USER)
        hops = start_hopper(client, new_run(client), HOPPER)
        # As if the hopper had slipped out of the agent's bookkeeping: the idle stop goes ahead.
        monkeypatch.setattr("orchestrator.sandboxes.process.runs_processes", lambda *_: False)
        assert backend.reap_idle(now=time.monotonic() + 601) == [USER]
        nothing_of_the_sandbox_runs_for(uid, hops, 2.5)


def test_a_paused_sandbox_uses_no_cpu(agent_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with served(agent_data_dir, pause_after_s=30, idle_timeout_s=600, sandbox_pids=HOPPER_PIDS) as (client, backend, service):
        uid = service.directories.sandbox_uid(USER)
        run_id = new_run(client)
        hops = start_hopper(client, run_id, BUSY_HOPPER)
        # As if the hopper had slipped out of the agent's own bookkeeping: the pause goes ahead.
        monkeypatch.setattr("orchestrator.sandboxes.process.runs_processes", lambda *_: False)
        backend.reap_idle(now=time.monotonic() + 31)
        assert [s.state for s in backend.status()] == ["paused"]
        time.sleep(0.2)
        before, size = uid_processes(uid), hops.stat().st_size
        time.sleep(1.0)
        assert uid_processes(uid) == before  # the same processes, not one tick more CPU
        assert hops.stat().st_size == size  # and not one more generation
        answer = tool(client, run_id, "shell", {"command": "echo resumed"})  # the next call thaws it
        assert answer["stdout"] == "resumed\n"


def test_a_sandbox_cannot_use_more_memory_than_its_limit(agent_data_dir: Path) -> None:
    # The agent (some 40 MiB) shares the limit: the grab is the largest process when it is hit.
    with served(agent_data_dir, sandbox_memory_mb=200) as (client, _backend, _service):
        run_id = new_run(client)
        grab = "python3 -c 'b = bytearray(600 * 2**20); b[::4096] = b\"x\" * len(b[::4096]); print(\"got it\")'"
        answer = tool(client, run_id, "shell", {"command": grab + "; echo exit=$?"})
        assert "got it" not in answer["stdout"] and "exit=137" in answer["stdout"], answer  # SIGKILLed by the OOM killer
        assert tool(client, run_id, "shell", {"command": "echo alive"})["stdout"] == "alive\n"


def test_a_fork_bomb_meets_the_pids_limit_and_others_still_answer(agent_data_dir: Path) -> None:
    bomb = "for i in $(seq 200); do sleep 30 & done 2>/dev/null; wait"
    with served(agent_data_dir, sandbox_pids=40, tool_timeout_s=3) as (client, backend, _service):
        run_id, other_run = new_run(client), new_run(client, OTHER)
        answer = client.post(f"/v1/runs/{run_id}/tools/shell", json={"arguments": {"command": bomb}})
        assert answer.status_code == 200
        started = time.monotonic()
        assert tool(client, other_run, "shell", {"command": "echo fine"})["stdout"] == "fine\n"
        assert time.monotonic() - started < 5
        cgroup = backend.cgroup_of(USER)
        assert cgroup is not None, "the sandbox has no cgroup"
        limits = [d / "pids.max" for d in (p.parent for p in cgroup.procs) if (d / "pids.max").exists()]
        assert [f.read_text().strip() for f in limits] == ["40"]  # the kernel's count, whatever the uid
        assert tool(client, run_id, "shell", {"command": "echo survived"})["stdout"] == "survived\n"


def test_shm_under_bwrap_refuses_writes_past_its_bound(agent_data_dir: Path) -> None:
    with served(agent_data_dir, process_sandbox="bwrap", sandbox_shm_mb=8) as (client, _backend, _service):
        run_id = new_run(client)
        answer = tool(client, run_id, "shell", {"command": "dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>&1; ls -s /dev/shm"})
        assert "No space left on device" in answer["stdout"], answer


@pytest.mark.parametrize(("sandbox", "isolated"), [("none", False), ("bwrap", True)])
def test_healthz_tells_the_truth_about_host_tmp_and_lifetime(agent_data_dir: Path, sandbox: str, isolated: bool) -> None:
    with served(agent_data_dir, process_sandbox=sandbox, sandbox_pids=HOPPER_PIDS) as (client, _backend, _service):
        isolation = client.get("/healthz", headers=admin_headers()).json()["isolation"]
        assert isolation["users_isolated"] is isolated, isolation
        if not isolated:
            assert "/tmp" in isolation["reason"]
        assert isolation["process_lifetime"] == "cgroup", isolation


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_a_fork_hopper_dies_with_a_killed_server(agent_data_dir: Path, sandbox: str) -> None:
    # kill -9 of a real `orchestrator serve`: no stop runs. Its thaw warden kills the sandbox
    # cgroups it was told about; under bwrap the PID namespace also dies with the server.
    import httpx

    from tests.live_server import free_port
    from tests.orchestrator.tools.test_processes_restart import _serve

    if sandbox == "bwrap" and (problem := bwrap_problem()) is not None:
        pytest.skip(problem)
    env = {"ORCH_BACKEND": "process", "ORCH_PROCESS_SANDBOX": sandbox, "ORCH_SANDBOX_PIDS": str(HOPPER_PIDS)}
    settings = make_settings(agent_data_dir)
    uid = settings.sandbox_uid_base + USER
    port = free_port()
    try:
        with _serve(agent_data_dir, port, env) as server, httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=60
        ) as http:
            hops = start_hopper(http, new_run(http), HOPPER)  # type: ignore[arg-type]
            server.send_signal(signal.SIGKILL)
            server.wait()
            deadline = time.monotonic() + 10  # the warden's kill follows the pipe's end
            while uid_processes(uid) and time.monotonic() < deadline:
                time.sleep(0.05)
            nothing_of_the_sandbox_runs_for(uid, hops, 2.5)
    finally:
        # What a next server of the instance would do: remove what the killed one left.
        leftovers = SandboxCgroups(settings.sandbox_uid_base, SandboxLimits(1, 2**30, 64))
        if leftovers.usable:
            leftovers.kill_leftovers()
            leftovers.close()
