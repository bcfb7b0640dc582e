"""Pause before stop and the dead-man switch on the process backend, with real agents: an idle
agent is frozen (its cgroup as root, else a SIGSTOP of its whole tree), the next call resumes it
transparently, and an agent no orchestrator calls any more exits on its own."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from orchestrator import metrics
from orchestrator.sandboxes.lifecycle_decision import IdleAction, idle_action
from orchestrator.sandboxes.process import ProcessBackend
from orchestrator.service import OrchestratorService
from tests.agent_env import blocking_call
from tests.conftest import make_settings
from tests.orchestrator.sandboxes.test_process import USER, sandbox_user, workdir


def _idle(**kw: object) -> IdleAction:
    values: dict = {"idle_s": 0.0, "in_flight": 0, "paused": False, "has_running_processes": False,
                    "pause_after_s": 60.0, "idle_timeout_s": 900.0, **kw}  # fmt: skip
    return idle_action(**values)


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"idle_s": 10}, IdleAction.NOTHING),
        ({"idle_s": 60}, IdleAction.PAUSE),
        ({"idle_s": 60, "paused": True}, IdleAction.NOTHING),
        ({"idle_s": 900}, IdleAction.STOP),
        ({"idle_s": 900, "paused": True}, IdleAction.STOP),
        ({"idle_s": 5000, "in_flight": 1}, IdleAction.NOTHING),
        ({"idle_s": 5000, "has_running_processes": True}, IdleAction.NOTHING),
        ({"idle_s": 100, "pause_after_s": 0}, IdleAction.NOTHING),  # pausing off
        ({"idle_s": 100, "pause_after_s": 900}, IdleAction.NOTHING),  # would not come before the stop
    ],
)
def test_the_idle_decision(kw: dict, expected: IdleAction) -> None:
    assert _idle(**kw) is expected


def _counter(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def _states(pid: int) -> set[str]:
    root = psutil.Process(pid)
    return {p.status() for p in [root, *root.children(recursive=True)]}


def _cgroup_frozen(backend: ProcessBackend) -> bool | None:
    """Whether the user's sandbox cgroup is frozen; None when it has none (not root)."""
    cgroup = backend.cgroup_of(USER)
    if cgroup is None:
        return None
    return "frozen 1" in (cgroup.v2_dir / "cgroup.events").read_text()


def _stopped(pid: int, backend: ProcessBackend) -> bool:
    frozen = _cgroup_frozen(backend)
    if frozen is not None:
        return frozen
    # A SIGSTOP takes effect when its target is next scheduled: a moment, not at once.
    deadline = time.monotonic() + 2
    while _states(pid) != {psutil.STATUS_STOPPED} and time.monotonic() < deadline:
        time.sleep(0.01)
    return _states(pid) == {psutil.STATUS_STOPPED}


def _running(pid: int, backend: ProcessBackend) -> bool:
    frozen = _cgroup_frozen(backend)
    return psutil.STATUS_STOPPED not in _states(pid) and not frozen


def test_an_idle_agent_is_frozen_and_the_next_call_resumes_it(agent_data_dir: Path) -> None:
    # Times given to the reaper as `now`, not slept: the test does not depend on the load.
    service = OrchestratorService(make_settings(agent_data_dir, pause_after_s=30, idle_timeout_s=600))
    try:
        backend = service.sandboxes.backends["process"]
        assert isinstance(backend, ProcessBackend)
        user, cwd = sandbox_user(service), workdir(service)
        blocking_call(backend, user, "write_file", {"path": "note.txt", "content": "still here\n"}, cwd=cwd)
        pid = backend.status()[0].detail["pid"]  # type: ignore[index]
        assert backend.reap_idle(now=time.monotonic() + 20) == []  # not idle long enough: nothing
        assert _running(pid, backend)
        assert backend.reap_idle(now=time.monotonic() + 31) == []  # paused, not stopped
        assert [s.state for s in backend.status()] == ["paused"]
        assert _stopped(pid, backend)  # the agent and all it runs
        resumes = _counter("orchestrator_sandbox_starts_total", backend="process", kind="resume")
        answer = blocking_call(backend, user, "read_file", {"path": "note.txt"}, cwd=cwd)
        assert "still here" in str(answer)
        assert backend.status()[0].detail["pid"] == pid  # the same agent, thawed  # type: ignore[index]
        assert _running(pid, backend)
        assert _counter("orchestrator_sandbox_starts_total", backend="process", kind="resume") == resumes + 1
        # A paused agent is stopped at the idle timeout like any other (thawed first).
        backend.reap_idle(now=time.monotonic() + 31)
        assert [s.state for s in backend.status()] == ["paused"]
        assert backend.reap_idle(now=time.monotonic() + 601) == [USER]
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        service.close()


