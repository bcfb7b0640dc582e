"""The docker backend's lifecycle against a real engine: one container per
user under concurrency, recovery from kills and crashes, adoption across orchestrator
restarts, recreation on plan drift and agent restart on BUILD drift (both only when idle),
idle stop, and a clear error when a sandbox cannot start."""

from __future__ import annotations

import logging
import shutil
import threading
import uuid
import time
from pathlib import Path

import docker
import pytest

from mounts.layout import GroupRef
from mounts.plan import plan_mounts
from tests.agent_env import blocking_call
from orchestrator.sandboxes.agent_deploy import AgentDeployment
from orchestrator.sandboxes.base import SandboxUser
from orchestrator.sandboxes.docker import IMAGE_RECHECK_S, DockerBackend
from tests.orchestrator.sandboxes.call_wording import died_mid_call
from orchestrator.sandboxes.docker_spec import LABEL_USER
from orchestrator.errors import ToolError
from orchestrator.sandboxes.image.compat import expected_agent_lock
from orchestrator.sandboxes.image.recipe import LABEL_AGENT_LOCK, LABEL_ROLE, ROLE_SANDBOX
from orchestrator.service import OrchestratorService
from orchestrator.settings import SandboxSettings
from sandbox_agent.build import PACKAGE_DIR, compute_build_id
from tests.orchestrator.sandboxes.docker.conftest import docker_settings, remove_containers
from tests.sandbox_image import derived_image, ensure_sandbox_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]

USER = 17
GROUP = GroupRef("feishu", "oc_team")


def sandbox_user(service: OrchestratorService, user_id: int = USER, groups: tuple[GroupRef, ...] = ()) -> SandboxUser:
    service.users.upsert(user_id, display_name=None, backend=None)  # a user the orchestrator knows
    gids = {group: service.group_gids.gid_of(group) for group in groups}
    return SandboxUser(user_id, plan_mounts(service.layout, user_id, groups, gids))


def workdir(service: OrchestratorService, user_id: int = USER) -> str:
    return str(service.directories.ensure_session_runtime(user_id, "s1", is_owner=True))


def backend_of(service: OrchestratorService) -> DockerBackend:
    backend = service.sandboxes.backend_named("docker", DockerBackend)
    assert backend is not None
    return backend


def ensured_build(backend: DockerBackend, user: SandboxUser) -> str | None:
    """The agent BUILD running in the user's container once `ensure` made it current."""
    backend.ensure(user)
    return next(s.agent_build for s in backend.status() if s.user_id == user.user_id)


def containers_of(engine: docker.DockerClient, service: OrchestratorService, user_id: int) -> list:
    backend = backend_of(service)
    return [c for c in backend.driver._managed_containers() if c.labels.get(LABEL_USER) == str(user_id)]


def in_background(backend: DockerBackend, user: SandboxUser, command: str, cwd: str) -> tuple[threading.Thread, list]:
    """A long `shell` call on another thread; its result lands in the returned list."""
    results: list = []
    thread = threading.Thread(target=lambda: results.append(blocking_call(backend, user, "shell", {"command": command}, cwd=cwd)))
    thread.start()
    return thread, results


def the_container(engine: docker.DockerClient, service: OrchestratorService, user_id: int = USER):  # type: ignore[no-untyped-def]
    found = containers_of(engine, service, user_id)
    assert len(found) == 1, [c.name for c in found]
    return found[0]


