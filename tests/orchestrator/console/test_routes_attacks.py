"""The admin console attacked the way its three adversaries would: a hostile user or sandbox
who controls what the pages show, a page on another port of the same host (a preview: same
site, so SameSite cookies do not stop it, and cookies ignore ports) acting in the admin's
browser, and the bot with its token. Each test performs the attack through the HTTP surface."""

from __future__ import annotations

import re
from urllib.parse import quote

from fastapi.testclient import TestClient

from orchestrator import audit
from orchestrator.console.routes import CSP
from orchestrator.console.sessions import COOKIE_NAME
from tests.conftest import ADMIN_TOKEN, API_TOKEN, admin_headers
from tests.orchestrator.console.test_routes import PAGES, csrf_of, log_in


def _session_cookie(set_cookie: str) -> str:
    found = re.match(rf"{COOKIE_NAME}=([^;]+);", set_cookie)
    assert found is not None
    return found.group(1)


def _with_cookie_header(client: TestClient, value: str) -> TestClient:
    """A client sending exactly this `Cookie` header (as a browser holding several cookies of
    one name does), none of the jar's."""
    raw = TestClient(client.app, base_url="https://testserver", headers={"Cookie": value})
    raw.cookies.clear()
    return raw


def test_a_cookie_planted_for_the_whole_host_does_not_log_the_admin_out(console) -> None:
    """A preview's script runs `document.cookie = "orch_console=junk; path=/"`: the browser
    then sends the admin's cookie (Path=/admin, longer: first) and the planted one after it.
    Taking the last value would lock the admin out for as long as the planted cookie lives, a
    fresh login included."""
    client, _ = console
    real = _session_cookie(log_in(client))
    for header in (f"{COOKIE_NAME}={real}; {COOKIE_NAME}=planted", f"{COOKIE_NAME}=planted; {COOKIE_NAME}={real}"):
        page = _with_cookie_header(client, header).get("/admin/users", follow_redirects=False)
        assert page.status_code == 200, (header, page.status_code, page.headers.get("location"))


def test_a_planted_cookie_fixes_no_session(console) -> None:
    """Session fixation: the attacker's planted value is never adopted as the login's session,
    and means nothing on its own."""
    client, _ = console
    client.cookies.set(COOKIE_NAME, "planted-by-a-preview", path="/admin")
    issued = _session_cookie(log_in(client))
    assert issued != "planted-by-a-preview"
    alone = _with_cookie_header(client, f"{COOKIE_NAME}=planted-by-a-preview")
    assert alone.get("/admin/", follow_redirects=False).headers["location"] == "/admin/login"


def test_a_cookie_planted_by_a_preview_cannot_fix_the_csrf_token(console) -> None:
    """The CSRF token lives with the session on the server, never in a cookie: a planted
    `csrf_token` cookie (or any cookie) plus the same value in the form is refused."""
    client, service = console
    log_in(client)
    client.cookies.set("csrf_token", "planted", path="/admin")
    refused = client.post("/admin/identity", data={"mode": "owner", "confirm": "yes", "csrf_token": "planted"})
    assert refused.status_code == 403 and service.switch.state().mode.value == "execution"


def test_login_guessing_is_bounded(console) -> None:
    """Guessing the admin token at the login form: after a few wrong tokens from one address
    the login answers 429 for a while, the right token included (or the guessing would go on
    and learn when it hit)."""
    client, _ = console
    answers = [client.post("/admin/login", data={"token": f"guess-{n}"}, follow_redirects=False).status_code for n in range(30)]
    assert answers[0] == 401 and answers[-1] == 429, answers
    assert answers.count(401) <= 10
    hit = client.post("/admin/login", data={"token": ADMIN_TOKEN}, follow_redirects=False)
    assert hit.status_code == 429 and "set-cookie" not in hit.headers
    assert hit.headers["content-security-policy"] == CSP and "retry-after" in hit.headers


def test_no_get_changes_anything(console) -> None:
    """Method confusion: a link (GET) to a change route changes nothing and keeps the session."""
    client, service = console
    client.put("/v1/users/42", json={"display_name": "kept"}, headers=admin_headers())
    log_in(client)
    for path in ("/admin/logout", "/admin/users/42/purge?confirm_user_id=42", "/admin/users/42/sandbox/stop",
                 "/admin/identity?mode=owner&confirm=yes"):  # fmt: skip
        client.get(path, follow_redirects=False)
    assert not service.users.purged.is_purged(42) and service.switch.state().mode.value == "execution"
    assert client.get("/admin/users", follow_redirects=False).status_code == 200


def test_logout_and_purge_need_the_csrf_token(console) -> None:
    """A preview's page posts a form at the console (same site: the cookie goes along)."""
    client, service = console
    client.put("/v1/users/42", json={"display_name": "kept"}, headers=admin_headers())
    log_in(client)
    assert client.post("/admin/logout", data={}).status_code == 403
    assert client.post("/admin/users/42/purge", data={"confirm_user_id": "42"}).status_code == 403
    assert not service.users.purged.is_purged(42)
    assert client.get("/admin/users", follow_redirects=False).status_code == 200


