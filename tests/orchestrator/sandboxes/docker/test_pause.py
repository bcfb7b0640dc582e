"""Pause before stop and the dead-man switch against a real engine: an idle container is frozen
(`docker inspect` says Paused) and the next call thaws it; a container no orchestrator calls
any more stops itself; a paused one left behind is thawed by the next orchestrator and then
stops itself too."""

from __future__ import annotations

import time
from pathlib import Path

import docker
import pytest

from orchestrator import metrics
from orchestrator.service import OrchestratorService
from tests.agent_env import blocking_call, serving
from tests.api_calls import MEMBER, group_session, start_run, tool
from tests.orchestrator.sandboxes.docker.conftest import docker_settings
from tests.orchestrator.sandboxes.docker.test_lifecycle import backend_of, sandbox_user, the_container, workdir
from tests.orchestrator.sandboxes.test_call_containment import HOPPER, UID_BASE, kill_all_of, sandbox_uid, strays

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _wait_for(container, predicate, seconds: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not predicate(container.attrs["State"]) and time.monotonic() < deadline:
        time.sleep(0.1)
        container.reload()


def test_an_idle_container_is_paused_and_the_next_read_file_resumes_it(
    docker_data_dir: Path, sandbox_image: str, engine: docker.DockerClient
) -> None:
    service = OrchestratorService(docker_settings(docker_data_dir, sandbox_image, pause_after_s=0.5, idle_timeout_s=60))
    try:
        backend = backend_of(service)
        service.start()  # the reaper
        user, cwd = sandbox_user(service), workdir(service)
        blocking_call(backend, user, "write_file", {"path": "n.txt", "content": "kept\n"}, cwd=cwd)
        container = the_container(engine, service)
        _wait_for(container, lambda state: state["Paused"], 10)
        assert container.attrs["State"]["Paused"] is True
        assert [s.state for s in backend.status()] == ["paused"]
        resumes = metrics.REGISTRY.get_sample_value("orchestrator_sandbox_starts_total", {"backend": "docker", "kind": "resume"}) or 0
        assert "kept" in str(blocking_call(backend, user, "read_file", {"path": "n.txt"}, cwd=cwd))
        container.reload()
        assert container.attrs["State"]["Paused"] is False and container.status == "running"
        assert the_container(engine, service).id == container.id  # thawed, not replaced
        after = metrics.REGISTRY.get_sample_value("orchestrator_sandbox_starts_total", {"backend": "docker", "kind": "resume"})
        assert after == resumes + 1
    finally:
        service.close()


def test_an_orphaned_container_stops_itself_and_a_paused_one_is_thawed_by_the_next_orchestrator(
    docker_data_dir: Path, sandbox_image: str, engine: docker.DockerClient
) -> None:
    settings = docker_settings(docker_data_dir, sandbox_image, idle_timeout_s=1.5, dead_man_margin_s=0.5)
    # 1. No reaper ever runs (service.start() is never called): the orchestrator is as good as
    #    gone after its call. The agent's dead-man switch stops the container by itself.
    first = OrchestratorService(settings)
    try:
        blocking_call(backend_of(first), sandbox_user(first), "list_dir", {"path": "."}, cwd=workdir(first))
        container = the_container(engine, first)
    finally:
        first.close()  # the container keeps running: containers outlive their orchestrator
    container.reload()
    assert container.status == "running"
    _wait_for(container, lambda state: not state["Running"], 15)
    assert container.status == "exited" and container.attrs["State"]["ExitCode"] == 0  # stopped itself, cleanly

    # 2. Paused by an orchestrator that then shut down: its thaw warden thaws it on the way
    #    out, and the thawed agent's own switch stops it.
    second = OrchestratorService(settings.model_copy(update={"pause_after_s": 0.3}))
    try:
        backend = backend_of(second)
        blocking_call(backend, sandbox_user(second), "list_dir", {"path": "."}, cwd=workdir(second))
        time.sleep(0.4)
        backend.reap_idle()
        container.reload()
        assert container.attrs["State"]["Paused"] is True
    finally:
        second.close()
    _wait_for(container, lambda state: not state["Running"], 15)
    assert container.status == "exited" and container.attrs["State"]["ExitCode"] == 0

    # 3. Frozen with no warden left (say the host's service manager killed both): the next
    #    orchestrator on this data dir thaws it at adoption, and it stops itself.
    third = OrchestratorService(settings)
    try:
        blocking_call(backend_of(third), sandbox_user(third), "list_dir", {"path": "."}, cwd=workdir(third))
    finally:
        third.close()
    container.reload()
    container.pause()
    time.sleep(2.5)  # longer than its dead-man timeout, but frozen: nothing inside can act
    container.reload()
    assert container.attrs["State"]["Paused"] is True
    fourth = OrchestratorService(settings)
    try:
        assert backend_of(fourth).adopt() == [17]  # no reaper runs: what follows is the agent's doing
        container.reload()
        assert container.attrs["State"]["Paused"] is False
        # Its last call was long ago (the monotonic clock ran while it was frozen): it exits.
        _wait_for(container, lambda state: not state["Running"], 10)
        assert container.status == "exited" and container.attrs["State"]["ExitCode"] == 0
    finally:
        fourth.close()


def test_a_killed_orchestrator_leaves_no_container_frozen_forever(
    docker_data_dir: Path, sandbox_image: str, engine: docker.DockerClient
) -> None:
    """The orchestrator process is SIGKILLed right after its reaper paused a sandbox: nothing
    of it runs any more, yet its warden thaws the container and the agent stops itself."""
    import signal

    import httpx
    import psutil

    from orchestrator.sandboxes.docker_spec import LABEL_INSTANCE, instance_id
    from tests.api_calls import start_run, tool
    from tests.conftest import API_TOKEN
    from tests.live_server import free_port, serve_process

    env = {
        "ORCH_BACKEND": "docker", "ORCH_SANDBOX_IMAGE": sandbox_image, "ORCH_API_TOKEN": API_TOKEN,
        "ORCH_PAUSE_AFTER_S": "0.3", "ORCH_IDLE_TIMEOUT_S": "2", "ORCH_DEAD_MAN_MARGIN_S": "0.5",
    }  # fmt: skip
    with serve_process(str(docker_data_dir), free_port(), extra_env=env) as url:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=60) as api:
            sid = api.post("/v1/sessions", json={"owner_user_id": 17, "channel": "web"}).json()["session_id"]
            run = start_run(api, sid, trigger="web")  # type: ignore[arg-type]
            assert tool(api, run["run_id"], "list_dir", path=".")["ok"]  # type: ignore[arg-type]
        server = next(p for p in psutil.Process().children() if "serve" in p.cmdline())
        container = engine.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance_id(docker_data_dir)}"})[0]
        _wait_for(container, lambda state: state["Paused"], 10)
        assert container.attrs["State"]["Paused"] is True
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        _wait_for(container, lambda state: not state["Running"], 20)
        assert container.status == "exited" and container.attrs["State"]["ExitCode"] == 0