def test_container_is_hardened_runs_as_the_user_and_holds_no_secret(
    docker_service: OrchestratorService, engine: docker.DockerClient
) -> None:
    user = sandbox_user(docker_service)
    blocking_call(backend_of(docker_service), user, "list_dir", {"path": "."}, cwd=workdir(docker_service))
    attrs = the_container(engine, docker_service).attrs
    host, config = attrs["HostConfig"], attrs["Config"]
    assert host["NetworkMode"] == "none" and host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"][0] == "no-new-privileges" and host["SecurityOpt"][1].startswith("seccomp=")
    # No engine init: the sandbox supervisor is PID 1; the host's block devices are masked.
    assert host["ReadonlyRootfs"] is True and not host["Init"]
    assert {"/sys/block", "/sys/devices/virtual/block", "/proc/diskstats", "/proc/kcore"} <= set(host["MaskedPaths"])
    assert host["NanoCpus"] == 1_000_000_000 and host["Memory"] == 1024 * 2**20 and host["PidsLimit"] == 512
    base = docker_service.settings.sandbox_uid_base  # the block in force; the shared gid is its base
    assert config["User"] == f"{base + USER}:{base + USER}" and host["GroupAdd"] == [str(base)]
    mounts = {m["Destination"]: (m["Source"], m["RW"]) for m in attrs["Mounts"]}
    expected = {str(m.sandbox_path): (str(m.host_path), m.access.value == "rw") for m in user.plan.mounts}
    ca = docker_service.settings.egress_ca_bundle
    if docker_service.settings.egress != "off" and ca.is_file():
        expected[str(ca)] = (str(ca), False)  # the host's CA bundle for pip/npm behind the proxy, read-only
    assert mounts == expected
    token = docker_service.layout.token_path(USER)
    # root's, readable by the sandbox's gid only, in a directory the sandbox cannot write
    assert (token.stat().st_mode & 0o777, token.stat().st_uid, token.stat().st_gid) == (0o640, 0, base + USER)
    assert mounts[str(token.parent)] == (str(token.parent), False)
    lease = docker_service.layout.lease_path(USER)  # the same for the lease its supervisor reads
    assert (lease.stat().st_mode & 0o777, lease.stat().st_uid, lease.stat().st_gid) == (0o640, 0, base + USER)
    secret = token.read_text().strip()
    visible = " ".join([*config["Env"], *(config["Cmd"] or []), *(config["Entrypoint"] or []), *attrs["Args"]])
    assert secret not in visible and "token" not in visible.lower()


def test_concurrent_first_calls_create_exactly_one_container(
    docker_service: OrchestratorService, engine: docker.DockerClient
) -> None:
    backend = backend_of(docker_service)
    user = sandbox_user(docker_service)
    cwd = workdir(docker_service)
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
    the_container(engine, docker_service)


def test_a_killed_container_is_recreated_and_the_next_call_succeeds(
    docker_service: OrchestratorService, engine: docker.DockerClient, caplog: pytest.LogCaptureFixture
) -> None:
    backend = backend_of(docker_service)
    user = sandbox_user(docker_service)
    cwd = workdir(docker_service)
    blocking_call(backend, user, "write_file", {"path": "a.txt", "content": "kept"}, cwd=cwd)
    first = the_container(engine, docker_service)
    first.kill()  # `docker kill`
    # The warm path asks no Docker API: the call meets a dead socket (never delivered), and the
    # protocol sends it once more after `ensure` recreated the container.
    with caplog.at_level(logging.WARNING, logger="orchestrator.sandboxes.calling"):
        assert blocking_call(backend, user, "read_file", {"path": "a.txt"}, cwd=cwd)["content"] == "kept"
    assert len([r for r in caplog.records if "was unreachable" in r.getMessage()]) == 1
    second = the_container(engine, docker_service)
    assert second.id != first.id and second.status == "running"


def test_a_crash_during_a_call_is_reported_and_the_next_call_recovers(
    docker_service: OrchestratorService, engine: docker.DockerClient
) -> None:
    backend = backend_of(docker_service)
    user = sandbox_user(docker_service)
    cwd = workdir(docker_service)
    blocking_call(backend, user, "list_dir", {"path": "."}, cwd=cwd)
    first = the_container(engine, docker_service)
    with pytest.raises(ToolError) as crashed:
        blocking_call(backend, user, "shell", {"command": "kill -9 $PPID; sleep 5"}, cwd=cwd)  # the agent dies
    # The same words as the process backend's (tests/orchestrator/sandboxes/test_call_protocol.py).
    assert crashed.value.code == "sandbox_unavailable" and crashed.value.message == died_mid_call(USER)
    assert "did not run" not in crashed.value.message
    assert blocking_call(backend, user, "shell", {"command": "echo back"}, cwd=cwd)["stdout"] == "back\n"
    assert the_container(engine, docker_service).id != first.id


