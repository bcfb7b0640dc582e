"""A sandbox with a running background process is busy (docs/processes.md): a plan change
does not restart its agent (which would kill the process) until the process has ended."""

from __future__ import annotations

import pytest

from mounts.layout import GroupRef
from orchestrator.errors import ToolError
from orchestrator.service import OrchestratorService
from sandbox_agent.wire import CallContext
from tests.agent_env import blocking_call
from tests.orchestrator.sandboxes.test_process import USER, agent_pids, sandbox_user, workdir


def test_a_running_process_holds_back_a_plan_restart(agent_service: OrchestratorService) -> None:
    backend = agent_service.sandboxes.backends["process"]
    cwd = workdir(agent_service)
    context = CallContext(run_id="r1", session_id="s1", output_dir=str(agent_service.layout.shell_output_dir(USER, "s1")))
    started = blocking_call(backend, sandbox_user(agent_service), "process_start", {"command": "sleep 60"}, cwd=cwd, context=context)
    first = agent_pids(agent_service)[USER]
    group = GroupRef("feishu", "chat-busy")
    joined = sandbox_user(agent_service, groups=(group,))  # a new membership: a restart once idle
    workspace = str(agent_service.layout.group_dir(group))
    with pytest.raises(ToolError) as info:  # still the old agent, with the old roots
        blocking_call(backend, joined, "list_dir", {"path": workspace}, cwd=cwd)
    assert info.value.code == "path_escape" and agent_pids(agent_service)[USER] == first
    listed = blocking_call(backend, joined, "process_list", {}, cwd=cwd, context=context)["processes"]
    assert [p["state"] for p in listed] == ["running"]
    blocking_call(backend, joined, "process_signal", {"process_id": started["process_id"], "signal": "KILL"}, cwd=cwd, context=context)
    assert blocking_call(backend, joined, "list_dir", {"path": workspace}, cwd=cwd)["path"] == workspace
    assert agent_pids(agent_service)[USER] != first  # idle now: restarted with the new plan


def test_a_count_the_sandbox_may_lie_about_keeps_it_busy_no_longer_than_the_runtime_limit() -> None:
    """The count comes from the sandbox; an agent replaced by a liar that claims processes
    forever would never be idle. No process the host started outlives its maximum runtime."""
    import time

    from orchestrator.call_ledger import SandboxEntry
    from orchestrator.sandboxes.base import runs_processes

    count = SandboxEntry()
    count.note_processes(5, started_for_s=0.2)
    assert count.busy and runs_processes(None, count)  # not askable: believed within the limit
    time.sleep(0.25)
    count.note_processes(5)  # the liar says so again
    assert not count.busy and not runs_processes(None, count)
