"""The process backend inside a bwrap mount namespace built from the plan (opt-in)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mounts.layout import DataLayout, GroupRef
from mounts.plan import plan_mounts
from tests.agent_env import blocking_call
from orchestrator.sandboxes.base import SandboxUser
from orchestrator.sandboxes.bwrap import BwrapProbe, HostSystem, bwrap_command
from orchestrator.service import OrchestratorService
from tests.conftest import make_settings

USER = 17
AS_ROOT = os.geteuid() == 0


def test_the_command_mounts_the_plan_shallow_first_with_its_access() -> None:
    layout = DataLayout(Path("/tmp/x/data"))
    plan = plan_mounts(layout, USER, [GroupRef("feishu", "g1")])
    system = HostSystem(links=(("usr/lib", "/lib"),), dirs=("/lib64",))
    args = bwrap_command(plan, ["python", "-I"], chdir=layout.home_dir(USER), system=system, shm_mb=8)
    assert args[:2] == ["bwrap", "--unshare-net"]
    assert {"--unshare-pid", "--die-with-parent"} <= set(args)  # its own PID namespace, ending with us
    shm = args.index("/dev/shm")
    assert args[shm - 3 : shm] == ["--size", str(8 * 1024 * 1024), "--tmpfs"]  # a bounded tmpfs of its own
    assert args[args.index("--proc") + 1] == "/proc"  # the namespace's own /proc, not the host's
    assert args[-3:] == ["--", "python", "-I"]
    binds = [(args[i], args[i + 1], args[i + 2]) for i, a in enumerate(args) if a in ("--bind", "--ro-bind")]
    targets = [b[2] for b in binds]
    assert targets.index("/tmp") < targets.index(str(layout.runtime_user_dir(USER)))  # /tmp first
    assert ("--bind", str(layout.tmp_dir(USER)), "/tmp") in binds
    assert ("--ro-bind", str(layout.user_views_dir(USER)), str(layout.user_views_dir(USER))) in binds
    assert ("--ro-bind", str(layout.agent_dir), str(layout.agent_dir)) in binds
    assert ("--bind", str(layout.group_dir(GroupRef("feishu", "g1"))), str(layout.group_dir(GroupRef("feishu", "g1")))) in binds
    assert ("--ro-bind", "/lib64", "/lib64") in binds
    assert str(layout.state_dir) not in " ".join(args)
    assert args[args.index("--chdir") + 1] == str(layout.home_dir(USER))


def bwrap_problem() -> str | None:
    usable, why = BwrapProbe().check(100000 + USER if AS_ROOT else None)
    return None if usable else why


@pytest.fixture
def bwrap_service(agent_data_dir: Path) -> Iterator[OrchestratorService]:
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(problem)
    service = OrchestratorService(make_settings(agent_data_dir, process_sandbox="bwrap"))
    try:
        yield service
    finally:
        service.close()


def call(service: OrchestratorService, user_id: int, tool: str, groups: tuple[GroupRef, ...] = (), **arguments: object):  # type: ignore[no-untyped-def]
    cwd = str(service.directories.ensure_session_runtime(user_id, "s1", is_owner=True))
    gids = {group: service.group_gids.gid_of(group) for group in groups}
    user = SandboxUser(user_id, plan_mounts(service.layout, user_id, groups, gids))
    return blocking_call(service.sandboxes.backends["process"], user, tool, dict(arguments), cwd=cwd)


def test_tools_work_and_the_shell_sees_only_the_plan(bwrap_service: OrchestratorService) -> None:
    layout = bwrap_service.layout
    mine, theirs = GroupRef("feishu", "mine"), GroupRef("feishu", "theirs")
    bwrap_service.directories.ensure_sandbox_dirs(plan_mounts(layout, 18, [theirs], {theirs: bwrap_service.group_gids.gid_of(theirs)}))
    (layout.group_dir(theirs) / "plan.md").write_text("theirs")
    assert call(bwrap_service, USER, "write_file", (mine,), path="a.txt", content="hello")["created"] is True
    assert call(bwrap_service, USER, "read_file", (mine,), path="a.txt")["content"] == "hello"
    script = (
        f"ls {layout.root}; echo ---; cat {layout.group_dir(theirs)}/plan.md; echo ---;"
        f" ls {layout.state_dir}; echo tmp > /tmp/t.txt; ls {layout.group_dir(mine)} >/dev/null && echo group-ok"
    )
    result = call(bwrap_service, USER, "shell", (mine,), command=script)
    listing = result["stdout"].split("---")[0].split()
    assert "state" not in listing and "sessions" not in listing and "skills" not in listing
    assert "No such file" in result["stderr"]
    assert "theirs" not in result["stdout"]
    assert "group-ok" in result["stdout"]
    assert (layout.tmp_dir(USER) / "t.txt").read_text() == "tmp\n"
    status = bwrap_service.sandboxes.backends["process"].status()[0]
    assert status.detail["namespace"] == "bwrap"  # type: ignore[index]


def test_no_network_inside(bwrap_service: OrchestratorService) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        probe = f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2)'"
        result = call(bwrap_service, USER, "shell", command=probe)
    assert result["exit_code"] != 0
    assert "Connection refused" in result["stderr"] or "unreachable" in result["stderr"]


def test_timeout_kills_the_tree_and_close_leaves_nothing(bwrap_service: OrchestratorService) -> None:
    result = call(bwrap_service, USER, "shell", command="(sleep 4242.5 &); sleep 60", timeout_s=1)
    assert result["timed_out"] is True
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if "4242.5" in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []
    pid = bwrap_service.sandboxes.backends["process"].status()[0].detail["pid"]  # type: ignore[index]
    bwrap = psutil.Process(pid)
    tree = bwrap.children(recursive=True)
    assert tree, "bwrap should have the agent as its child"
    bwrap_service.sandboxes.backends["process"].close()
    for proc in [bwrap, *tree]:
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    assert not bwrap_service.layout.socket_path(USER).exists()


def test_the_group_scenario_through_the_api_inside_namespaces(bwrap_service: OrchestratorService) -> None:
    from fastapi.testclient import TestClient

    from orchestrator.http.app import create_app
    from tests.conftest import API_TOKEN

    with TestClient(create_app(bwrap_service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
        body = {"owner_user_id": 17, "channel": "feishu_group", "group": {"channel": "feishu", "chat_id": "oc_ns"}}
        sid = client.post("/v1/sessions", json=body).json()["session_id"]
        member = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": 67}).json()
        written = client.post(f"/v1/runs/{member['run_id']}/tools/write_file", json={"arguments": {"path": "r.md", "content": "67"}}).json()
        assert written["ok"] is True
        owner = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web"}).json()
        denied = client.post(
            f"/v1/runs/{owner['run_id']}/tools/read_file", json={"arguments": {"path": written["result"]["path"]}}
        ).json()
        assert denied["error"]["code"] == "foreign_runtime_path"
        assert "(current runtime identity 17)" in denied["error"]["message"]
        shell = client.post(
            f"/v1/runs/{owner['run_id']}/tools/shell", json={"arguments": {"command": f"cat {written['result']['path']}"}}
        ).json()
        assert shell["result"]["exit_code"] != 0 and "No such file" in shell["result"]["stderr"]