def _one_agent(service: OrchestratorService) -> tuple[ProcessBackend, int]:
    """The process backend with the user's agent started by one call, and the agent's pid."""
    backend = service.sandboxes.backends["process"]
    assert isinstance(backend, ProcessBackend)
    blocking_call(backend, sandbox_user(service), "list_dir", {"path": "."}, cwd=workdir(service))
    return backend, backend.status()[0].detail["pid"]  # type: ignore[index,return-value]


def test_a_process_agent_nobody_calls_stops_itself(agent_data_dir: Path) -> None:
    # No reaper runs (service.start() is not called): as if the orchestrator had vanished but
    # the agent's parent check cannot tell (its parent lives). The agent's own switch acts.
    service = OrchestratorService(make_settings(agent_data_dir, idle_timeout_s=0.6, dead_man_margin_s=0.2))
    try:
        backend, pid = _one_agent(service)
        proc = psutil.Process(pid)
        started = time.monotonic()
        proc.wait(timeout=10)
        assert time.monotonic() - started >= 0.5  # not before its timeout
        assert [s.state for s in backend.status()] == ["failed"]  # exited on its own
    finally:
        service.close()


def test_the_warden_ends_a_paused_agent_when_the_orchestrators_pipe_ends(agent_data_dir: Path) -> None:
    # The pipe ends as it would if the orchestrator were killed: the warden (a process of its
    # own) then kills the sandbox's cgroup, frozen as it is (as root), or SIGCONTs the agent it
    # was told about, whose own checks can run again (not root: no cgroup).
    service = OrchestratorService(make_settings(agent_data_dir, pause_after_s=30, idle_timeout_s=600))
    try:
        backend, pid = _one_agent(service)
        backend.reap_idle(now=time.monotonic() + 31)
        assert _stopped(pid, backend)
        cgroup = backend.cgroup_of(USER)
        warden = backend.driver._warden._proc
        assert warden is not None and warden.poll() is None
        backend.driver._warden.close()  # EOF on the warden's stdin
        assert warden.returncode == 0
        if cgroup is not None:
            assert not cgroup.v2_dir.exists()  # killed to the last process, and removed
            psutil.Process(pid).wait(5)
        else:
            assert psutil.STATUS_STOPPED not in _states(pid)
    finally:
        service.close()


def test_a_cancel_for_a_paused_sandbox_thaws_it_instead_of_waiting_it_out(agent_data_dir: Path) -> None:
    """A session deleted (or a run ended) while its user's sandbox is paused: the cancel reaches
    the thawed agent at once. Asked while frozen, it waited out the call deadline and then
    stopped the whole sandbox, the user's other sessions' kernels and processes with it."""
    service = OrchestratorService(make_settings(agent_data_dir, pause_after_s=30, idle_timeout_s=600))
    try:
        backend, pid = _one_agent(service)
        assert backend.reap_idle(now=time.monotonic() + 31) == []
        assert [s.state for s in backend.status()] == ["paused"]
        started = time.monotonic()
        assert service.sandboxes.cancel_calls(USER, session_id="s-deleted") == 0
        assert time.monotonic() - started < service.settings.agent_call_timeout_s / 3
        assert [s.state for s in backend.status()] == ["running"]
        assert backend.status()[0].detail["pid"] == pid and _running(pid, backend)  # the same agent  # type: ignore[index]
    finally:
        service.close()
