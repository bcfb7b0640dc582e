"""The process backend runs the host's own tools: a user whose template is ready gets a tool
error `template_unsupported` naming the template and the reason, and nothing runs; a user of
the default template is served as before."""

from __future__ import annotations

from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from orchestrator.templates.recipe import recipe_of
from tests.api_calls import tool
from tests.conftest import admin_headers
from tests.orchestrator.sandboxes.test_process_network import web_run


def test_a_template_on_the_process_backend_is_refused_with_a_clear_error(
    client: TestClient, service: OrchestratorService
) -> None:
    assert service.backend_choice.default == "process"
    recipe = recipe_of(name="tools", apt=["figlet"])
    service.templates.repo.put_recipe("tools", recipe)  # as a finished build leaves it (no engine needed)
    service.templates.repo.finish("tools", recipe, image="sandbox-orchestrator/template:0123456789abcdef",
                                  recipe_hash="0" * 64, log="", error=None)  # fmt: skip
    client.put("/v1/users/67", json={})
    assigned = client.put("/v1/admin/users/67/template", json={"template": "tools"}, headers=admin_headers())
    assert assigned.status_code == 200 and assigned.json()["template"] == {"name": "tools", "source": "user"}

    run_id = web_run(client, 67)
    answer = tool(client, run_id, "shell", command="touch /tmp/ran-anyway-67 && echo ran")
    assert answer["ok"] is False, answer
    assert answer["error"]["code"] == "template_unsupported", answer
    assert "'tools'" in answer["error"]["message"] and "process backend" in answer["error"]["message"]
    assert service.sandboxes.backends["process"].status() == [] or all(
        s.user_id != 67 for s in service.sandboxes.backends["process"].status()
    )  # no agent was started for 67

    assert client.put("/v1/admin/users/67/template", json={"template": None}, headers=admin_headers()).status_code == 200
    assert client.get("/v1/users/67").json()["template"] == {"name": "default", "source": "default"}
