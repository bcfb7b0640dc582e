"""The docker backend's deciders: the container spec from the mount plan, and the lifecycle
decision table. No engine needed."""

from __future__ import annotations

import json

from pathlib import Path

import pytest

from mounts.layout import DataLayout, GroupRef
from mounts.plan import plan_mounts
from orchestrator.sandboxes.docker_spec import (
    LABEL_BUILD,
    LABEL_IMAGE,
    LABEL_INSTANCE,
    LABEL_PLAN,
    LABEL_USER,
    Desired,
    Limits,
    Observed,
    container_name,
    container_outdated,
    container_spec,
    container_state,
    instance_id,
    observed_from_attrs,
    user_of,
)
from orchestrator.sandboxes.lifecycle_decision import LifecycleAction as Action
from orchestrator.sandboxes.lifecycle_decision import Observed as SandboxState
from orchestrator.sandboxes.lifecycle_decision import decide as decide_action
from orchestrator.sandboxes.lifecycle_decision import fit_of

LAYOUT = DataLayout(Path("/srv/orch/data"))


def spec_for(user_id: int = 7, groups=(), **overrides):  # type: ignore[no-untyped-def]
    plan = plan_mounts(LAYOUT, user_id, groups)
    return plan, container_spec(
        instance="abc123",
        plan=plan,
        image="sandbox-orchestrator/sandbox:latest",
        image_id="sha256:img",
        agent_build="build-1",
        sandbox_uid=100000 + user_id,
        sandbox_gid=100000 + user_id,
        extra_gids=(100000,),
        network="none",
        limits=Limits(cpus=1.5, memory_mb=512, pids=256),
        agent_dir=LAYOUT.agent_dir,
        home_dir=LAYOUT.home_dir(user_id),
        config_path=LAYOUT.socket_dir(user_id) / "agent.json",
        lease_path=LAYOUT.lease_path(user_id),
        **overrides,
    )


def test_mounts_are_exactly_the_plan_at_the_same_paths_with_tmp_at_slash_tmp() -> None:
    plan, spec = spec_for(groups=[GroupRef("feishu_group", "chat-1")])
    assert len(spec.mounts) == len(plan.mounts)
    by_target = {m.target: m for m in spec.mounts}
    tmp = by_target["/tmp"]
    assert tmp.source == "/srv/orch/data/tmp/7" and not tmp.read_only
    for m in spec.mounts:
        if m.target != "/tmp":
            assert m.source == m.target  # containers see the host's absolute paths
    assert by_target["/srv/orch/data/skill-views/7"].read_only
    assert by_target["/srv/orch/data/userskills/7"].read_only
    assert by_target["/srv/orch/data/agent"].read_only
    assert not by_target["/srv/orch/data/groups/feishu_group/chat-1"].read_only
    assert not by_target["/srv/orch/data/sockets/7"].read_only
    sources = [m.source for m in spec.mounts]
    for forbidden in ("state", "sessions", "skills", "skill-views/.content", "runtime/8", "uploads/8"):
        assert all(not s.startswith(f"/srv/orch/data/{forbidden}") for s in sources), forbidden


def test_container_runs_as_the_users_uid_hardened_and_offline() -> None:
    _, spec = spec_for()
    kwargs = {**spec.create_container_kwargs(), **spec.host_config_kwargs()}
    assert kwargs["user"] == "100007:100007" and kwargs["group_add"] == ["100000"]
    assert kwargs["network_mode"] == "none"
    assert kwargs["cap_drop"] == ["ALL"] and kwargs["security_opt"][0] == "no-new-privileges"
    profile = json.loads(kwargs["security_opt"][1].removeprefix("seccomp="))
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"  # an allow list
    allowed = {name for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for name in rule["names"]}
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register", "unshare", "setns", "memfd_secret",
                 "set_mempolicy_home_node", "bpf", "keyctl", "userfaultfd", "clone3"):  # fmt: skip
        assert name not in allowed, name
    unconditional = {name for rule in profile["syscalls"] if "args" not in rule for name in rule["names"]}
    assert not {"socket", "socketpair", "personality", "clone"} & unconditional  # by their arguments only
    families = {rule["args"][0]["value"] for rule in profile["syscalls"] if rule["names"] == ["socket"]}
    assert families == {1, 2, 10, 16}  # AF_VSOCK (40) is not among them
    # The supervisor is PID 1 (no engine init), and the block devices of the host are masked.
    assert kwargs["read_only"] is True and kwargs["init"] is False
    assert {"/sys/block", "/sys/devices/virtual/block", "/sys/fs/ext4", "/proc/diskstats", "/proc/kcore"} <= set(
        spec.masked_paths
    )
    assert kwargs["nano_cpus"] == 1_500_000_000 and kwargs["mem_limit"] == "512m" and kwargs["pids_limit"] == 256
    assert "/tmp" not in kwargs["tmpfs"]  # /tmp is the user's persistent tmp/{uid}
    assert kwargs["name"] == container_name("abc123", 7) == "orch-abc123-user-7"


def test_the_container_runs_under_the_configured_oci_runtime() -> None:
    assert spec_for()[1].host_config_kwargs()["runtime"] == "runc"
    assert spec_for(runtime="runsc")[1].host_config_kwargs()["runtime"] == "runsc"