def test_the_bot_token_reaches_no_console_route(console) -> None:
    client, _ = console
    client.put("/v1/users/42", json={"display_name": "kept"}, headers=admin_headers())
    log_in(client)  # even beside a live admin cookie
    csrf = csrf_of(client)
    bot = {"Authorization": f"Bearer {API_TOKEN}"}
    for page in [*PAGES, "/admin", "/admin/login"]:
        assert client.get(page, headers=bot, follow_redirects=False).status_code == 403, page
    for path in ("/admin/identity", "/admin/logout", "/admin/users/42/purge", "/admin/users/42/sandbox/stop",
                 "/admin/users/42/disk", "/admin/users/42/egress", "/admin/users/42/resources"):  # fmt: skip
        assert client.post(path, headers=bot, data={"csrf_token": csrf, "confirm_user_id": "42"}).status_code == 403, path


def test_static_files_do_not_leave_their_folder(console) -> None:
    client, _ = console
    assert client.get("/admin/static/console.js").status_code == 200
    for path in ("/admin/static/../routes.py", "/admin/static/%2e%2e/routes.py", "/admin/static/..%2froutes.py",
                 "/admin/static/%2e%2e%2fsessions.py", "/admin/static//etc/passwd", "/admin/static/..%5croutes.py"):  # fmt: skip
        answer = client.get(path)
        assert answer.status_code == 404 and "COOKIE_NAME" not in answer.text and "root:" not in answer.text, path


def test_the_login_takes_no_next_url_and_every_redirect_stays_on_the_console(console) -> None:
    client, _ = console
    answer = client.post("/admin/login?next=https://evil.example/", data={"token": ADMIN_TOKEN, "next": "//evil.example/"},
                         follow_redirects=False)  # fmt: skip
    assert answer.headers["location"] == "/admin/"
    for path in ("/admin", "/admin/login?expired=//evil.example"):
        location = client.get(path, follow_redirects=False).headers.get("location", "/admin/")
        assert location.startswith("/admin/"), location


def test_refusals_and_logins_are_not_framed_or_cached(console) -> None:
    client, _ = console
    for answer in (
        client.get("/admin/login"),
        client.post("/admin/login", data={"token": "wrong"}),
        client.get("/admin/", follow_redirects=False),
        client.get("/admin/users/17", follow_redirects=False),
    ):
        assert answer.headers["x-frame-options"] == "DENY" and answer.headers["cache-control"] == "no-store"
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    assert all(word not in CSP for word in ("unsafe-inline", "unsafe-eval", "*"))
    assert "object-src" in CSP or "default-src 'none'" in CSP


MARK = "\"'><b>pwn<b>"  # no space and no '/': it fits a platform identity too


def test_nothing_a_user_or_sandbox_stored_is_rendered_as_markup(console) -> None:
    """Stored XSS: a display name, a platform identity, a session title, a tool's name and the
    text a tool call's audit row carries, then every page (lists, detail pages, the charts) is
    searched for the payload as markup."""
    client, service = console
    bot = {"Authorization": f"Bearer {API_TOKEN}"}
    person = client.put(f"/v1/identities/slack/{quote(MARK, safe='')}", json={"display_name": MARK}, headers=bot)
    assert person.status_code == 200, person.text
    uid = person.json()["user_id"]
    created = client.post("/v1/sessions", json={"owner_user_id": uid, "channel": "web", "title": MARK}, headers=bot)
    assert created.status_code == 201, created.text
    sid = created.json()["session_id"]
    started = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web"}, headers=bot)
    assert started.status_code == 201, started.text
    run = started.json()["run_id"]
    client.post(f"/v1/runs/{run}/tools/{quote(MARK, safe='')}", json={"arguments": {}}, headers=bot)
    with service.store.write() as tx:  # the text a hostile tool call gets into its audit row
        audit.record(tx, actor=MARK, action="tool.call", session_id=sid, owner_user_id=uid, run_id=run, tool=MARK,
                     outcome=MARK, acting_user_id=MARK, duration_ms=3.0, message=MARK + "</td><script>")  # fmt: skip
    log_in(client)
    pages = [*PAGES, f"/admin/users/{uid}", f"/admin/runs/{run}", f"/admin/runs?session_id={quote(MARK)}",
             f"/admin/audit?tool={quote(MARK)}", f"/admin/audit?session_id={sid}"]  # fmt: skip
    for page in pages:
        html = client.get(page).text
        assert "<b>pwn" not in html and "<script>" not in html and "'><" not in html, page
    for page in ("/admin/users", f"/admin/users/{uid}", f"/admin/runs/{run}", f"/admin/audit?session_id={sid}"):
        assert "&lt;b&gt;pwn" in client.get(page).text, page  # shown, as text


def test_a_link_cannot_put_its_own_words_in_the_consoles_notice(console) -> None:
    """Content spoofing: a preview's page links the admin (same site: the cookie goes along) to a
    console page whose status line says what the attacker wrote. The notice after a change is
    the server's own, shown once."""
    client, _ = console
    client.put("/v1/users/42", json={"display_name": "kept"}, headers=admin_headers())
    log_in(client)
    lure = "Session expired: paste the admin token at http://evil.example"
    for page in ("/admin/users", "/admin/users/42"):
        assert "evil.example" not in client.get(page, params={"notice": lure}).text, page
    done = client.post("/admin/users/42/sandbox/stop", data={"csrf_token": csrf_of(client)})
    assert done.status_code == 200 and 'class="notice" role="status">sandbox stopped<' in done.text
    assert 'class="notice"' not in client.get("/admin/users/42").text  # once
