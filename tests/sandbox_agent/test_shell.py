"""The shell tool: cwd, HOME, caps, exit codes, and no process left behind."""

from __future__ import annotations

import secrets
import time

import psutil
import pytest

from sandbox_agent.errors import AgentToolError
from sandbox_agent.path_sandbox import PathSandbox
from sandbox_agent.tools.shell import shell
from sandbox_agent.wire import ShellArgs
from tests.sandbox_agent.conftest import LiveAgent, Tree, tool_context


def processes_with(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if token in " ".join(proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def run(tree: Tree, sandbox: PathSandbox, command: str, **limits: object) -> dict:
    timeout = limits.pop("timeout_s", None)
    return shell(tool_context(tree, sandbox, **limits), ShellArgs(command=command, timeout_s=timeout))


def test_cwd_home_and_exit_code(tree: Tree, sandbox: PathSandbox) -> None:
    result = run(tree, sandbox, 'pwd; echo "$HOME"; cat hello.txt; echo oops >&2; exit 3')
    assert result["stdout"] == f"{tree.workdir}\n{tree.p('users/17')}\nhello\nworld\n"
    assert result["stderr"] == "oops\n"
    assert result["exit_code"] == 3
    assert result["timed_out"] is False
    assert result["cwd"] == str(tree.workdir)


def test_a_signal_death_is_reported_like_a_shell(tree: Tree, sandbox: PathSandbox) -> None:
    assert run(tree, sandbox, "kill -9 $$")["exit_code"] == 137


def test_output_cap_has_a_visible_marker_and_the_command_is_not_blocked(tree: Tree, sandbox: PathSandbox) -> None:
    result = run(tree, sandbox, "head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2", shell_output_cap_bytes=1000)
    # 995 bytes of the 1000 for stdout (stderr needs 5), the 33-byte marker inside them: of the
    # 962 shown, a quarter head, the rest tail
    assert result["stdout"] == "a" * 240 + "\n[... 2999038 bytes omitted ...]\n" + "a" * 722
    assert result["stdout_bytes"] == 3000000
    assert result["truncated"] is True
    assert result["stderr"] == "done\n"
    assert result["exit_code"] == 0


def test_timeout_returns_output_so_far_with_124(tree: Tree, sandbox: PathSandbox) -> None:
    started = time.monotonic()
    result = run(tree, sandbox, "echo before; sleep 30; echo after", timeout_s=0.5)
    assert time.monotonic() - started < 10
    assert result["exit_code"] == 124
    assert result["timed_out"] is True
    assert result["stdout"] == "before\n"
    assert "timed out" in result["note"]


def test_timeout_limits(tree: Tree, sandbox: PathSandbox) -> None:
    with pytest.raises(AgentToolError) as info:
        run(tree, sandbox, "true", timeout_s=1000)
    assert info.value.code == "invalid_arguments"


def test_a_workdir_outside_the_roots_is_refused(tree: Tree, sandbox: PathSandbox) -> None:
    from sandbox_agent.tools.context import ToolContext

    ctx = tool_context(tree, sandbox)
    with pytest.raises(AgentToolError) as info:
        shell(ToolContext(ctx.sandbox, ctx.config, str(tree.p("runtime/18/s9"))), ShellArgs(command="ls"))
    assert info.value.code == "foreign_runtime_path"


def test_background_processes_do_not_outlive_a_finished_call(tree: Tree, sandbox: PathSandbox) -> None:
    tag = f"{secrets.randbelow(10**6) + 10**6}.5"
    result = run(tree, sandbox, f"sleep {tag} & echo started")
    assert result["stdout"] == "started\n"
    assert result["exit_code"] == 0
    assert "background" in result["note"]
    assert processes_with(f"sleep {tag}") == []


@pytest.mark.parametrize(
    "spawn",
    [
        "sleep {tag} & sleep 60",  # a child in the background
        "(sleep {tag} &); sleep 60",  # a grandchild whose parent already exited
        "sh -c 'sleep {tag} & wait' & sleep 60",  # a grandchild under a waiting child
        "setsid sleep {tag} & sleep 60",  # a new session: escapes killpg
        "setsid -f env -i sleep {tag}; sleep 60",  # new session, empty environment, orphaned
        "nohup sh -c 'trap \"\" TERM HUP; sleep {tag}' >/dev/null 2>&1 & sleep 60",  # ignores signals
    ],
)
def test_timeout_kills_the_whole_tree_through_the_live_agent(live_agent: LiveAgent, spawn: str) -> None:
    tag = f"{secrets.randbelow(10**6) + 10**6}.{secrets.randbelow(9) + 1}"
    started = time.monotonic()
    result = live_agent.client.call(
        "shell", {"command": spawn.format(tag=tag), "timeout_s": 1.0}, cwd=str(live_agent.tree.workdir)
    )
    assert result["timed_out"] is True and result["exit_code"] == 124
    assert time.monotonic() - started < 15
    assert processes_with(f"sleep {tag}") == []
    agent = psutil.Process(live_agent.proc.pid)
    assert [c for c in agent.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE] == []
    assert agent.children() == []  # adopted orphans were reaped too


def test_a_quick_command_through_the_live_agent(live_agent: LiveAgent) -> None:
    result = live_agent.client.call("shell", {"command": "echo hi"}, cwd=str(live_agent.tree.workdir))
    assert result["stdout"] == "hi\n" and result["exit_code"] == 0