def test_labels_name_user_plan_image_and_build_and_no_secret_travels_in_env_or_argv() -> None:
    plan, spec = spec_for()
    assert spec.labels[LABEL_USER] == "7" and spec.labels[LABEL_PLAN] == plan.plan_hash
    assert spec.labels[LABEL_IMAGE] == "sha256:img" and spec.labels[LABEL_BUILD] == "build-1"
    assert spec.labels[LABEL_INSTANCE] == "abc123"
    visible = " ".join([*spec.command, *spec.environment.keys(), *spec.environment.values()]).lower()
    visible = visible.replace(str(LAYOUT.agent_secrets_root), "")  # the directory's name is no secret
    assert "token" not in visible and "secret" not in visible
    assert spec.command == (
        "--lease", "/srv/orch/data/agent-secrets/7/lease", "--config", "/srv/orch/data/sockets/7/agent.json",
    )  # fmt: skip


def test_instance_id_separates_data_directories() -> None:
    assert instance_id(Path("/a/data")) != instance_id(Path("/b/data"))
    assert instance_id(Path("/a/data")) == instance_id(Path("/a/data"))


DESIRED = Desired(plan_hash="p1", image_id="i1", agent_build="b1")


def decide(observed: Observed | None, desired: Desired, *, running_build: str | None, busy: bool) -> Action:
    """What the lifecycle engine decides for the container docker reports (its state and whether
    it is outdated, then the one table; a container can restart its agent in place)."""
    state = SandboxState.ABSENT if observed is None else container_state(observed)
    outdated = observed is not None and container_outdated(observed, desired)
    fit = fit_of(outdated=outdated, running_build=running_build, wanted_build=desired.agent_build)
    return decide_action(state, fit, busy=busy, restarts_in_place=True)


def observed(
    *, running: bool = True, exit_code: int = 0, plan: str = "p1", image: str = "i1", runtime: str = "runc"
) -> Observed:
    return Observed("cid", running, exit_code, plan, image, runtime)


@pytest.mark.parametrize(
    ("state", "running_build", "busy", "action"),
    [
        (None, None, False, Action.CREATE),
        (observed(), "b1", False, Action.USE),
        (observed(), None, False, Action.USE),
        (observed(plan="p0"), "b1", False, Action.RECREATE),
        (observed(image="i0"), "b1", False, Action.RECREATE),
        (observed(runtime="runsc"), "b1", False, Action.RECREATE),  # ORCH_SANDBOX_RUNTIME changed
        (observed(runtime="runsc"), "b1", True, Action.USE),
        (observed(running=False, runtime="runsc"), None, False, Action.RECREATE),
        (observed(plan="p0"), "b1", True, Action.USE),  # busy: finish the calls first
        (observed(), "b0", False, Action.RESTART_AGENT),
        (observed(), "b0", True, Action.USE),
        (observed(running=False, exit_code=0), None, False, Action.START),
        (observed(running=False, exit_code=143), None, False, Action.START),
        (observed(running=False, exit_code=137), None, False, Action.RECREATE),  # docker kill / OOM
        (observed(running=False, exit_code=1), None, False, Action.RECREATE),  # crash
        (observed(running=False, exit_code=0, plan="p0"), None, False, Action.RECREATE),
    ],
)
def test_decision_table(state, running_build, busy, action) -> None:  # type: ignore[no-untyped-def]
    assert decide(state, DESIRED, running_build=running_build, busy=busy) is action


def test_observed_from_inspect_output() -> None:
    attrs = {
        "Id": "c1",
        "State": {"Running": False, "Restarting": False, "ExitCode": 137},
        "Config": {"Labels": {LABEL_PLAN: "p", LABEL_IMAGE: "i", LABEL_USER: "9"}},
    }
    assert observed_from_attrs(attrs) == Observed("c1", False, 137, "p", "i", "runc")
    assert observed_from_attrs({**attrs, "HostConfig": {"Runtime": "runsc"}}).runtime == "runsc"
    assert user_of(attrs["Config"]["Labels"]) == 9  # type: ignore[index]
    assert user_of({LABEL_USER: "../1"}) is None and user_of({}) is None and user_of({LABEL_USER: "0"}) is None


def test_a_container_whose_limits_are_not_the_users_any_more_is_replaced_when_idle() -> None:
    desired = Desired("p1", "i1", "b1", "runc", limits=(0.5, 256))
    old = Observed("cid", True, 0, "p1", "i1", "runc", limits=(1.0, 1024))
    assert decide(old, desired, running_build="b1", busy=False) is Action.RECREATE
    assert decide(old, desired, running_build="b1", busy=True) is Action.USE
    assert decide(Observed("cid", False, 0, "p1", "i1", "runc", limits=(1.0, 1024)), desired, running_build=None, busy=False) is Action.RECREATE
    same = Observed("cid", True, 0, "p1", "i1", "runc", limits=(0.5, 256))
    assert decide(same, desired, running_build="b1", busy=False) is Action.USE
    unknown = Observed("cid", True, 0, "p1", "i1", "runc")  # no HostConfig figures: not judged on them
    assert decide(unknown, desired, running_build="b1", busy=False) is Action.USE
    attrs = {"Id": "c", "State": {"Running": True}, "Config": {"Labels": {}}, "HostConfig": {"NanoCpus": 500_000_000, "Memory": 268435456}}
    assert observed_from_attrs(attrs).limits == (0.5, 256)