def test_an_orchestrator_restart_adopts_containers_and_removes_unknown_users(
    docker_data_dir: Path, sandbox_image: str, engine: docker.DockerClient
) -> None:
    settings = docker_settings(docker_data_dir, sandbox_image)
    first = OrchestratorService(settings)
    try:
        user = sandbox_user(first)
        cwd = workdir(first)
        blocking_call(backend_of(first), user, "write_file", {"path": "a.txt", "content": "x"}, cwd=cwd)
        # a container of a user this orchestrator's state does not know (e.g. a restored backup)
        stranger = SandboxUser(55, plan_mounts(first.layout, 55))
        backend_of(first).ensure(stranger)
        before = the_container(engine, first)
        started_at = before.attrs["State"]["StartedAt"]
        assert len(containers_of(engine, first, 55)) == 1
    finally:
        first.close()  # containers keep running

    second = OrchestratorService(settings)
    try:
        backend = backend_of(second)
        backend.adopt()
        assert containers_of(engine, second, 55) == []
        assert blocking_call(backend, sandbox_user(second), "read_file", {"path": "a.txt"}, cwd=cwd)["content"] == "x"
        after = the_container(engine, second)
        assert after.id == before.id and after.attrs["State"]["StartedAt"] == started_at  # adopted, not restarted
    finally:
        second.close()


def test_a_changed_plan_recreates_the_container_once_it_is_idle(
    docker_service: OrchestratorService, engine: docker.DockerClient
) -> None:
    backend = backend_of(docker_service)
    cwd = workdir(docker_service)
    before = sandbox_user(docker_service)
    blocking_call(backend, before, "list_dir", {"path": "."}, cwd=cwd)
    first = the_container(engine, docker_service)

    after = sandbox_user(docker_service, groups=(GROUP,))  # the user joined a group chat
    group_dir = str(docker_service.layout.group_dir(GROUP))
    slow, slow_result = in_background(backend, before, "sleep 2; echo slept", cwd)
    time.sleep(0.5)
    # busy: the running call finishes in the old container, and this one is served there too
    with pytest.raises(ToolError) as missing:
        blocking_call(backend, after, "list_dir", {"path": group_dir}, cwd=cwd)
    assert missing.value.code in ("not_found", "path_escape")
    assert the_container(engine, docker_service).id == first.id
    slow.join()
    assert slow_result[0]["stdout"] == "slept\n"  # not cut off by the drift
    # idle now: recreated with the group workspace mounted
    assert blocking_call(backend, after, "list_dir", {"path": group_dir}, cwd=cwd) is not None
    second = the_container(engine, docker_service)
    assert second.id != first.id
    assert group_dir in {m["Destination"] for m in second.attrs["Mounts"]}


def test_a_new_image_recreates_the_container_on_the_next_idle_call(
    docker_data_dir: Path, sandbox_image: str, engine: docker.DockerClient
) -> None:
    repository, tag = "sandbox-orchestrator/sandbox", f"test-{uuid.uuid4().hex[:8]}"
    engine.images.get(sandbox_image).tag(repository, tag)
    service = OrchestratorService(docker_settings(docker_data_dir, f"{repository}:{tag}"))
    try:
        backend = backend_of(service)
        user = sandbox_user(service)
        cwd = workdir(service)
        blocking_call(backend, user, "list_dir", {"path": "."}, cwd=cwd)
        first = the_container(engine, service)
        # An operator builds a new image under the same tag.
        newer = derived_image(engine, sandbox_image, f"{repository}:{tag}", {"org.sandbox-orchestrator.test": "newer"})
        time.sleep(IMAGE_RECHECK_S + 0.1)  # the warm path re-resolves the tag this often
        assert blocking_call(backend, user, "shell", {"command": "echo new"}, cwd=cwd)["stdout"] == "new\n"
        second = the_container(engine, service)
        assert second.id != first.id and second.image.id == newer
    finally:
        service.close()
        remove_containers(docker_data_dir)
        engine.images.remove(f"{repository}:{tag}", force=True)


