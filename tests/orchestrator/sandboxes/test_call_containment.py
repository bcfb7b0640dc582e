"""Nothing a call started outlives it, and deleting a session or ending a run stops its calls
(issue 12 items 3 and 13). Attacks run the way a hostile sandbox would: through the public
API and the sandbox's own `shell`; what is left is counted by the host, by uid, with psutil.

The scenario functions take the client and the service; the docker tests run them again with
containers (`tests/orchestrator/sandboxes/docker/test_call_containment.py`)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.agent_env import Served, serving
from tests.api_calls import MEMBER, group_session, start_run, tool
from tests.conftest import make_settings
from tests.uid_block import block

AS_ROOT = os.geteuid() == 0
# Uids of their own (tests/uid_block.py): these tests count (and the agents sweep) every
# process of a sandbox uid.
UID_BASE = block(8)["sandbox_uid_base"]

# The leader thread exits (pthread_exit) while a worker spins: the process shows as a zombie
# (State Z in /proc/PID/status) with a live thread at 99 % CPU.
ZOMBIE_LEADER = (
    "import ctypes, threading\n"
    "def spin():\n"
    "    while True: pass\n"
    "threading.Thread(target=spin).start()\n"
    "ctypes.CDLL(None).pthread_exit(None)\n"
)
ESCAPES = {
    "zombie_leader_with_a_live_thread": f"python3 -c '{ZOMBIE_LEADER}' >/dev/null 2>&1 &",
    "zombie_leader_in_its_own_session_without_env": (
        f"env -i setsid /usr/bin/python3 -c '{ZOMBIE_LEADER}' >/dev/null 2>&1 &"
    ),
    "setsid_nohup_sleep": "setsid nohup sleep 1000 >/dev/null 2>&1 &",
    "double_fork_without_env": "env -i setsid sh -c 'sleep 1000 >/dev/null 2>&1 & exit 0' &",
    "ignores_sigterm": "sh -c 'trap \"\" TERM HUP INT; exec sleep 1000' >/dev/null 2>&1 &",
    "own_process_group": "python3 -c 'import os, time; os.setpgid(0, 0); time.sleep(1000)' >/dev/null 2>&1 &",
}
LOOP = "while true; do mkdir -p $PWD/x; echo hi > $PWD/x/f; sleep 0.05; done"
# A fork-hopper: every generation forks its successor and exits at once, faster than any scan
# of /proc; a failed fork (no pid left) is retried. Bounded to 20 s so a failing run ends.
HOPPER = (
    "import os, time\n"
    "end = time.monotonic() + 20\n"
    "while time.monotonic() < end:\n"
    "    try:\n"
    "        if os.fork(): os._exit(0)\n"
    "    except OSError:\n"
    "        pass\n"
)
HOP = f"env -i setsid /usr/bin/python3 -c '{HOPPER}' >/dev/null 2>&1 &"
# A finite hopper whose every ended generation is a zombie of the agent (the subreaper adopts
# each orphan): 700 hops, more than the sandbox's 512 pids, then the last one writes how far
# it got. Without reaping, fork fails with EAGAIN once the zombies fill the sandbox's pids.
ZOMBIE_HOPS = 700
ZOMBIE_HOPPER = (
    "import os\n"
    f"for hop in range({ZOMBIE_HOPS}):\n"
    "    try:\n"
    "        child = os.fork()\n"
    "    except OSError as exc:\n"
    "        open(\"hops.txt\", \"w\").write(f\"failed at {hop}: {exc}\")\n"
    "        os._exit(1)\n"
    "    if child: os._exit(0)\n"
    f"open(\"hops.txt\", \"w\").write(\"hops {ZOMBIE_HOPS}\")\n"
)


def _proc_text(pid: int, name: str) -> str:
    # Raw /proc reads: psutil answers ZombieProcess for a zombie leader, live threads or not.
    with open(f"/proc/{pid}/{name}", "rb") as fh:
        return fh.read().decode(errors="replace")


def _state(stat: str) -> str:
    return stat.rsplit(")", 1)[1].split()[0]


PF_EXITING = 0x4  # the kernel's flag of a task inside exit(): it runs nothing and forks nothing


def _lives(stat: str) -> bool:
    """A task that is neither a zombie nor already in exit(). A dying process (a pod's probe
    or pause process ending, a hopper's parent once it forked) has lost its memory, so its
    cmdline reads empty and it cannot be told from a call's leftover by what it runs."""
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] != "Z" and not int(fields[6]) & PF_EXITING


def _runs(pid: int) -> bool:
    """Alive: not a zombie (or a zombie whose leader exited while another thread runs), and
    not in the middle of its exit."""
    return any(_lives(_proc_text(pid, f"task/{tid}/stat")) for tid in os.listdir(f"/proc/{pid}/task"))


