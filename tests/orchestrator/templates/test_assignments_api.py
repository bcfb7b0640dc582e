"""Who gets which template, through the API, on the process backend: a template there is
refused with `template_unsupported` naming it, so a refused call proves which template the
user's sandbox was given for that call (no image needs to run). A group's template reaches its
members' sandboxes in the group's sessions only; a user's own template comes first; a skill's
declared template and a bot's requested one apply to the run's calls, and what a run's skills
lack is said in its context and prompt; a purge drops the user's assignment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from orchestrator.templates.recipe import recipe_of
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures
from tests.api_calls import tool
from tests.conftest import admin_headers, make_settings

GROUP = {"channel": "feishu", "chat_id": "oc_team"}
ABSENT_PARENT = "sandbox-orchestrator/absent-parent:none"  # a re-PUT's build fails at once; the image stays


@pytest.fixture
def service(agent_data_dir: Path) -> Iterator[OrchestratorService]:
    svc = OrchestratorService(make_settings(agent_data_dir, sandbox_image=ABSENT_PARENT))
    yield svc
    svc.close()


def ready_template(service: OrchestratorService, name: str) -> None:
    """As a finished build leaves it (no engine needed: the process backend never runs it)."""
    recipe = recipe_of(name=name, apt=["figlet"])
    service.templates.repo.put_recipe(name, recipe)
    service.templates.repo.finish(name, recipe, image=f"sandbox-orchestrator/template:{name}", recipe_hash="0" * 64,
                                  log="", error=None)  # fmt: skip
    service.templates._changed()


def session(client: TestClient, owner: int, *, group: bool) -> str:
    body: dict = {"owner_user_id": owner, "channel": "feishu_group", "group": GROUP} if group else {
        "owner_user_id": owner, "channel": "web"}  # fmt: skip
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def run(client: TestClient, sid: str, **body: object) -> dict:
    response = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web", **body})
    assert response.status_code == 201, response.text
    return response.json()


def template_refused(client: TestClient, run_id: str) -> str | None:
    """The template a shell call was refused for, or None when it ran."""
    answer = tool(client, run_id, "shell", command="echo ran")
    if answer["ok"]:
        return None
    assert answer["error"]["code"] == "template_unsupported", answer
    return answer["error"]["template"]


def effective(client: TestClient, user_id: int) -> dict:
    return client.get(f"/v1/users/{user_id}").json()["template"]


def test_a_groups_template_reaches_its_members_sandboxes_in_its_sessions_only(
    client: TestClient, service: OrchestratorService
) -> None:
    ready_template(service, "team")
    ready_template(service, "own")
    put = client.put("/v1/admin/groups/feishu/oc_team/template", json={"template": "team"}, headers=admin_headers())
    assert put.status_code == 200, put.text
    assert put.json() == {"channel": "feishu", "chat_id": "oc_team", "template": "team"}
    assert client.get("/v1/admin/groups/feishu/oc_team/template", headers=admin_headers()).json()["template"] == "team"

    group_run = run(client, session(client, 67, group=True))
    assert group_run["template"] == {"name": "team", "source": "group", "lacking": []}
    assert template_refused(client, group_run["run_id"]) == "team"
    assert effective(client, 67) == {"name": "team", "source": "group"}
    # The same member in a private session: its sandbox runs its own (the default) template.
    private_run = run(client, session(client, 67, group=False))
    assert template_refused(client, private_run["run_id"]) is None
    assert effective(client, 67) == {"name": "default", "source": "default"}

    # A member's own template comes first, in the group's sessions too.
    assert client.put("/v1/admin/users/17/template", json={"template": "own"}, headers=admin_headers()).status_code == 200
    member_run = run(client, session(client, 17, group=True))
    assert template_refused(client, member_run["run_id"]) == "own"
    assert effective(client, 17) == {"name": "own", "source": "user"}

    # Back to the default: the group's sessions run the default again.
    cleared = client.put("/v1/admin/groups/feishu/oc_team/template", json={"template": None}, headers=admin_headers())
    assert cleared.json()["template"] == "default"
    assert template_refused(client, group_run["run_id"]) is None


def test_a_group_template_is_set_by_an_admin_only_and_only_to_a_template_that_exists(client: TestClient) -> None:
    body = {"template": "team"}
    assert client.put("/v1/admin/groups/feishu/oc_team/template", json=body).status_code == 403
    missing = client.put("/v1/admin/groups/feishu/oc_team/template", json=body, headers=admin_headers())
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "template"
    bad = client.put("/v1/admin/groups/fei%20shu/oc_team/template", json=body, headers=admin_headers())
    assert bad.status_code == 422
    assert client.get("/v1/admin/groups/feishu/oc_team/template", headers=admin_headers()).json()["template"] == "default"


def test_a_bot_may_ask_only_for_a_requestable_template(client: TestClient, service: OrchestratorService) -> None:
    ready_template(service, "tools")
    sid = session(client, 67, group=False)
    refused = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web", "template": "tools"})
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "template_not_requestable"
    assert refused.json()["error"]["field"] == "template"
    unknown = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web", "template": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["field"] == "template"
    assert service.run_repo.running_in_session(sid) == [], "a refused start left a run behind"

    # The admin marks it requestable (with its recipe; the rebuild fails here, the image stays).
    marked = client.put("/v1/admin/templates/tools", json={"apt": ["figlet"], "requestable": True}, headers=admin_headers())
    assert marked.status_code == 202 and marked.json()["requestable"] is True, marked.text
    service.templates.wait("tools", timeout=60)
    assert client.get("/v1/admin/templates/tools", headers=admin_headers()).json()["requestable"] is True
    asked = run(client, sid, template="tools")
    assert asked["template"] == {"name": "tools", "source": "run", "lacking": []}
    assert template_refused(client, asked["run_id"]) == "tools"
    assert effective(client, 67) == {"name": "tools", "source": "run"}
    # The run's wish is the run's: another run of the user gets the default.
    plain = run(client, sid)
    assert template_refused(client, plain["run_id"]) is None
    assert run(client, sid, template="default")["template"]["name"] == "default"


SKILL_DOC = "---\nname: {name}\ndescription: needs its tools\ntemplate: {template}\n---\n# {name}\n"


def install_skill(client: TestClient, name: str, template: str) -> None:
    files = {"SKILL.md": SKILL_DOC.format(name=name, template=template)}
    response = client.put(f"/v1/admin/skills/{name}", json={"files": files}, headers=admin_headers())
    assert response.status_code in (200, 201), response.text


def test_a_skills_template_applies_to_the_run_and_what_it_lacks_is_said(
    client: TestClient, service: OrchestratorService
) -> None:
    install_skill(client, "charts", "missing")
    sid = session(client, 67, group=False)
    lacking = run(client, sid)
    assert lacking["template"] == {
        "name": "default", "source": "default",
        "lacking": [{"skill": "charts", "template": "missing", "why": "not built (yet)"}],
    }  # fmt: skip
    prompt = lacking["prompt_identity_section"]
    assert "## Sandbox template" in prompt and "'charts' needs the template 'missing'" in prompt
    assert template_refused(client, lacking["run_id"]) is None

    ready_template(service, "missing")
    needed = run(client, sid)
    assert needed["template"] == {"name": "missing", "source": "skill", "lacking": []}
    assert needed["prompt_identity_section"] is None  # nothing lacking: the prompt is unchanged
    assert template_refused(client, needed["run_id"]) == "missing"

    ready_template(service, "other")
    service.templates.set_requestable("other", True)
    overruled = run(client, sid, template="other")
    assert overruled["template"]["lacking"] == [
        {"skill": "charts", "template": "missing", "why": "this sandbox runs template 'other' (chosen by: run)"}
    ]
    assert "'charts' needs the template 'missing'" in overruled["prompt_identity_section"]


def test_a_purge_drops_the_users_template_assignment(client: TestClient, service: OrchestratorService) -> None:
    ready_template(service, "tools")
    client.put("/v1/users/67", json={})
    assert client.put("/v1/admin/users/67/template", json={"template": "tools"}, headers=admin_headers()).status_code == 200
    refused = client.request("DELETE", "/v1/admin/templates/tools", headers=admin_headers())
    assert refused.status_code == 409 and "user:67" in refused.json()["error"]["used_by"]

    purged = client.request("DELETE", "/v1/admin/users/67", json={"confirm_user_id": 67}, headers=admin_headers())
    assert purged.status_code == 200, purged.text
    assert service.templates.repo.assigned("user", "67") is None
    assert client.request("DELETE", "/v1/admin/templates/tools", headers=admin_headers()).status_code == 204
