"""Issue 12 items 1 and 2 against a real engine: a member (67) whose `shell` controls its own
socket directory tries to make the host (root) hand it the owner's (17) sandbox, or a secret
only root can read, across an orchestrator restart (which makes the host reconnect to the
agents it adopts). Everything goes through the HTTP API and 67's own sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
import pytest
from fastapi.testclient import TestClient

from orchestrator.sandboxes.docker_spec import LABEL_USER
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.settings import Settings
from tests.api_calls import MEMBER, OWNER, group_session, start_run, tool
from tests.conftest import ADMIN_TOKEN, API_TOKEN
from tests.orchestrator.sandboxes.docker.conftest import RUNTIMES, docker_settings

pytestmark = [pytest.mark.docker, pytest.mark.slow]

# Run by 67's sandbox uid inside 67's container: listen where the agent listened and write
# down every request head the host sends (the Authorization header is the prize).
LISTENER = """
import os, socket, sys
path, seen = sys.argv[1], sys.argv[2]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(16)
open(seen + ".ready", "w").close()
while True:
    conn, _ = server.accept()
    conn.settimeout(5)
    head = b""
    try:
        while b"\\r\\n\\r\\n" not in head and len(head) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
    except OSError:
        pass
    with open(seen, "ab") as out:
        out.write(head + b"\\n----\\n")
    conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\n{}")
    conn.close()