def test_a_new_agent_build_restarts_the_agent_in_the_same_container_when_idle(
    docker_service: OrchestratorService, engine: docker.DockerClient, tmp_path: Path
) -> None:
    # The host's agent code changes (an upgrade): a copy of the package we can edit.
    package = tmp_path / "sandbox_agent"
    shutil.copytree(PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))

    def new_release() -> str:
        with open(package / "__init__.py", "a") as fh:
            fh.write("\n# a new release\n")
        return compute_build_id(package)

    def backend_with(deployment: AgentDeployment) -> DockerBackend:
        return DockerBackend(
            SandboxSettings.of(docker_service.settings), docker_service.directories, deployment, known_user=lambda _: True
        )

    user = sandbox_user(docker_service)
    cwd = workdir(docker_service)
    deployment = AgentDeployment(docker_service.layout, package_dir=package)
    backend = backend_with(deployment)
    try:
        old_build = compute_build_id(package)
        assert ensured_build(backend, user) == old_build
        first = the_container(engine, docker_service)
        started_at = first.attrs["State"]["StartedAt"]

        slow, slow_result = in_background(backend, user, "sleep 3; echo slept", cwd)
        time.sleep(0.3)
        new_build = new_release()
        assert deployment.refresh() == new_build != old_build
        # busy: the old agent keeps serving, the running call is not cut off
        assert blocking_call(backend, user, "shell", {"command": "echo busy"}, cwd=cwd)["stdout"] == "busy\n"
        assert ensured_build(backend, user) == old_build
        slow.join()
        assert slow_result[0]["stdout"] == "slept\n"
        assert ensured_build(backend, user) == new_build  # idle: restarted
        after = the_container(engine, docker_service)
        assert after.id == first.id and after.attrs["State"]["StartedAt"] != started_at
        assert blocking_call(backend, user, "shell", {"command": "echo ok"}, cwd=cwd)["stdout"] == "ok\n"
    finally:
        backend.close()

    # An orchestrator restarted with newer agent code adopts the container and restarts its agent.
    newest = new_release()
    backend = backend_with(AgentDeployment(docker_service.layout, package_dir=package))
    try:
        backend.adopt()
        assert ensured_build(backend, user) == newest
        assert the_container(engine, docker_service).id == first.id
    finally:
        backend.close()


def test_idle_containers_are_stopped_and_start_again_on_the_next_call(
    docker_data_dir: Path, sandbox_image: str, engine: docker.DockerClient
) -> None:
    service = OrchestratorService(docker_settings(docker_data_dir, sandbox_image, idle_timeout_s=1.0))
    try:
        backend = backend_of(service)
        service.start()  # the reaper (a periodic task of the composition root)
        user = sandbox_user(service)
        cwd = workdir(service)
        blocking_call(backend, user, "list_dir", {"path": "."}, cwd=cwd)
        container = the_container(engine, service)
        deadline = time.monotonic() + 15
        while container.status == "running" and time.monotonic() < deadline:
            time.sleep(0.2)
            container.reload()
        assert container.status == "exited"
        assert container.attrs["State"]["ExitCode"] in (0, 143)  # a clean stop, not a kill
        assert [s.state for s in backend.status()] == ["stopped"]
        assert blocking_call(backend, user, "shell", {"command": "echo again"}, cwd=cwd)["stdout"] == "again\n"
        assert the_container(engine, service).id == container.id  # the same container, started again
    finally:
        service.close()


def test_a_sandbox_that_cannot_start_gives_a_clear_error(docker_data_dir: Path, engine: docker.DockerClient) -> None:
    # The base image has no agent runtime: the container exits at once. Labelled as fitting,
    # so that it gets as far as starting a container.
    broken = f"sandbox-orchestrator/sandbox:test-no-runtime-{uuid.uuid4().hex[:8]}"
    labels = {LABEL_ROLE: ROLE_SANDBOX, LABEL_AGENT_LOCK: str(expected_agent_lock())}
    derived_image(engine, ensure_sandbox_image().base_image, broken, labels)
    service = OrchestratorService(docker_settings(docker_data_dir, broken, sandbox_ready_timeout_s=10))
    try:
        with pytest.raises(ToolError) as failed:
            blocking_call(backend_of(service), sandbox_user(service), "list_dir", {"path": "."}, cwd=workdir(service))
        assert failed.value.code == "sandbox_unavailable"
        assert f"sandbox of user {USER} is not available" in failed.value.message
        assert "did not start" in failed.value.message or "docker refused" in failed.value.message
    finally:
        service.close()
        engine.images.remove(broken, force=True)
