"""Item 9 of the hostile-tenant issue: a process-backend sandbox has no network of its own
host's. As root every agent starts in a fresh network namespace with only `lo` (like docker's
`none`), with and without bwrap; a sandbox shell can reach neither the orchestrator's API nor
any other service listening on the host's loopback. Only loopback is ever contacted here."""

from __future__ import annotations

import os
import socket
import shutil
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.api_calls import tool
from tests.conftest import API_TOKEN, admin_headers, make_settings

AS_ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(not AS_ROOT, reason="network namespaces need a root orchestrator")

CONNECT = (
    "python3 -c \"import socket,sys; s=socket.socket(); s.settimeout(3)\n"
    "try:\n s.connect(('127.0.0.1', {port})); print('CONNECTED')\n"
    "except OSError as e:\n print('REFUSED', e); sys.exit(3)\""
)


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A service on the host's loopback, as the orchestrator's own API is."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


def web_run(client: TestClient, user_id: int) -> str:
    response = client.post("/v1/sessions", json={"owner_user_id": user_id, "channel": "web"})
    assert response.status_code == 201, response.text
    run = client.post(f"/v1/sessions/{response.json()['session_id']}/runs", json={"trigger": "web"})
    assert run.status_code == 201, run.text
    return run.json()["run_id"]


def shell(client: TestClient, run_id: str, command: str) -> dict:
    answer = tool(client, run_id, "shell", command=command)
    assert answer["ok"], answer
    return answer["result"]


def sandbox_has_no_host_network(client: TestClient, port: int) -> None:
    run_id = web_run(client, 67)
    connect = shell(client, run_id, CONNECT.format(port=port))
    assert "CONNECTED" not in connect["stdout"], connect
    assert connect["exit_code"] == 3, connect
    interfaces = shell(client, run_id, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert interfaces["stdout"].split() == ["lo"], interfaces
    # /proc/net/route lists IPv4 routes (lo's own live in the local table): none at all here.
    routes = shell(client, run_id, "tail -n +2 /proc/net/route")
    assert routes["stdout"].strip() == "", routes
    # lo is up: a sandbox may still talk to itself (a dev server and its test).
    own = shell(
        client,
        run_id,
        "python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(1);"
        " c=socket.create_connection(s.getsockname(), timeout=3); print('SELF OK')\"",
    )
    assert own["stdout"].strip() == "SELF OK", own


def test_item9_process_sandbox_cannot_reach_host_loopback(agent_client: TestClient, host_listener: int) -> None:
    sandbox_has_no_host_network(agent_client, host_listener)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
def test_item9_bwrap_sandbox_cannot_reach_host_loopback(agent_data_dir, host_listener: int) -> None:
    service = OrchestratorService(make_settings(agent_data_dir, process_sandbox="bwrap"))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            sandbox_has_no_host_network(client, host_listener)
    finally:
        service.close()


def test_item9_healthz_reports_the_isolation(agent_client: TestClient, agent_service: OrchestratorService) -> None:
    isolation = agent_client.get("/healthz", headers=admin_headers()).json()["isolation"]
    base, top = agent_service.settings.sandbox_uid_base, agent_service.settings.max_user_id  # the block in force
    # A uid and a network namespace of its own, but the host's /tmp: not isolated (bwrap is).
    assert isolation == {
        "users_isolated": False, "process_network": "namespace", "uid_base": base, "uid_block": [base, base + top],
        "reason": "without bwrap every sandbox can write the host's /tmp (and read what others leave there)",
        "process_lifetime": "cgroup", "process_limits": isolation["process_limits"],
    }  # fmt: skip
    assert isolation["process_limits"] in ("v1", "v2")


def test_without_root_the_isolation_says_users_are_not_isolated() -> None:
    from orchestrator.sandboxes.netns import decide_isolation

    plain = decide_isolation(as_root=False, bwrap=False, netns=(False, "not needed"), uid_base=100000)
    assert plain.as_json()["users_isolated"] is False and plain.process_network == "host" and not plain.complete
    assert "not root" in str(plain.reason)
    no_caps = decide_isolation(as_root=True, bwrap=False, netns=(False, "Operation not permitted"), uid_base=100000)
    assert no_caps.process_network == "host" and "Operation not permitted" in str(no_caps.reason)
    assert decide_isolation(as_root=True, bwrap=True, netns=(False, "not needed"), uid_base=1).complete
    host_tmp = decide_isolation(as_root=True, bwrap=False, netns=(True, "ok"), uid_base=1)
    assert not host_tmp.users_isolated and "/tmp" in str(host_tmp.reason)  # the host's /tmp is shared
    assert plain.as_json()["process_lifetime"] == "unbounded" and "not root" in str(plain.lifetime_reason)
