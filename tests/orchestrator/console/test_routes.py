"""The admin console's HTTP contract without a browser: the login cookie's attributes, the
security headers of every page, refusals (bot token, other bearer tokens, CSRF, a token from
another session, a purge without its confirmation), escaping of what users control, and that a
console change writes the same audit row as the admin API's."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from orchestrator import audit
from orchestrator.console.routes import CSP
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.templates.recipe import recipe_of
from tests.conftest import ADMIN_TOKEN, API_TOKEN, admin_headers, make_settings

XSS = "<img src=x onerror=alert(1)>"
PAGES = ["/admin/", "/admin/identity", "/admin/users", "/admin/users/17", "/admin/groups", "/admin/runs", "/admin/audit"]


def log_in(client: TestClient) -> str:
    response = client.post("/admin/login", data={"token": ADMIN_TOKEN}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/admin/", response.text
    return response.headers["set-cookie"]


def csrf_of(client: TestClient, path: str = "/admin/identity") -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert found is not None
    return found.group(1)


def test_the_login_cookie_is_httponly_strict_secure_over_https_and_never_the_token(console) -> None:
    client, service = console
    cookie = log_in(client)
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" in cookie and "Path=/admin" in cookie
    assert ADMIN_TOKEN not in cookie
    for page in PAGES:
        client.put("/v1/users/17", json={"display_name": "x"}, headers=admin_headers())
        response = client.get(page)
        assert response.status_code == 200, (page, response.text)
        assert response.headers["content-security-policy"] == CSP and "script-src 'self'" in CSP
        assert response.headers["x-frame-options"] == "DENY" and response.headers["cache-control"] == "no-store"
        assert "<script>" not in response.text and ADMIN_TOKEN not in response.text
    assert [e.action for e in audit.entries(service.store, action="console.login")] == ["console.login"]


def test_plain_http_gets_no_secure_flag(data_dir) -> None:
    service = OrchestratorService(make_settings(data_dir))
    try:
        with TestClient(create_app(service)) as client:
            assert "Secure" not in log_in(client)
    finally:
        service.close()


def test_the_bot_token_and_wrong_tokens_do_not_log_in(console) -> None:
    client, _ = console
    bot = client.post("/admin/login", data={"token": API_TOKEN}, follow_redirects=False)
    assert bot.status_code == 403 and "set-cookie" not in bot.headers
    wrong = client.post("/admin/login", data={"token": "guess"}, follow_redirects=False)
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    assert client.get("/admin/", follow_redirects=False).headers["location"] == "/admin/login"
    # A bearer token is no console login, the admin's neither; the bot's is refused outright.
    assert client.get("/admin/", headers=admin_headers()).status_code == 401
    assert client.get("/admin/login", headers={"Authorization": f"Bearer {API_TOKEN}"}).status_code == 403


def test_changes_need_their_sessions_csrf_token(console) -> None:
    client, service = console
    log_in(client)
    other = TestClient(client.app, base_url="https://testserver")
    log_in(other)
    foreign = csrf_of(other)
    for form in ({}, {"csrf_token": ""}, {"csrf_token": foreign}):
        refused = client.post("/admin/identity", data={"mode": "owner", "confirm": "yes", **form})
        assert refused.status_code == 403 and "CSRF" in refused.text
    assert service.switch.state().mode.value == "execution"
    token = csrf_of(client)
    asked = client.post("/admin/identity", data={"mode": "owner", "csrf_token": token})
    assert asked.status_code == 200 and 'id="after">owner<' in asked.text  # first the confirmation
    assert service.switch.state().mode.value == "execution"
    done = client.post("/admin/identity", data={"mode": "owner", "confirm": "yes", "csrf_token": token}, follow_redirects=False)
    assert done.status_code == 303 and service.switch.state().mode.value == "owner"


def test_a_console_change_writes_the_same_audit_row_as_the_api(console) -> None:
    client, service = console
    log_in(client)
    client.post("/admin/identity", data={"mode": "owner", "confirm": "yes", "csrf_token": csrf_of(client)})
    assert client.put("/v1/admin/runtime-identity", json={"mode": "execution"}, headers=admin_headers()).status_code == 200
    by_api, by_console = audit.entries(service.store, action="runtime_identity.change", limit=2)
    assert by_console.actor == by_api.actor == "admin"
    assert set(by_console.detail) == set(by_api.detail) and by_console.detail["to"] == "owner"


def test_what_users_control_is_escaped(console) -> None:
    client, _ = console
    assert client.put("/v1/users/17", json={"display_name": XSS}, headers=admin_headers()).status_code == 200
    log_in(client)
    for page in ("/admin/users", "/admin/users/17", f"/admin/audit?action={XSS}"):
        html = client.get(page).text
        assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html, page


def test_logout_ends_the_session_and_a_purge_needs_its_confirmation(console) -> None:
    client, service = console
    client.put("/v1/users/42", json={"display_name": "kept"}, headers=admin_headers())
    log_in(client)
    token = csrf_of(client, "/admin/users/42")
    refused = client.post("/admin/users/42/purge", data={"csrf_token": token, "confirm_user_id": "43"})
    assert refused.status_code == 422 and not service.users.purged.is_purged(42)
    assert client.post("/admin/logout", data={"csrf_token": token}, follow_redirects=False).status_code == 303
    assert client.get("/admin/users", follow_redirects=False).headers["location"] == "/admin/login"
    after = client.post("/admin/users/42/purge", data={"csrf_token": token, "confirm_user_id": "42"}, follow_redirects=False)
    assert after.status_code == 303 and after.headers["location"] == "/admin/login"
    assert not service.users.purged.is_purged(42)


def test_the_user_page_shows_the_effective_template_and_why_and_sets_it(console) -> None:
    client, service = console
    recipe = recipe_of(name="tools", apt=["figlet"])
    service.templates.repo.put_recipe("tools", recipe)  # as a finished build leaves it (no engine needed)
    service.templates.repo.finish("tools", recipe, image="sandbox-orchestrator/template:tools", recipe_hash="0" * 64,
                                  log="", error=None)  # fmt: skip
    client.put("/v1/users/42", json={"display_name": "kept"}, headers=admin_headers())
    log_in(client)
    page = client.get("/admin/users/42").text
    assert re.search(r'id="template-effective">default<', page) and "no template set" in page
    token = csrf_of(client, "/admin/users/42")

    forged = client.post("/admin/users/42/template", data={"template": "tools"})
    assert forged.status_code == 403 and service.templates.repo.assigned("user", "42") is None
    unknown = client.post("/admin/users/42/template", data={"csrf_token": token, "template": "nope"})
    assert unknown.status_code == 404 and service.templates.repo.assigned("user", "42") is None

    saved = client.post("/admin/users/42/template", data={"csrf_token": token, "template": "tools"}, follow_redirects=False)
    assert saved.status_code == 303, saved.text
    page = client.get(saved.headers["location"]).text
    assert re.search(r'id="template-effective">tools<', page) and "set for this user" in page
    assert '<option value="tools" selected>' in page
    assert client.get("/v1/users/42", headers=admin_headers()).json()["template"] == {"name": "tools", "source": "user"}

    cleared = client.post("/admin/users/42/template", data={"csrf_token": token, "template": ""}, follow_redirects=False)
    assert cleared.status_code == 303 and service.templates.repo.assigned("user", "42") is None