"""


@contextmanager
def api(settings: Settings) -> Iterator[tuple[OrchestratorService, TestClient]]:
    service = OrchestratorService(settings)
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield service, client
    finally:
        service.close()  # containers keep running: the next service adopts them


def shell(client: TestClient, run_id: str, command: str) -> dict:
    answer = tool(client, run_id, "shell", command=command)
    assert answer["ok"] is True, answer
    return answer["result"]


def container_of(engine: docker.DockerClient, service: OrchestratorService, user_id: int):  # type: ignore[no-untyped-def]
    assert service.sandboxes.backends.get("docker") is not None
    found = [c for c in service.sandboxes.backends.get("docker").driver._managed_containers() if c.labels.get(LABEL_USER) == str(user_id)]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("sandbox_runtime", RUNTIMES)
def test_item1_socket_and_token_symlinks_to_another_user_do_not_hijack_its_sandbox(
    docker_data_dir: Path, sandbox_image: str, sandbox_runtime: str
) -> None:
    settings = docker_settings(docker_data_dir, sandbox_image, sandbox_runtime=sandbox_runtime)
    with api(settings) as (service, client):
        layout = service.layout
        sid = group_session(client)
        owner_run = start_run(client, sid, trigger="web")
        secret_path = f"{layout.home_dir(OWNER)}/secret.txt"
        assert tool(client, owner_run["run_id"], "write_file", path=secret_path, content="17's secret")["ok"]
        member_run = start_run(client, sid, trigger="group_message", speaker_user_id=MEMBER)["run_id"]
        # 67's own shell: its token and socket become links to 17's (the host resolves them).
        mine, theirs = layout.socket_dir(MEMBER), layout.socket_dir(OWNER)
        planted = shell(client, member_run, f"rm -f {mine}/token {mine}/agent.sock && ln -s {theirs}/token {mine}/token && ln -s {theirs}/agent.sock {mine}/agent.sock")
        assert planted["exit_code"] == 0, planted

    with api(settings) as (service, client):  # the restart: 67's container is adopted, reconnected
        answer = tool(client, member_run, "read_file", path=secret_path)
        assert answer["ok"] is False, answer
        assert "17's secret" not in json.dumps(answer)
        # 67's calls run in 67's own sandbox, as 67's uid
        assert shell(client, member_run, "id -u")["stdout"].strip() == str(settings.sandbox_uid_base + MEMBER)


@pytest.mark.parametrize("sandbox_runtime", RUNTIMES)
def test_item2_a_token_link_to_a_root_only_file_never_reaches_the_users_listener(
    docker_data_dir: Path, sandbox_image: str, engine: docker.DockerClient, sandbox_runtime: str
) -> None:
    settings = docker_settings(docker_data_dir, sandbox_image, sandbox_runtime=sandbox_runtime)
    root_only = docker_data_dir.parent / "root-only-secret"
    root_only.write_text(ADMIN_TOKEN + "\n")
    os.chmod(root_only, 0o600)
    with api(settings) as (service, client):
        layout = service.layout
        sid = group_session(client)
        member_run = start_run(client, sid, trigger="group_message", speaker_user_id=MEMBER)["run_id"]
        mine = layout.socket_dir(MEMBER)
        seen = layout.home_dir(MEMBER) / "seen.txt"
        planted = shell(client, member_run, f"rm -f {mine}/token; ln -s {root_only} {mine}/token; cat {mine}/token")
        assert "No such file" in planted["stderr"], planted  # the sandbox itself cannot read it
        container = container_of(engine, service, MEMBER)
    # 67's own listener on its socket path, run by 67's uid in 67's container (started after the
    # call ended, so it does not depend on processes outliving a call)
    uid = settings.sandbox_uid_base + MEMBER
    container.exec_run(["python3", "-c", LISTENER, str(layout.socket_path(MEMBER)), str(seen)], user=f"{uid}:{uid}", detach=True)
    deadline = time.monotonic() + 20
    while not Path(f"{seen}.ready").exists():
        assert time.monotonic() < deadline, "the listener did not start"
        time.sleep(0.05)

    with api(settings) as (service, client):  # the restart: the host reconnects to "the agent"
        assert shell(client, member_run, "echo back")["stdout"] == "back\n"
    recorded = seen.read_text(errors="replace") if seen.exists() else ""
    assert "GET /health" in recorded  # the host did talk to 67's listener (its peer is 67's uid)
    assert ADMIN_TOKEN not in recorded and API_TOKEN not in recorded


@pytest.mark.parametrize("sandbox_runtime", RUNTIMES)
def test_a_socket_link_to_a_root_daemons_socket_is_never_spoken_to(
    docker_data_dir: Path, sandbox_image: str, sandbox_runtime: str
) -> None:
    """67 turns its agent socket into a link to a socket a root daemon of the host listens on
    (dockerd's, say). Across a restart the host reconnects through that path: it must see that
    the listener is not 67's sandbox before it sends a byte. Under gVisor 67's own agent is
    served by a root process (its gofer) too, so "uid 0" cannot be what the host trusts."""
    settings = docker_settings(docker_data_dir, sandbox_image, sandbox_runtime=sandbox_runtime)
    daemon_socket = docker_data_dir.parent / "root-daemon.sock"
    seen = docker_data_dir.parent / "root-daemon.seen"
    daemon = subprocess.Popen([sys.executable, "-c", LISTENER, str(daemon_socket), str(seen)])  # root, like dockerd
    try:
        deadline = time.monotonic() + 20
        while not Path(f"{seen}.ready").exists():
            assert time.monotonic() < deadline, "the root listener did not start"
            time.sleep(0.05)
        with api(settings) as (service, client):
            layout = service.layout
            sid = group_session(client)
            member_run = start_run(client, sid, trigger="group_message", speaker_user_id=MEMBER)["run_id"]
            mine = layout.socket_dir(MEMBER)
            planted = shell(client, member_run, f"rm -f {mine}/agent.sock && ln -s {daemon_socket} {mine}/agent.sock && echo planted")
            assert planted["stdout"] == "planted\n", planted

        with api(settings) as (service, client):  # the restart: the host reconnects to "the agent"
            # refused, so 67's sandbox is replaced and its calls run there as 67's uid
            assert shell(client, member_run, "id -u")["stdout"].strip() == str(settings.sandbox_uid_base + MEMBER)
        recorded = seen.read_text(errors="replace") if seen.exists() else ""
        heads = recorded.split("\n----\n")[:-1]  # one per connection the host opened
        assert all(head == "" for head in heads), recorded  # connected, refused, closed: not a byte sent
    finally:
        daemon.kill()
        daemon.wait()
