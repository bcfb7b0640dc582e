"""The admin console in a real Chromium against a real server (uvicorn on loopback, real process
sandboxes as root, loop-image disk quotas, the egress proxy): log in, flip the runtime identity
and back (runs started through the API follow it, the audit shows both), stop a user's sandbox,
grow a disk quota, allow an egress host, purge a user; a display name that is an XSS payload
shows as text; a change without the CSRF token, the bot token and an expired session are
refused. Every page is photographed (checked non-blank); see SHOTS for where.

One server and one browser for the module; the tests run in order and build on each other's
state only where said."""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from selenium.common.exceptions import NoAlertPresentException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import ADMIN_TOKEN, API_TOKEN, REPO, TEST_ROOT
from tests.live_server import live_server
from tests.orchestrator.console.browser import require_browser, save_screenshot, start_chromium
from tests.orchestrator.egress.sandbox_client import command
from tests.orchestrator.egress.upstream import HELLO, loopback_upstream
from tests.orchestrator.quotas.conftest import require_loop
from tests.orchestrator.quotas.world import quota_settings, release_mounts, traversable_data_dir

pytestmark = pytest.mark.slow

# docs/admin-console.md shows these; refresh them with ORCH_TEST_SCREENSHOTS_DIR=docs/admin-console.
# By default they go to an ignored directory, so a test run leaves the working tree as it was.
SHOTS = Path(os.environ.get("ORCH_TEST_SCREENSHOTS_DIR") or REPO / ".pytest-tmp" / "console-screenshots")
OWNER, SPEAKER, STOPPED, PURGED, XSS = 17, 67, 71, 88, 99
XSS_NAME = "<img src=x onerror=alert(1)>"
BOT = {"Authorization": f"Bearer {API_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass
class World:
    url: str
    service: OrchestratorService
    app: object
    api: httpx.Client
    driver: object
    upstream: int

    def page(self, path: str) -> None:
        self.driver.get(self.url + path)  # type: ignore[attr-defined]

    def find(self, css: str):  # type: ignore[no-untyped-def]
        return self.driver.find_element(By.CSS_SELECTOR, css)  # type: ignore[attr-defined]

    def text(self, css: str) -> str:
        return self.find(css).text

    def submit(self, css: str, *, alert: bool = False) -> None:
        """Click a form's button and wait until the next page replaced this one (a click
        returns before the browser navigated); `alert`: accept the page's "are you sure"."""
        page = self.find("html")
        self.find(css).click()
        if alert:
            WebDriverWait(self.driver, 30).until(expected_conditions.alert_is_present()).accept()
        WebDriverWait(self.driver, 60).until(lambda _driver: gone(page))

    def shot(self, name: str) -> None:
        save_screenshot(self.driver, SHOTS / f"{name}.png")

    def web_run(self, user_id: int) -> str:
        session = self.api.post("/v1/sessions", json={"owner_user_id": user_id, "channel": "web"})
        assert session.status_code == 201, session.text
        run = self.api.post(f"/v1/sessions/{session.json()['session_id']}/runs", json={"trigger": "web"})
        assert run.status_code == 201, run.text
        return run.json()["run_id"]

    def tool(self, run_id: str, name: str, **arguments: object) -> dict:
        response = self.api.post(f"/v1/runs/{run_id}/tools/{name}", json={"arguments": arguments}, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()


def gone(element) -> bool:  # type: ignore[no-untyped-def]
    """Whether an element of an earlier page is no longer in the browser's document (chromedriver
    says so as a stale reference, or, when the page is being replaced, as an inspector error)."""
    try:
        element.is_enabled()
    except WebDriverException:  # StaleElementReferenceException is one
        return True
    return False


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    require_browser()
    require_loop()  # a disk quota is changed with loop images only
    data = traversable_data_dir(TEST_ROOT)
    settings = quota_settings(data, egress_allow_loopback=True, public_base_url="http://127.0.0.1")
    service = OrchestratorService(settings)
    app = create_app(service)
    driver = None
    try:
        with loopback_upstream() as upstream, live_server(app) as url:
            with httpx.Client(base_url=url, headers=BOT, timeout=60) as api:
                driver = start_chromium(data.parent / "chromium")
                driver.set_page_load_timeout(60)
                yield World(url, service, app, api, driver, upstream)
    finally:
        if driver is not None:
            driver.quit()
        release_mounts(data)


def log_in(world: World) -> None:
    world.page("/admin/login")
    world.find("#token").send_keys(ADMIN_TOKEN)
    world.submit("form.login button")
    assert world.driver.current_url == world.url + "/admin/"  # type: ignore[attr-defined]


def start_group_run(world: World, speaker: int) -> dict:
    body = {"owner_user_id": OWNER, "channel": "feishu_group", "group": {"channel": "feishu", "chat_id": "oc_ops"}}
    session = world.api.post("/v1/sessions", json=body)
    assert session.status_code == 201, session.text
    run = world.api.post(
        f"/v1/sessions/{session.json()['session_id']}/runs", json={"trigger": "group_message", "speaker_user_id": speaker}
    )
    assert run.status_code == 201, run.text
    return run.json()


def flip_identity(world: World, mode: str, *, shoot: bool = False) -> None:
    world.page("/admin/identity")
    world.find(f"input[name=mode][value={mode}]").click()
    world.submit("#switch")
    assert world.text("#after") == mode  # the confirmation says what the next runs get
    if shoot:
        world.shot("identity-confirm")
    world.submit("#confirm")
    assert world.text("#mode") == mode and world.text("#source") == "admin"


def test_login_and_the_identity_flip_decides_the_next_runs_and_the_audit_shows_both(world: World) -> None:
    world.page("/admin/")
    assert "/admin/login" in world.driver.current_url  # type: ignore[attr-defined]
    world.shot("login")
    log_in(world)
    # The session cookie is HttpOnly: nothing the page runs can read it (or the token).
    assert world.driver.execute_script("return document.cookie") == ""  # type: ignore[attr-defined]
    cookie = world.driver.get_cookie("orch_console")  # type: ignore[attr-defined]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/admin"
    assert ADMIN_TOKEN not in json.dumps(world.driver.execute_script("return Object.assign({}, localStorage, sessionStorage)"))  # type: ignore[attr-defined]

    assert start_group_run(world, SPEAKER)["runtime_user_id"] == SPEAKER
    flip_identity(world, "owner", shoot=True)
    owner_run = start_group_run(world, SPEAKER)
    assert owner_run["runtime_user_id"] == OWNER and owner_run["identity_mode"] == "owner"
    world.shot("identity")
    flip_identity(world, "execution")
    assert start_group_run(world, SPEAKER)["runtime_user_id"] == SPEAKER

    world.page("/admin/audit?action=runtime_identity.change")
    details = [json.loads(cell.text) for cell in world.driver.find_elements(By.CSS_SELECTOR, "#audit td.detail")]  # type: ignore[attr-defined]
    assert [(d["from"], d["to"]) for d in details] == [("owner", "execution"), ("execution", "owner")], details
    world.shot("audit")
    world.page("/admin/runs")
    runtime_users = [c.text for c in world.driver.find_elements(By.CSS_SELECTOR, "td.runtime-user")]  # type: ignore[attr-defined]
    assert runtime_users[:3] == [str(SPEAKER), str(OWNER), str(SPEAKER)]
    world.shot("runs")


def test_the_overview_shows_health_isolation_disk_egress_and_the_hours_calls(world: World) -> None:
    run_id = world.web_run(SPEAKER)
    assert world.tool(run_id, "shell", command="echo warm")["ok"]
    world.page("/admin/")
    assert world.text("#health") == "ok"
    body = world.text("main")
    assert "loop" in body and "allowlist" in body and "running" in body
    charts = world.driver.find_elements(By.CSS_SELECTOR, "svg.chart")  # type: ignore[attr-defined]
    assert [c.get_attribute("aria-label") for c in charts] == ["Tool calls per minute", "Tool call latency"]
    assert world.driver.find_elements(By.CSS_SELECTOR, "svg.chart.bars rect[height]:not([height='0.0'])")  # type: ignore[attr-defined]
    world.shot("overview")


def sandbox_since(world: World, user_id: int) -> str | None:
    return next((s.since for s in world.service.sandboxes.status() if s.user_id == user_id and s.state == "running"), None)


def test_the_browser_stops_a_users_sandbox_and_the_next_call_starts_a_new_one(world: World) -> None:
    run_id = world.web_run(STOPPED)
    assert world.tool(run_id, "shell", command="echo hi > $HOME/kept.txt")["ok"]
    first = sandbox_since(world, STOPPED)
    assert first is not None
    world.page(f"/admin/users/{STOPPED}")
    assert world.text("#sandbox-state") == "running"
    world.shot("user")
    world.submit("#sandbox-stop")
    assert world.text("#sandbox-state") == "stopped"
    assert "sandbox stopped" in world.text(".notice")
    assert sandbox_since(world, STOPPED) is None
    time.sleep(0.01)  # a new sandbox's start time differs from the first's
    answer = world.tool(run_id, "shell", command="cat $HOME/kept.txt")
    assert answer["ok"] and answer["result"]["stdout"].strip() == "hi", answer
    assert sandbox_since(world, STOPPED) not in (None, first)
    audit = world.api.get("/v1/admin/audit", params={"action": "sandbox.stop"}, headers=ADMIN).json()["entries"]
    assert [(e["actor"], e["runtime_user_id"]) for e in audit] == [("admin", STOPPED)]


def test_the_browser_grows_a_disk_quota_and_the_admin_api_shows_it(world: World) -> None:
    before = world.api.get(f"/v1/admin/users/{STOPPED}/disk", headers=ADMIN).json()["usage"]
    assert before["image_mb"] == 16
    world.page(f"/admin/users/{STOPPED}")
    world.find("#disk_mb").send_keys("24")
    world.submit("#save-disk")
    assert "disk quota 24 MiB" in world.text(".notice")
    after = world.api.get(f"/v1/admin/users/{STOPPED}/disk", headers=ADMIN).json()["usage"]
    assert after["image_mb"] == 24 and after["bytes_limit"] > before["bytes_limit"]


def through_proxy(world: World, run_id: str, target: str) -> dict:
    answer = world.tool(run_id, "shell", command=command("get", target), timeout_s=60)
    assert answer["ok"] and answer["result"]["exit_code"] == 0, answer
    return json.loads(answer["result"]["stdout"])


def test_the_browser_allows_an_egress_host_for_one_user_and_its_next_connection_goes_through(world: World) -> None:
    target = f"127.0.0.1:{world.upstream}"
    run_id = world.web_run(STOPPED)
    assert through_proxy(world, run_id, f"{target}/hello")["status"] == 403
    world.page(f"/admin/users/{STOPPED}")
    world.find("#egress-allow").send_keys(target)
    world.submit("#save-egress")
    assert "egress rules saved" in world.text(".notice") and target in world.text("#egress-effective")
    got = through_proxy(world, run_id, f"{target}/hello")
    assert got["status"] == 200 and got["body"] == HELLO.decode(), got
    other = through_proxy(world, world.web_run(SPEAKER), f"{target}/hello")
    assert other["status"] == 403  # that user only
    rules = world.api.get(f"/v1/admin/users/{STOPPED}/egress", headers=ADMIN).json()
    assert rules["allow"] == [target]


def test_the_browser_purges_a_user_whose_files_go_and_whose_id_is_refused(world: World) -> None:
    run_id = world.web_run(PURGED)
    assert world.tool(run_id, "shell", command="echo mine > $HOME/secret.txt")["ok"]
    home = world.service.layout.home_dir(PURGED)
    assert (home / "secret.txt").exists()
    world.page(f"/admin/users/{PURGED}")
    world.find("#confirm_user_id").send_keys(str(PURGED))
    world.submit("#purge", alert=True)  # the page's own "are you sure"
    assert "user 88 purged" in world.text(".notice")
    assert not home.exists() and not (world.service.layout.disk_images_dir / "user-88.img").exists()
    gone = world.api.get(f"/v1/users/{PURGED}")
    assert gone.status_code == 410 and gone.json()["error"]["code"] == "user_purged"
    late = world.api.post(f"/v1/runs/{run_id}/tools/shell", json={"arguments": {"command": "true"}})
    assert late.status_code == 409 and late.json()["error"]["code"] == "run_ended"  # its session went with it
    world.page(f"/admin/users/{PURGED}")
    assert "purged" in world.text(".error")


def test_a_display_name_that_is_an_xss_payload_shows_as_text(world: World) -> None:
    assert world.api.put(f"/v1/users/{XSS}", json={"display_name": XSS_NAME}).status_code == 200
    world.page("/admin/users")
    names = [c.text for c in world.driver.find_elements(By.CSS_SELECTOR, "#users td.name")]  # type: ignore[attr-defined]
    assert XSS_NAME in names
    assert world.driver.find_elements(By.CSS_SELECTOR, "#users img") == []  # type: ignore[attr-defined]
    world.shot("users")
    world.page(f"/admin/users/{XSS}")
    assert world.text("#display-name") == XSS_NAME
    with pytest.raises(NoAlertPresentException):
        world.driver.switch_to.alert.text  # type: ignore[attr-defined]  # no script of the name ran


def test_groups_and_a_runs_tool_calls_are_shown(world: World) -> None:
    # A group workspace's volume is named by its chat in the admin API, and on the page.
    volumes = world.api.get("/v1/admin/disk", headers=ADMIN).json()["volumes"]
    group = next(v for v in volumes if v["volume"].startswith("group-"))
    assert group["chat"] == {"channel": "feishu", "chat_id": "oc_ops"}, volumes
    world.page("/admin/groups")
    assert "feishu/oc_ops" in world.text("main") and " MiB" in world.text("main")
    world.shot("groups")
    run_id = world.web_run(SPEAKER)
    assert world.tool(run_id, "shell", command="true")["ok"]
    assert not world.tool(run_id, "read_file", path="missing.txt")["ok"]
    world.page(f"/admin/runs/{run_id}")
    rows = [r.text for r in world.driver.find_elements(By.CSS_SELECTOR, "main table tbody tr")]  # type: ignore[attr-defined]
    assert len(rows) == 2 and "shell" in rows[0] and " ok " in f" {rows[0]} " and "read_file" in rows[1], rows
    world.shot("run")


def test_a_change_without_the_csrf_token_is_refused(world: World) -> None:
    cookie = world.driver.get_cookie("orch_console")["value"]  # type: ignore[attr-defined]
    with httpx.Client(base_url=world.url, cookies={"orch_console": cookie}) as browserless:
        for form in ({"mode": "owner", "confirm": "yes"}, {"mode": "owner", "confirm": "yes", "csrf_token": "forged"}):
            refused = browserless.post("/admin/identity", data=form)
            assert refused.status_code == 403 and "CSRF" in refused.text
    assert world.service.switch.state().mode.value == "execution"


CONSOLE_ROUTES = [
    ("GET", "/admin"), ("GET", "/admin/"), ("GET", "/admin/login"), ("POST", "/admin/login"), ("POST", "/admin/logout"),
    ("GET", "/admin/identity"), ("POST", "/admin/identity"), ("GET", "/admin/users"), ("GET", f"/admin/users/{OWNER}"),
    ("POST", f"/admin/users/{OWNER}/sandbox/stop"), ("POST", f"/admin/users/{OWNER}/disk"),
    ("POST", f"/admin/users/{OWNER}/egress"), ("POST", f"/admin/users/{OWNER}/resources"),
    ("POST", f"/admin/users/{OWNER}/purge"), ("GET", "/admin/groups"), ("GET", "/admin/runs"),
    ("GET", "/admin/runs/some-run"), ("GET", "/admin/audit"),
]  # fmt: skip


def test_the_bot_token_is_refused_on_every_console_route(world: World) -> None:
    cookie = world.driver.get_cookie("orch_console")["value"]  # type: ignore[attr-defined]
    for cookies in ({}, {"orch_console": cookie}):  # even beside a live admin session
        with httpx.Client(base_url=world.url, headers=BOT, cookies=cookies) as bot:
            for method, path in CONSOLE_ROUTES:
                answer = bot.request(method, path, data={"token": API_TOKEN, "mode": "owner", "confirm": "yes"})
                assert answer.status_code in (401, 403), (method, path, answer.status_code)
    assert world.service.users.get(OWNER) is not None and world.service.switch.state().mode.value == "execution"


PLANTING_PAGE = b"""<!doctype html><title>a preview</title><script>
document.cookie = "orch_console=planted; path=/";
</script><p>planted</p>"""


@contextmanager
def another_port_of_this_host() -> Iterator[str]:
    """A page on another loopback port, as a preview is: same host and site, another origin."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(PLANTING_PAGE)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_cookie_planted_by_a_page_on_another_port_does_not_log_the_admin_out(world: World) -> None:
    """Cookies ignore ports: a preview's script sets `orch_console` for the whole host. The
    browser then sends the admin's cookie and the planted one; the console stays logged in."""
    log_in(world)
    with another_port_of_this_host() as preview:
        try:
            world.driver.get(preview + "/")  # type: ignore[attr-defined]
            world.page("/admin/users")
            sent = [c for c in world.driver.get_cookies() if c["name"] == "orch_console"]  # type: ignore[attr-defined]
            assert len(sent) == 2, sent  # the admin's (Path=/admin) and the planted one (Path=/)
            assert world.driver.current_url == world.url + "/admin/users"  # type: ignore[attr-defined]
        finally:
            world.driver.delete_cookie("orch_console")  # type: ignore[attr-defined]
            world.driver.get(preview + "/")  # type: ignore[attr-defined]
            world.driver.execute_script('document.cookie = "orch_console=; path=/; max-age=0"')  # type: ignore[attr-defined]
    log_in(world)


def test_an_expired_session_goes_back_to_the_login(world: World) -> None:
    sessions = world.app.state.console_sessions  # type: ignore[attr-defined]
    real_clock = sessions.clock
    sessions.clock = lambda: real_clock() + sessions.ttl_s + 1
    try:
        world.page("/admin/users")
        assert world.driver.current_url == world.url + "/admin/login?expired=1"  # type: ignore[attr-defined]
        assert "expired" in world.text(".error")
    finally:
        sessions.clock = real_clock
    world.page("/admin/users")  # the expired session is gone for good
    assert "/admin/login" in world.driver.current_url  # type: ignore[attr-defined]
    log_in(world)
    world.submit("form.logout button")
    assert "/admin/login" in world.driver.current_url  # type: ignore[attr-defined]
    world.page("/admin/")
    assert "/admin/login" in world.driver.current_url  # type: ignore[attr-defined]
