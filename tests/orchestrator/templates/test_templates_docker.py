"""Templates through the API with real builds on the real engine: a template with one Debian
package (figlet) and one pip package (tabulate) builds in the background; user 67 gets it and user 17
does not, each seeing only its own tools; a recipe change rebuilds and the idle sandbox is
recreated with its files intact; the same recipe again is a no-op; a broken recipe reports
`failed` with its log while the previous image keeps serving; a template in use cannot be
deleted. The fetch step reaches Debian's mirror and PyPI; sandboxes reach nothing."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.api_calls import tool
from tests.conftest import API_TOKEN, admin_headers
from tests.orchestrator.sandboxes.docker.conftest import TEST_BASE, docker_settings, remove_containers
from tests.orchestrator.sandboxes.docker.conftest import sandbox_image  # noqa: F401 - a fixture
from tests.orchestrator.sandboxes.test_process_network import web_run

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RECIPE = {"apt": ["figlet"], "pip": ["tabulate==0.9.0"]}
BUILD_TIMEOUT_S = 900.0


@pytest.fixture(scope="module")
def served(sandbox_image: str) -> Iterator[tuple[TestClient, OrchestratorService]]:
    TEST_BASE.mkdir(mode=0o711, parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="t-", dir=TEST_BASE))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    service = OrchestratorService(docker_settings(data, sandbox_image))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield client, service
    finally:
        service.close()
        remove_containers(data)
        shutil.rmtree(base, ignore_errors=True)


def put_template(client: TestClient, name: str, body: dict) -> dict:
    answer = client.put(f"/v1/admin/templates/{name}", json=body, headers=admin_headers())
    assert answer.status_code == 202, answer.text
    return answer.json()


def built(client: TestClient, name: str) -> dict:
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    while True:
        got = client.get(f"/v1/admin/templates/{name}", headers=admin_headers())
        assert got.status_code == 200, got.text
        if got.json()["status"] != "building":
            return got.json()
        assert time.monotonic() < deadline, got.json()
        time.sleep(1.0)


def sh(client: TestClient, run_id: str, command: str) -> dict:
    answer = tool(client, run_id, "shell", command=command, timeout_s=60)
    assert answer["ok"], answer
    return answer["result"]


def container_of(service: OrchestratorService, user_id: int) -> str:
    status = [s for s in service.sandboxes.backends["docker"].status() if s.user_id == user_id]
    assert status, "no container"
    return str(status[0].detail["container_id"])  # type: ignore[index]


TOOLS = "command -v figlet >/dev/null && echo figlet; python3 -c 'import tabulate' 2>/dev/null && echo tabulate; echo \"team=$TEAM\""


@pytest.fixture(scope="module")
def tools_template(served: tuple[TestClient, OrchestratorService]) -> dict:
    client, _ = served
    answer = put_template(client, "tools", RECIPE)
    assert answer["name"] == "tools" and answer["status"] in ("building", "ready"), answer
    ready = built(client, "tools")
    assert ready["status"] == "ready" and ready["error"] is None, ready["log"][-3000:]
    assert ready["recipe_hash"] and ready["image"].endswith(":" + ready["recipe_hash"][:16]), ready
    return ready


def test_a_template_serves_user_67_only_and_a_change_recreates_the_idle_sandbox_files_kept(
    served: tuple[TestClient, OrchestratorService], tools_template: dict
) -> None:
    client, service = served
    listed = client.get("/v1/admin/templates", headers=admin_headers()).json()["templates"]
    assert [t["name"] for t in listed] == ["tools"]
    assert client.put("/v1/users/17", json={}).status_code == 200
    assert client.put("/v1/users/67", json={}).status_code == 200
    assigned = client.put("/v1/admin/users/67/template", json={"template": "tools"}, headers=admin_headers())
    assert assigned.status_code == 200, assigned.text
    assert assigned.json()["template"] == {"name": "tools", "source": "user"}
    assert client.get("/v1/users/67").json()["template"] == {"name": "tools", "source": "user"}
    assert client.get("/v1/users/17").json()["template"] == {"name": "default", "source": "default"}

    run_67, run_17 = web_run(client, 67), web_run(client, 17)
    assert sh(client, run_67, TOOLS)["stdout"].split() == ["figlet", "tabulate", "team="]
    assert sh(client, run_17, TOOLS)["stdout"].split() == ["team="]
    assert sh(client, run_67, "echo kept > notes.txt && figlet -v | head -1")["exit_code"] == 0
    first_container = container_of(service, 67)

    changed = put_template(client, "tools", {**RECIPE, "env": {"TEAM": "v2"}})
    assert changed["status"] == "building" and changed["image"] == tools_template["image"], changed
    ready = built(client, "tools")
    assert ready["status"] == "ready" and ready["image"] != tools_template["image"], ready
    after = sh(client, run_67, TOOLS + "; cat notes.txt")
    assert after["stdout"].split() == ["figlet", "tabulate", "team=v2", "kept"], after
    assert container_of(service, 67) != first_container  # recreated from the new image, files kept

    # The same recipe as before: its image exists, so nothing is fetched or built.
    again = put_template(client, "tools", RECIPE)
    assert again["status"] in ("building", "ready")
    cached = built(client, "tools")
    assert cached["status"] == "ready" and cached["image"] == tools_template["image"], cached
    assert "nothing to build" in cached["log"] and "apt" not in cached["log"], cached["log"]


def group_run(client: TestClient, user_id: int, chat_id: str) -> str:
    body = {"owner_user_id": user_id, "channel": "feishu_group", "group": {"channel": "feishu", "chat_id": chat_id}}
    session = client.post("/v1/sessions", json=body)
    assert session.status_code == 201, session.text
    run = client.post(f"/v1/sessions/{session.json()['session_id']}/runs", json={"trigger": "web"})
    assert run.status_code == 201, run.text
    return run.json()["run_id"]


def test_a_groups_template_serves_its_members_sandbox_in_its_sessions_only_files_kept(
    served: tuple[TestClient, OrchestratorService], tools_template: dict
) -> None:
    """User 23 has no template of its own; its group has one. Its one sandbox runs the group's
    template for a call in the group's session and the default for a call in a private one,
    recreated between them when idle, its files kept."""
    client, _ = served
    assert client.put("/v1/users/23", json={}).status_code == 200
    put = client.put("/v1/admin/groups/feishu/oc_docker/template", json={"template": "tools"}, headers=admin_headers())
    assert put.status_code == 200 and put.json()["template"] == "tools", put.text
    in_group, private = group_run(client, 23, "oc_docker"), web_run(client, 23)
    assert sh(client, in_group, TOOLS + "; echo kept > ~/group-notes.txt")["stdout"].split()[:2] == ["figlet", "tabulate"]
    assert client.get("/v1/users/23").json()["template"] == {"name": "tools", "source": "group"}
    assert sh(client, private, TOOLS + "; cat ~/group-notes.txt")["stdout"].split() == ["team=", "kept"]
    assert client.get("/v1/users/23").json()["template"] == {"name": "default", "source": "default"}
    assert client.put("/v1/admin/groups/feishu/oc_docker/template", json={"template": None},
                      headers=admin_headers()).status_code == 200  # fmt: skip


def test_a_broken_recipe_fails_with_its_log_and_the_previous_image_keeps_serving(
    served: tuple[TestClient, OrchestratorService], tools_template: dict
) -> None:
    client, _ = served
    client.put("/v1/users/67", json={})
    assert client.put("/v1/admin/users/67/template", json={"template": "tools"}, headers=admin_headers()).status_code == 200
    serving = built(client, "tools")
    assert serving["status"] == "ready"
    put_template(client, "tools", {**RECIPE, "apt": ["figlet", "no-such-package-zz"]})
    failed = built(client, "tools")
    assert failed["status"] == "failed" and "fetching the packages failed" in failed["error"], failed
    assert "no-such-package-zz" in failed["log"], failed["log"]
    assert failed["image"] == serving["image"], failed
    run_67 = web_run(client, 67)
    assert sh(client, run_67, TOOLS)["stdout"].split()[:2] == ["figlet", "tabulate"]


def test_a_template_in_use_is_not_deleted_until_nobody_uses_it(
    served: tuple[TestClient, OrchestratorService], tools_template: dict
) -> None:
    client, _ = served
    client.put("/v1/users/67", json={})
    assert client.put("/v1/admin/users/67/template", json={"template": "tools"}, headers=admin_headers()).status_code == 200
    refused = client.delete("/v1/admin/templates/tools", headers=admin_headers())
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "template_in_use", refused.text
    assert client.get("/v1/admin/templates/tools", headers=admin_headers()).status_code == 200
    assert client.put("/v1/admin/users/67/template", json={"template": None}, headers=admin_headers()).status_code == 200
    assert client.get("/v1/users/67").json()["template"] == {"name": "default", "source": "default"}
    assert client.delete("/v1/admin/templates/tools", headers=admin_headers()).status_code == 204
    assert client.get("/v1/admin/templates/tools", headers=admin_headers()).status_code == 404


def test_bad_input_is_refused_and_changes_nothing(served: tuple[TestClient, OrchestratorService]) -> None:
    client, _ = served
    for name, body in [("default", RECIPE), ("Bad_Name", RECIPE), ("x", {}), ("x", {"apt": ["a;b"]}),
                       ("x", {"parent": "missing", "apt": ["figlet"]}), ("x", {"dockerfile": "RUN x"})]:  # fmt: skip
        answer = client.put(f"/v1/admin/templates/{name}", json=body, headers=admin_headers())
        assert answer.status_code == 422, (name, body, answer.text)
    assert client.get("/v1/admin/templates/x", headers=admin_headers()).status_code == 404
    assert client.put("/v1/admin/users/67/template", json={"template": "missing"}, headers=admin_headers()).status_code == 404
    assert client.put("/v1/admin/templates/x", json=RECIPE).status_code in (401, 403)  # the bot token