def _real_uid(pid: int) -> int:
    line = next(line for line in _proc_text(pid, "status").splitlines() if line.startswith("Uid:"))
    return int(line.split()[1])


def _is_agent(cmdline: str) -> bool:
    """The agent and what runs it (bwrap, the container's init, a pod's pause process): not a
    call's process."""
    first = os.path.basename(cmdline.split(" ", 1)[0])
    return (
        "sandbox_agent" in cmdline or "agent.json" in cmdline or first in ("docker-init", "bwrap")
        or cmdline == "/pause" or cmdline.startswith("runc init")  # a pod's pause; the runtime starting a probe
    )  # fmt: skip


def strays(uid: int) -> list[str]:
    """Every running process of `uid` that is not the agent (or its bwrap/init)."""
    found = []
    for pid in psutil.pids():
        try:
            if _real_uid(pid) != uid or not _runs(pid):
                continue
            cmdline = _proc_text(pid, "cmdline").replace("\0", " ").strip()
            if not _is_agent(cmdline):
                found.append(f"{pid} {_state(_proc_text(pid, 'stat'))} {cmdline or _proc_text(pid, 'comm').strip()}")
        except (OSError, StopIteration):
            continue
    return found


def settled_strays(uid: int, within_s: float = 1.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while (left := strays(uid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def sandbox_uid(service: OrchestratorService, user_id: int) -> int:
    return service.directories.sandbox_uid(user_id)


def member_run(client: TestClient) -> tuple[str, dict]:
    sid = group_session(client)
    return sid, start_run(client, sid, trigger="group_message", speaker_user_id=MEMBER)


def shell(client: TestClient, run_id: str, command: str, **arguments: object) -> dict:
    return tool(client, run_id, "shell", command=command, **arguments)


def escape_leaves_nothing(client: TestClient, service: OrchestratorService, escape: str) -> None:
    _, run = member_run(client)
    uid = sandbox_uid(service, MEMBER)
    answer = shell(client, run["run_id"], f"{ESCAPES[escape]} sleep 0.5; echo started")
    assert answer["ok"] and answer["result"]["stdout"] == "started\n", answer
    assert settled_strays(uid) == [], f"{escape} outlived its call"
    # and a second call of that user sees nothing of it either
    second = shell(client, run["run_id"], 'ps -o pid=,stat=,args= -u "$(id -u)" | grep -v -e agent.json -e docker-init')
    listed = second["result"]["stdout"]
    assert "sleep 1000" not in listed and "python3" not in listed, listed


def stays_clear(uid: int, seconds: float = 2.5, spare: str = "") -> None:
    """No process of `uid` but the agent (and `spare`, a kept one's command) runs, checked
    again and again for `seconds`: a hopper that dodged one scan shows up in the next."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # A zombie runs nothing and forks nothing; its reaper (the agent, a pod's pause
        # process) takes it in its own time.
        left = [line for line in strays(uid) if not (spare and spare in line) and line.split()[1] != "Z"]
        assert left == [], f"still running after the call: {left[:5]}"
        time.sleep(0.02)


def kill_all_of(uid: int) -> None:
    """After a test: end whatever of `uid` is left, hoppers included (kill(-1) as that uid is
    atomic with respect to fork), so a failing run leaves nothing spinning."""
    assert uid > 0
    # Run as that uid (set before exec), and checked again there: kill(-1) by root ends everything.
    program = f"import os, signal\nif os.getresuid() == ({uid}, {uid}, {uid}): os.kill(-1, signal.SIGKILL)"
    subprocess.run(["/usr/bin/python3", "-c", program], user=uid, check=False, timeout=10)


def a_hopper_does_not_outlive_its_call(client: TestClient, service: OrchestratorService) -> None:
    _, run = member_run(client)
    uid = sandbox_uid(service, MEMBER)
    try:
        answer = shell(client, run["run_id"], f"{HOP} sleep 0.3; echo started")
        assert answer["ok"] and answer["result"]["stdout"] == "started\n", answer
        stays_clear(uid)
        listing = shell(client, run["run_id"], 'ps -o pid=,stat=,args= -u "$(id -u)"')
        assert listing["ok"], listing
        listed = listing["result"]["stdout"]
        assert "os.fork" not in listed, listed
    finally:
        kill_all_of(uid)


def a_hopper_dies_and_a_background_process_lives(client: TestClient, service: OrchestratorService) -> None:
    _, run = member_run(client)
    uid = sandbox_uid(service, MEMBER)
    try:
        started = tool(client, run["run_id"], "process_start", command="exec sleep 777")
        assert started["ok"], started
        process_id = started["result"]["process_id"]
        answer = shell(client, run["run_id"], f"{HOP} sleep 0.3; echo started")
        assert answer["ok"], answer
        stays_clear(uid, spare="sleep 777")
        listed = tool(client, run["run_id"], "process_list")
        (kept,) = [p for p in listed["result"]["processes"] if p["process_id"] == process_id]
        assert kept["state"] == "running", kept
        # running, not left stopped by the sweep's freeze
        assert [line.split()[1][0] for line in strays(uid) if "sleep 777" in line] == ["S"], strays(uid)
    finally:
        kill_all_of(uid)


def a_suspended_process_stays_suspended(client: TestClient, service: OrchestratorService) -> None:
    """The sweep continues what it stopped, not what the user had stopped (a ^Z'd job)."""
    _, run = member_run(client)
    uid = sandbox_uid(service, MEMBER)
    try:
        started = tool(client, run["run_id"], "process_start", command="exec sleep 778")
        assert started["ok"], started
        stopped = shell(client, run["run_id"], f"kill -STOP {started['result']['pid']}")
        assert stopped["ok"] and stopped["result"]["exit_code"] == 0, stopped
        assert shell(client, run["run_id"], "echo another call")["ok"]
        assert [line.split()[1][0] for line in strays(uid) if "sleep 778" in line] == ["T"], strays(uid)
    finally:
        kill_all_of(uid)


def an_interactive_job_is_not_stopped_by_the_sweeps(client: TestClient, service: OrchestratorService) -> None:
    """An interactive bash on a PTY (job control on) runs a foreground job while calls end:
    the sweep stops and continues both; bash must not take its job for one the user stopped."""
    _, run = member_run(client)
    uid = sandbox_uid(service, MEMBER)
    try:
        term = tool(client, run["run_id"], "process_start", command="exec bash --norc -i", pty=True)
        assert term["ok"], term
        process_id = term["result"]["process_id"]
        wrote = tool(client, run["run_id"], "process_write", process_id=process_id, data="sleep 3; echo job-$((6*7))\r")
        assert wrote["ok"], wrote
        time.sleep(0.3)
        for _ in range(10):  # sweeps while the foreground job sleeps
            assert shell(client, run["run_id"], "true")["ok"]
        text, since = "", 0
        deadline = time.monotonic() + 10
        while "job-42" not in text and time.monotonic() < deadline:
            answer = tool(client, run["run_id"], "process_output", process_id=process_id, since=since, wait_s=1)
            text += "".join(chunk["text"] for chunk in answer["result"]["chunks"])
            since = answer["result"]["next"]
        assert "job-42" in text and "Stopped" not in text, text
    finally:
        kill_all_of(uid)


def zombies(uid: int) -> int:
    count = 0
    for pid in psutil.pids():
        try:
            if _real_uid(pid) == uid and _state(_proc_text(pid, "stat")) == "Z":
                count += 1
        except (OSError, StopIteration):
            continue
    return count


def zombies_do_not_pile_up(client: TestClient, service: OrchestratorService) -> None:
    _, run = member_run(client)
    uid = sandbox_uid(service, MEMBER)
    try:
        command = (
            f"rm -f hops.txt; env -i setsid /usr/bin/python3 -c '{ZOMBIE_HOPPER}' >/dev/null 2>&1 & "
            "for i in $(seq 400); do [ -s hops.txt ] && break; sleep 0.05; done; cat hops.txt"
        )
        answer = shell(client, run["run_id"], command, timeout_s=60)
        assert answer["ok"] and answer["result"]["stdout"] == f"hops {ZOMBIE_HOPS}", answer
        assert zombies(uid) < 20
        assert shell(client, run["run_id"], "echo ok")["result"]["stdout"] == "ok\n"
    finally:
        kill_all_of(uid)


def a_call_ending_spares_a_concurrent_call(client: TestClient, service: OrchestratorService) -> None:
    """The sweep after call A must not touch call B's live tree, even a setsid'ed part of it."""
    _, run = member_run(client)
    results: dict[str, dict] = {}
    slow = threading.Thread(
        target=lambda: results.setdefault(
            "b", shell(client, run["run_id"], "setsid sh -c 'sleep 2; echo b-child > b.txt' & sleep 2.5; cat b.txt")
        )
    )
    slow.start()
    time.sleep(0.5)
    for _ in range(3):  # calls that end, each followed by its cleanup, while B runs
        assert shell(client, run["run_id"], "sleep 1000 >/dev/null 2>&1 & true")["ok"]
    slow.join(30)
    assert results["b"]["ok"] and results["b"]["result"]["stdout"] == "b-child\n", results["b"]
    assert results["b"]["result"]["exit_code"] == 0
    assert settled_strays(sandbox_uid(service, MEMBER)) == []


@contextmanager
def looping_call(client: TestClient, run_id: str) -> Iterator[dict]:
    """Runs LOOP as a `shell` call in a thread; yields the dict its answer lands in."""
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(shell(client, run_id, LOOP, timeout_s=120)), daemon=True)
    thread.start()
    try:
        yield answer
    finally:
        thread.join(30)
        assert not thread.is_alive(), "the looping call did not end"


def wait_for(path: Path, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def stays_absent(path: Path, seconds: float = 2.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert not path.exists(), f"{path} came back after the cleanup"
        time.sleep(0.05)


def deleting_the_session_stops_its_calls(client: TestClient, service: OrchestratorService) -> None:
    sid, run = member_run(client)
    runtime = Path(run["workdir"])
    with looping_call(client, run["run_id"]) as answer:
        wait_for(runtime / "x" / "f")
        deleted = client.delete(f"/v1/sessions/{sid}")
        assert deleted.status_code == 200 and deleted.json()["cleanup_done"] is True, deleted.text
        assert not runtime.exists()
        stays_absent(runtime)
        assert settled_strays(sandbox_uid(service, MEMBER)) == []
    assert answer["ok"] is False and answer["error"]["code"] == "cancelled", answer
    late = client.post(f"/v1/runs/{run['run_id']}/tools/shell", json={"arguments": {"command": "mkdir -p x"}})
    assert late.status_code == 409, late.text
    stays_absent(runtime, 0.3)


def ending_the_run_stops_its_calls(client: TestClient, service: OrchestratorService) -> None:
    _, run = member_run(client)
    marker = Path(run["workdir"]) / "x" / "f"
    with looping_call(client, run["run_id"]) as answer:
        wait_for(marker)
        ended = client.post(f"/v1/runs/{run['run_id']}/end", json={"status": "cancelled"})
        assert ended.status_code == 200, ended.text
        marker.unlink()
        stays_absent(marker)
        assert settled_strays(sandbox_uid(service, MEMBER)) == []
    assert answer["ok"] is False and answer["error"]["code"] == "cancelled", answer




@pytest.fixture
def contained(agent_data_dir: Path) -> Iterator[Served]:
    with serving(make_settings(agent_data_dir, sandbox_uid_base=UID_BASE)) as served:
        yield served


root_only = pytest.mark.skipif(not AS_ROOT, reason="a sandbox uid of its own needs a root orchestrator")


@root_only
@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_item3_processes_do_not_outlive_their_call(contained: Served, escape: str) -> None:
    escape_leaves_nothing(*contained, escape)


@root_only
def test_item3_the_sweep_after_a_call_spares_a_concurrent_call(contained: Served) -> None:
    a_call_ending_spares_a_concurrent_call(*contained)


@root_only
def test_item13_deleting_a_session_kills_its_calls_before_cleanup(contained: Served) -> None:
    deleting_the_session_stops_its_calls(*contained)


@root_only
def test_item13_ending_a_run_kills_its_calls(contained: Served) -> None:
    ending_the_run_stops_its_calls(*contained)


@root_only
def test_finding1_a_fork_hopper_does_not_outlive_its_call(contained: Served) -> None:
    a_hopper_does_not_outlive_its_call(*contained)


@root_only
def test_finding1_a_fork_hopper_dies_and_a_background_process_lives(contained: Served) -> None:
    a_hopper_dies_and_a_background_process_lives(*contained)


@root_only
def test_finding1_the_sweep_leaves_a_suspended_background_process_suspended(contained: Served) -> None:
    a_suspended_process_stays_suspended(*contained)


@root_only
def test_finding1_the_sweep_does_not_stop_an_interactive_job(contained: Served) -> None:
    an_interactive_job_is_not_stopped_by_the_sweeps(*contained)


@root_only
def test_finding14_the_zombies_of_a_hopper_are_reaped_as_they_come(contained: Served) -> None:
    zombies_do_not_pile_up(*contained)


@root_only
@pytest.mark.parametrize("escape", ["zombie_leader_in_its_own_session_without_env", "double_fork_without_env"])
def test_item3_under_bwrap_the_sweep_spares_the_agents_ancestors(agent_data_dir: Path, escape: str) -> None:
    """bwrap runs as the sandbox uid too, as the agent's parent: the sweep must not take it."""
    from tests.orchestrator.sandboxes.test_bwrap import bwrap_problem

    if (problem := bwrap_problem()) is not None:
        pytest.skip(problem)
    settings = make_settings(agent_data_dir, sandbox_uid_base=UID_BASE, process_sandbox="bwrap")
    with serving(settings) as (client, service):
        escape_leaves_nothing(client, service, escape)
        (status,) = service.sandboxes.backends["process"].status()
        assert status.state == "running"  # bwrap (and the agent under it) survived the sweeps
        assert shell(client, start_run(client, group_session(client), trigger="web")["run_id"], "echo ok")["ok"]
