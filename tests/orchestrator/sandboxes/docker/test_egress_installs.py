"""In a real docker sandbox (network `none`): pip installs a real package from PyPI into
deps/{uid}/pip and npm one from the npm registry into deps/{uid}/npm, through the egress
proxy, and both load; a registry taken off the user's list is refused. Only the package
registries and loopback are contacted."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from orchestrator import audit
from orchestrator.service import OrchestratorService
from tests.api_calls import tool
from tests.conftest import admin_headers
from tests.orchestrator.sandboxes.docker.conftest import RUNTIMES
from tests.orchestrator.sandboxes.test_process_network import web_run

pytestmark = pytest.mark.docker

NPM_INDEX = (
    "python3 -c \"import json, urllib.request; "
    "d = json.load(urllib.request.urlopen('https://registry.npmjs.org/is-number', timeout=60)); "
    "print(d['name'], 'latest' in d['dist-tags'])\""
)


def shell(client: TestClient, run_id: str, command: str) -> dict:
    answer = tool(client, run_id, "shell", command=command, timeout_s=240)
    assert answer["ok"], answer
    return answer["result"]


@pytest.mark.parametrize("sandbox_runtime", RUNTIMES)  # under gVisor: its gofer is the proxy's peer
def test_pip_installs_into_deps_through_the_proxy_and_npm_reaches_its_registry(
    docker_client: TestClient, docker_service: OrchestratorService
) -> None:
    user_id = 67
    deps = docker_service.layout.deps_dir(user_id)
    run_id = web_run(docker_client, user_id)
    installed = shell(docker_client, run_id, f"pip install --target {deps}/pip six 2>&1 | tail -3")
    assert installed["exit_code"] == 0 and "Successfully installed six" in installed["stdout"], installed
    imported = shell(docker_client, run_id, "cd / && python3 -c 'import six; print(six.__file__)'")
    assert imported["stdout"].strip() == f"{deps}/pip/six.py", imported
    assert (deps / "pip" / "six.py").is_file()
    npm = shell(
        docker_client, run_id,
        f"npm install --no-audit --no-fund --prefix {deps}/npm is-number >/dev/null 2>&1; "
        f"node -e \"console.log(require('{deps}/npm/node_modules/is-number')(5))\"",
    )  # fmt: skip
    assert npm["exit_code"] == 0 and npm["stdout"].strip() == "true", npm
    assert (deps / "npm" / "node_modules" / "is-number" / "package.json").is_file()
    index = shell(docker_client, run_id, NPM_INDEX)  # Python's TLS trusts the host's bundle too
    assert index["exit_code"] == 0 and index["stdout"].split() == ["is-number", "True"], index

    removed = docker_client.put(
        f"/v1/admin/users/{user_id}/egress", json={"remove": ["registry.npmjs.org"]}, headers=admin_headers()
    )
    assert removed.status_code == 200 and "registry.npmjs.org" not in removed.json()["effective"]
    refused = shell(docker_client, run_id, NPM_INDEX + " 2>&1 | tail -1")
    assert "403" in refused["stdout"], refused

    assert docker_service.egress is not None
    docker_service.egress.flush_audit()
    rows = [r for r in audit.entries(docker_service.store, action="egress_connection", limit=500) if r.runtime_user_id == user_id]
    seen = {(r.detail["host"], r.detail["verdict"]) for r in rows}
    assert {("pypi.org", "allowed"), ("files.pythonhosted.org", "allowed"), ("registry.npmjs.org", "allowed"),
            ("registry.npmjs.org", "host_not_allowed")} <= seen, seen  # fmt: skip
    allowed = [r for r in rows if r.detail["verdict"] == "allowed"]
    assert all(r.detail["address"] and r.detail["bytes_down"] > 0 for r in allowed)


def test_healthz_says_where_egress_is_not_enforced(docker_data_dir, sandbox_image: str) -> None:  # type: ignore[no-untyped-def]
    from tests.agent_env import serving
    from tests.orchestrator.sandboxes.docker.conftest import docker_settings

    with serving(docker_settings(docker_data_dir, sandbox_image, backend="auto", sandbox_network="bridge")) as (client, _):
        egress = client.get("/healthz", headers=admin_headers()).json()["egress"]
    assert egress["mode"] == "allowlist" and egress["enforced"]["docker"] is False, egress
    assert "not enforced for docker" in egress["warning"], egress
    assert egress["allow_default"] == ["pypi.org", "*.pythonhosted.org", "registry.npmjs.org"]
