"""The process backend's lifecycle with real agent subprocesses."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time
from pathlib import Path

import psutil
import pytest

from mounts.layout import GroupRef
from mounts.plan import plan_mounts
from tests.agent_env import blocking_call
from orchestrator.sandboxes.base import SandboxUser
from orchestrator.errors import ToolError
from orchestrator.service import OrchestratorService

USER = 17
AS_ROOT = os.geteuid() == 0


def sandbox_user(service: OrchestratorService, user_id: int = USER, groups: tuple[GroupRef, ...] = ()) -> SandboxUser:
    gids = {group: service.group_gids.gid_of(group) for group in groups}
    return SandboxUser(user_id, plan_mounts(service.layout, user_id, groups, gids))


def workdir(service: OrchestratorService, user_id: int = USER) -> str:
    return str(service.directories.ensure_session_runtime(user_id, "s1", is_owner=True))


def agent_pids(service: OrchestratorService) -> dict[int, int]:
    return {s.user_id: s.detail["pid"] for s in service.sandboxes.backends["process"].status()}  # type: ignore[index]


def test_concurrent_first_calls_start_exactly_one_agent(agent_service: OrchestratorService) -> None:
    backend = agent_service.sandboxes.backends["process"]
    cwd = workdir(agent_service)
    user = sandbox_user(agent_service)
    barrier = threading.Barrier(8)
    results: list[object] = []

    def first_call() -> None:
        barrier.wait()
        results.append(blocking_call(backend, user, "list_dir", {"path": "."}, cwd=cwd))

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8
    pid = agent_pids(agent_service)[USER]
    agents = [p for p in psutil.process_iter(["cmdline"]) if str(agent_service.layout.agent_config_path(USER)) in " ".join(p.info["cmdline"] or [])]
    assert [p.pid for p in agents] == [pid]


def test_a_dead_agent_is_restarted_on_the_next_call(agent_service: OrchestratorService) -> None:
    backend = agent_service.sandboxes.backends["process"]
    cwd = workdir(agent_service)
    user = sandbox_user(agent_service)
    blocking_call(backend, user, "write_file", {"path": "a.txt", "content": "a"}, cwd=cwd)
    first = agent_pids(agent_service)[USER]
    os.kill(first, signal.SIGKILL)
    psutil.Process(first).wait(5) if psutil.pid_exists(first) else None
    assert blocking_call(backend, user, "read_file", {"path": "a.txt"}, cwd=cwd)["content"] == "a"
    second = agent_pids(agent_service)[USER]
    assert second != first


def test_idle_agents_are_stopped(agent_service: OrchestratorService) -> None:
    backend = agent_service.sandboxes.backends["process"]
    cwd = workdir(agent_service)
    user = sandbox_user(agent_service)
    blocking_call(backend, user, "list_dir", {"path": "."}, cwd=cwd)
    pid = agent_pids(agent_service)[USER]
    assert backend.reap_idle() == []  # just used
    assert backend.reap_idle(now=time.monotonic() + agent_service.settings.idle_timeout_s + 1) == [USER]
    assert backend.status() == []
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not agent_service.layout.socket_path(USER).exists()
    blocking_call(backend, user, "list_dir", {"path": "."}, cwd=cwd)  # and comes back on demand
    assert USER in agent_pids(agent_service)


def test_the_idle_reaper_task_runs_after_start(agent_data_dir: Path) -> None:
    from tests.conftest import make_settings

    service = OrchestratorService(make_settings(agent_data_dir, idle_timeout_s=0.5))
    try:
        service.start()
        blocking_call(service.sandboxes.backends["process"], sandbox_user(service), "list_dir", {"path": "."}, cwd=workdir(service))
        deadline = time.monotonic() + 10
        while service.sandboxes.backends["process"].status():
            assert time.monotonic() < deadline, "idle agent was not reaped"
            time.sleep(0.1)
    finally:
        service.close()


def test_a_changed_plan_restarts_the_agent_with_the_new_roots(agent_service: OrchestratorService) -> None:
    backend = agent_service.sandboxes.backends["process"]
    cwd = workdir(agent_service)
    group = GroupRef("feishu", "chat1")
    blocking_call(backend, sandbox_user(agent_service), "list_dir", {"path": "."}, cwd=cwd)
    first = agent_pids(agent_service)[USER]
    workspace = agent_service.layout.group_dir(group)
    with pytest.raises(ToolError) as info:
        blocking_call(backend, sandbox_user(agent_service), "list_dir", {"path": str(workspace)}, cwd=cwd)
    assert info.value.code == "path_escape"
    listed = blocking_call(backend, sandbox_user(agent_service, groups=(group,)), "list_dir", {"path": str(workspace)}, cwd=cwd)
    assert listed["path"] == str(workspace)
    assert agent_pids(agent_service)[USER] != first


def test_close_stops_every_agent_and_its_processes(agent_data_dir: Path) -> None:
    from tests.conftest import make_settings

    service = OrchestratorService(make_settings(agent_data_dir))
    for user_id in (17, 18):
        blocking_call(service.sandboxes.backends["process"], sandbox_user(service, user_id), "list_dir", {"path": "."}, cwd=workdir(service, user_id))
    pids = list(agent_pids(service).values())
    sleeper = threading.Thread(
        target=lambda: pytest.raises(
            ToolError, blocking_call, service.sandboxes.backends["process"], sandbox_user(service, 17), "shell", {"command": "sleep 60"}, cwd=workdir(service, 17)
        )
    )
    sleeper.start()
    time.sleep(0.5)
    service.close()
    sleeper.join(10)
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-1:] == ["sleep 60"]]
    assert leftovers == []


@pytest.mark.skipif(not AS_ROOT, reason="agents switch uid only when the orchestrator is root")
def test_agents_run_as_the_users_own_uid_with_private_dirs(agent_service: OrchestratorService) -> None:
    backend = agent_service.sandboxes.backends["process"]
    layout = agent_service.layout
    cwd = workdir(agent_service)
    blocking_call(backend, sandbox_user(agent_service), "write_file", {"path": "f.txt", "content": "x"}, cwd=cwd)
    uid = agent_service.settings.sandbox_uid_base + USER
    proc = psutil.Process(agent_pids(agent_service)[USER])
    assert proc.uids().real == uid and proc.uids().effective == uid
    groups = next(line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if line.startswith("Groups:"))
    assert groups.split()[1:] == [str(agent_service.settings.sandbox_uid_base)]  # only the shared sandbox group
    written = Path(cwd) / "f.txt"
    assert written.stat().st_uid == uid
    for path in (layout.runtime_user_dir(USER), layout.uploads_dir(USER), layout.home_dir(USER), layout.deps_dir(USER), layout.tmp_dir(USER), layout.socket_dir(USER)):
        st = path.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, 0o700), path
    for parent in (layout.runtime_root, layout.uploads_root, layout.users_root, layout.sockets_root):
        st = parent.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o711), parent
    share = layout.share_dir.stat()
    assert (share.st_gid, stat.S_IMODE(share.st_mode)) == (agent_service.settings.sandbox_uid_base, 0o3770)


@pytest.mark.skipif(not AS_ROOT, reason="needs root to run agents as different uids")
def test_the_os_keeps_users_apart_even_for_the_shell(agent_service: OrchestratorService) -> None:
    backend = agent_service.sandboxes.backends["process"]
    other = workdir(agent_service, 18)
    Path(other, "private.txt").write_text("18 only")
    os.chown(Path(other, "private.txt"), agent_service.settings.sandbox_uid_base + 18, agent_service.settings.sandbox_uid_base + 18)
    answer = blocking_call(backend, sandbox_user(agent_service), "shell", {"command": f"cat {other}/private.txt; ls {agent_service.layout.runtime_root}"}, cwd=workdir(agent_service))
    assert answer["exit_code"] != 0
    assert "18 only" not in answer["stdout"]
    assert "Permission denied" in answer["stderr"]


def test_the_token_is_a_private_file_and_never_in_argv_or_environment(agent_service: OrchestratorService) -> None:
    backend = agent_service.sandboxes.backends["process"]
    blocking_call(backend, sandbox_user(agent_service), "list_dir", {"path": "."}, cwd=workdir(agent_service))
    token_path = agent_service.layout.token_path(USER)
    st = token_path.stat()
    if AS_ROOT:  # root writes it where the sandbox can read, not write (agent-secrets/{uid}/)
        sandbox_gid = agent_service.settings.sandbox_uid_base + USER
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 0, sandbox_gid)
        parent = token_path.parent.stat()
        assert (stat.S_IMODE(parent.st_mode), parent.st_uid, parent.st_gid) == (0o750, 0, sandbox_gid)
    else:
        assert stat.S_IMODE(st.st_mode) == 0o600
    token = token_path.read_text().strip()
    proc = psutil.Process(agent_pids(agent_service)[USER])
    assert token not in " ".join(proc.cmdline())
    assert all(token not in value for value in proc.environ().values())


def test_a_planted_symlink_in_the_socket_dir_is_replaced_not_followed(agent_service: OrchestratorService, traversable_tmp: Path) -> None:
    layout = agent_service.layout
    agent_service.directories.ensure_socket_dir(USER)
    victim = traversable_tmp / "victim"
    victim.write_text("keep me")
    # where the token and the config lived before they moved out of the user's socket dir
    os.symlink(victim, layout.socket_dir(USER) / "token")
    os.symlink(victim, layout.socket_dir(USER) / "agent.json")
    blocking_call(agent_service.sandboxes.backends["process"], sandbox_user(agent_service), "list_dir", {"path": "."}, cwd=workdir(agent_service))
    assert victim.read_text() == "keep me"
    assert not layout.token_path(USER).is_symlink() and layout.token_path(USER).is_file()


def test_an_agent_whose_socket_was_removed_is_replaced(agent_service: OrchestratorService) -> None:
    """The socket dir is the user's: their shell can delete the socket. The next call recovers."""
    backend = agent_service.sandboxes.backends["process"]
    cwd = workdir(agent_service)
    user = sandbox_user(agent_service)
    answer = blocking_call(backend, user, "shell", {"command": f"rm {agent_service.layout.socket_path(USER)}"}, cwd=cwd)
    assert answer["exit_code"] == 0
    first = agent_pids(agent_service)[USER]
    assert blocking_call(backend, user, "list_dir", {"path": "."}, cwd=cwd)["path"] == cwd  # a pooled connection
    time.sleep(5.5)  # the agent closes idle connections after 5 s; the next call must connect anew
    assert blocking_call(backend, user, "list_dir", {"path": "."}, cwd=cwd)["path"] == cwd
    assert agent_pids(agent_service)[USER] != first
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE


def test_junk_at_the_socket_name_does_not_keep_the_agent_down(agent_service: OrchestratorService) -> None:
    agent_service.directories.ensure_socket_dir(USER)
    blocker = agent_service.layout.socket_path(USER)
    (blocker / "inner").mkdir(parents=True)
    assert blocking_call(agent_service.sandboxes.backends["process"], sandbox_user(agent_service), "list_dir", {"path": "."}, cwd=workdir(agent_service))


def test_an_agent_stderr_line_without_an_end_is_forwarded_in_bounded_pieces(agent_service: OrchestratorService) -> None:
    """The agent runs as the user's uid, which can make it write anything to its stderr."""
    import subprocess
    import sys

    from orchestrator.sandboxes.process import STDERR_LINE_MAX, _Agent

    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stderr.write('x' * 1_000_000); sys.stderr.flush()"],
        stderr=subprocess.PIPE,
    )
    agent = _Agent(USER, writer, "plan", "build", None)
    agent_service.sandboxes.backends["process"].driver._forward_stderr(agent)
    writer.wait()
    assert agent.stderr_tail and all(len(line) <= STDERR_LINE_MAX for line in agent.stderr_tail)
