"""Real Docker: from B's container, A's runtime, uploads and home are not there;
skill views are read-only and the content store cannot be changed by anything B runs; there
is no network. Everything runs through the API, as a model's tool calls would."""

from __future__ import annotations

from tests.conftest import admin_headers

import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.api_calls import group_session, start_run, tool
from tests.orchestrator.sandboxes.docker.conftest import RUNTIMES
from tests.orchestrator.sandboxes.skill_attack import attack_skill_views, write_skills

pytestmark = [pytest.mark.docker, pytest.mark.slow]

A, B = 17, 67


def shell(client: TestClient, run_id: str, command: str) -> dict:
    answer = tool(client, run_id, "shell", command=command)
    assert answer["ok"] is True, answer
    return answer["result"]


@pytest.mark.parametrize("sandbox_runtime", RUNTIMES)
def test_b_cannot_see_as_runtime_uploads_or_home_and_there_is_no_network(
    docker_client: TestClient, docker_service: OrchestratorService, sandbox_runtime: str
) -> None:
    layout = docker_service.layout
    sid = group_session(docker_client)
    a_run = start_run(docker_client, sid, trigger="web")
    assert tool(docker_client, a_run["run_id"], "write_file", path="secret.txt", content="A's")["ok"]
    assert tool(docker_client, a_run["run_id"], "write_file", path=f"{a_run['upload_dir']}/a.png", content="png")["ok"]
    assert tool(docker_client, a_run["run_id"], "write_file", path=f"{layout.home_dir(A)}/.netrc", content="x")["ok"]

    b_run = start_run(docker_client, sid, trigger="group_message", speaker_user_id=B)
    assert b_run["runtime_user_id"] == B
    a_places = [layout.runtime_user_dir(A), a_run["workdir"], layout.uploads_dir(A), layout.home_dir(A),
                layout.deps_dir(A), layout.tmp_dir(A), layout.socket_dir(A), layout.state_dir,
                layout.sessions_root, layout.content_store]  # fmt: skip
    for place in a_places:
        # `shell` goes around the PathSandbox: only the container's mounts keep A's files away.
        result = shell(docker_client, b_run["run_id"], f"ls -a {place}; cat {place}/secret.txt {place}/a.png")
        assert result["exit_code"] != 0, place
        assert "No such file or directory" in result["stderr"], place
        assert "A's" not in result["stdout"] and "png" not in result["stdout"]
    # B's own places are there and B's own
    # (Python's stat: coreutils' `stat` fails under Debian's gVisor build, docs/docker.md)
    owners = "python3 -c 'import os, sys; print(*(os.stat(p).st_uid for p in sys.argv[1:]))'"
    mine = shell(docker_client, b_run["run_id"], f"id -u; {owners} {layout.home_dir(B)} {b_run['upload_dir']} /tmp")
    assert mine["stdout"].split() == [str(docker_service.settings.sandbox_uid_base + B)] * 4

    # no network: only the loopback interface, and the host's loopback services are not reachable
    probe = (
        "import socket; print([n for _, n in socket.if_nameindex()]);"
        "s = socket.socket(); s.settimeout(2)\n"
        "try:\n s.connect(('127.0.0.1', 8700)); print('connected')\n"
        "except OSError as e: print('refused', e.errno)"
    )
    result = shell(docker_client, b_run["run_id"], f"python3 -c \"{probe}\"")
    assert result["stdout"].splitlines() == ["['lo']", "refused 111"]

    # the containers ran under the runtime asked for, and /healthz says which kernel that is
    backend = docker_service.sandboxes.backends["docker"]
    assert {c.attrs["HostConfig"]["Runtime"] for c in backend.driver._managed_containers()} == {sandbox_runtime}  # type: ignore[attr-defined]
    boundary = docker_client.get("/healthz", headers=admin_headers()).json()["kernel_boundary"]["docker"]
    assert boundary == {"kernel": "gvisor" if sandbox_runtime == "runsc" else "host", "runtime": sandbox_runtime}


@pytest.mark.parametrize("sandbox_runtime", RUNTIMES)
def test_skill_views_are_read_only_and_the_store_survives_an_attack_from_inside(
    docker_client: TestClient, docker_service: OrchestratorService
) -> None:
    write_skills(docker_service.layout)
    attack_skill_views(docker_client, docker_service.layout, B)