def _cpu_used_s(container) -> float:  # type: ignore[no-untyped-def]
    """The CPU time the container's cgroup used so far (cgroup v1 cpuacct, or v2 cpu.stat)."""
    pid = container.attrs["State"]["Pid"]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            return int((Path("/sys/fs/cgroup/cpuacct") / path.lstrip("/") / "cpuacct.usage").read_text()) / 1e9
        if controllers == "" and Path("/sys/fs/cgroup/cpu.stat").exists():
            stat = (Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.stat").read_text().split()
            return int(stat[stat.index("usage_usec") + 1]) / 1e6
    raise AssertionError(f"no cpu accounting cgroup for {container.name}")


def _cpu_across(container, seconds: float) -> float:  # type: ignore[no-untyped-def]
    before = _cpu_used_s(container)
    time.sleep(seconds)
    return _cpu_used_s(container) - before


# A background process that spins and starts a fork-hopper that escapes it (each generation's
# parent exits, so it is no longer the kept process's descendant): both run until something
# the kernel does ends them.
SPINNER = f"env -i setsid /usr/bin/python3 -c '{HOPPER}' >/dev/null 2>&1 & while :; do :; done"


def test_finding1_a_paused_sandbox_uses_no_cpu_and_a_stopped_one_runs_nothing(
    docker_data_dir: Path, sandbox_image: str, engine: docker.DockerClient
) -> None:
    settings = docker_settings(docker_data_dir, sandbox_image, sandbox_uid_base=UID_BASE)
    with serving(settings) as (client, service):
        run = start_run(client, group_session(client), trigger="group_message", speaker_user_id=MEMBER)
        uid = sandbox_uid(service, MEMBER)
        try:
            started = tool(client, run["run_id"], "process_start", command=SPINNER)
            assert started["ok"], started
            backend = backend_of(service)
            container = the_container(engine, service, MEMBER)
            container.reload()
            assert _cpu_across(container, 1.0) > 0.1  # it spins: the measure sees it (on a busy host too)
            with backend._slot(MEMBER).lock:
                assert backend._pause_locked(backend._slot(MEMBER))  # the reaper's own pause
            container.reload()
            assert container.attrs["State"]["Paused"] is True
            assert _cpu_across(container, 1.0) < 0.005, "a paused sandbox still used CPU"
            backend.stop(MEMBER)
            assert strays(uid) == [] and not [line for line in _uid_processes(uid)], _uid_processes(uid)
        finally:
            kill_all_of(uid)


def _uid_processes(uid: int) -> list[str]:
    """Every process of `uid` on the host, the agent included (ps, as an operator would look)."""
    import subprocess

    listed = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-u", str(uid)], capture_output=True, text=True)
    return [line for line in listed.stdout.splitlines() if line.strip()]
