"""Preview URLs end to end with real sandboxes of the process backend (as root, each in bwrap
with a network namespace of its own holding only `lo`): servers started in a sandbox with its
own python3 are reached through the preview listener, which relays through the sandbox's
agent. Only 127.0.0.1 is contacted."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from orchestrator import audit
from orchestrator.descriptors.budget import Feature
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.api_calls import tool
from tests.conftest import API_TOKEN, TEST_ROOT, make_settings
from tests.live_server import free_port
from tests.metrics_text import sample_value, scrape
from tests.uid_block import block
from tests.orchestrator.previews.apps import (
    COOKIE_APP,
    ECHO_HEADERS_APP,
    SILENT_APP,
    SMUGGLING_COOKIE_APP,
    STREAMING_APP,
    WEBSOCKET_ECHO_APP,
    open_websocket,
    websocket_echo,
)
from tests.orchestrator.sandboxes.test_process_network import web_run

AS_ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(not AS_ROOT, reason="a sandbox network of its own needs a root orchestrator")

Served = tuple[TestClient, OrchestratorService]
FIVE_MB = 5 * 1024 * 1024


@contextmanager
def served(**overrides: object) -> Iterator[Served]:
    base = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="previews-"))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    settings = {"process_sandbox": "bwrap", "preview_listen": "127.0.0.1:0", **overrides}
    service = OrchestratorService(make_settings(data, **settings))
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            yield client, service
    finally:
        service.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    with served() as pair:
        yield pair


def shell(client: TestClient, run_id: str, command: str) -> str:
    answer = tool(client, run_id, "shell", command=command, timeout_s=60)
    assert answer["ok"] and answer["result"]["exit_code"] == 0, answer
    return answer["result"]["stdout"]


def start(client: TestClient, run_id: str, command: str) -> None:
    answer = tool(client, run_id, "process_start", command=command)
    assert answer["ok"], answer


def write_app(client: TestClient, run_id: str, name: str, source: str) -> None:
    answer = tool(client, run_id, "write_file", path=name, content=source)
    assert answer["ok"], answer


def expose(client: TestClient, run_id: str, port: int, **extra: object) -> dict:
    response = client.post(f"/v1/runs/{run_id}/previews", json={"port": port, **extra})
    assert response.status_code == 201, response.text
    return response.json()


def wait_served(url: str, timeout_s: float = 20) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(url, timeout=10)
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


def test_a_sandbox_http_server_serves_its_listing_and_a_5mb_file_byte_identical(server: Served) -> None:
    client, service = server
    run_id = web_run(client, 67)
    shell(client, run_id, f"mkdir -p site && head -c {FIVE_MB} /dev/urandom > site/big.bin && echo hi > site/hello.txt")
    digest = shell(client, run_id, "sha256sum site/big.bin").split()[0]
    start(client, run_id, "cd site && exec python3 -m http.server 8000 --bind 127.0.0.1")
    preview = expose(client, run_id, 8000)
    assert set(preview) == {"preview_id", "url", "port", "expires_at"} and preview["port"] == 8000
    assert preview["url"].startswith(service.previews.base_url + "/")  # type: ignore[union-attr]
    assert not preview["url"].startswith("http://testserver")  # never the API's origin

    listing = wait_served(preview["url"])
    assert listing.status_code == 200, listing.text
    assert "big.bin" in listing.text and "hello.txt" in listing.text
    with httpx.stream("GET", preview["url"] + "big.bin", timeout=30) as response:
        assert response.status_code == 200
        got = hashlib.sha256()
        size = 0
        for chunk in response.iter_bytes():
            got.update(chunk)
            size += len(chunk)
    assert size == FIVE_MB and got.hexdigest() == digest

    assert client.get(f"/v1/previews/{preview['preview_id']}").json() == preview
    # The model's way: the expose_port tool answers the same shape, for the run's runtime user.
    assert "expose_port" in [t["name"] for t in client.get("/v1/tools").json()["tools"]]
    answer = tool(client, run_id, "expose_port", port=8000, ttl_s=600)
    assert answer["ok"] and set(answer["result"]) == {"preview_id", "url", "port", "expires_at"}, answer
    assert httpx.get(answer["result"]["url"] + "hello.txt", timeout=10).text == "hi\n"
    service.previews.flush_audit()  # type: ignore[union-attr]
    rows = [r for r in audit.entries(service.store, action="preview_connection", limit=100)
            if r.detail["preview_id"] == preview["preview_id"]]  # fmt: skip
    assert any(r.detail["bytes_down"] >= FIVE_MB and r.runtime_user_id == 67 and r.detail["port"] == 8000 for r in rows)
    assert sample_value(scrape(client), "orchestrator_preview_connections_total", outcome="relayed") >= 2


def test_the_app_sees_no_api_authorization_or_cookie_and_its_own_host(server: Served) -> None:
    client, _ = server
    run_id = web_run(client, 67)
    write_app(client, run_id, "echo_headers.py", ECHO_HEADERS_APP)
    start(client, run_id, "exec python3 echo_headers.py 8101")
    preview = expose(client, run_id, 8101)
    response = wait_served(
        preview["url"] + "show?x=1",
    )
    assert response.status_code == 200, response.text
    headers = httpx.get(
        preview["url"] + "show?x=1",
        headers={"Authorization": f"Bearer {API_TOKEN}", "Cookie": "session=api-secret", "X-Forwarded-For": "1.2.3.4"},
        timeout=10,
    ).json()
    seen = {name.lower(): value for name, value in headers["headers"]}
    assert headers["path"] == "/show?x=1"
    assert "authorization" not in seen and "cookie" not in seen
    assert API_TOKEN not in repr(headers) and "api-secret" not in repr(headers)
    assert seen["host"] == "localhost:8101"
    assert seen["x-forwarded-for"] == "127.0.0.1"  # ours, not what the visitor claimed
    assert seen["x-forwarded-prefix"] == "/" + preview["url"].rstrip("/").rsplit("/", 1)[1]


def test_a_previews_cookies_reach_only_its_own_app_never_another_preview_or_the_api(server: Served) -> None:
    """Path mode: every preview shares the listener's origin, and cookies ignore ports. A hostile
    app asks for cookies on the whole host; a browser's cookie jar (RFC 6265 path and domain
    matching, as http.cookiejar does it) then carries none of them to another preview, nor to
    the API's origin, and the app gets its own back."""
    client, service = server
    run_a, run_b = web_run(client, 67), web_run(client, 17)
    for user, run_id in ((67, run_a), (17, run_b)):
        write_app(client, run_id, "cookies.py", COOKIE_APP)
        start(client, run_id, f"exec python3 cookies.py 8110 {user}")
    of_a, of_b = expose(client, run_a, 8110), expose(client, run_b, 8110)
    token_a = of_a["url"].rstrip("/").rsplit("/", 1)[1]
    assert wait_served(of_a["url"]).status_code == 200 and wait_served(of_b["url"]).status_code == 200
    api_port = free_port()
    with httpx.Client(timeout=10) as browser:
        assert browser.get(of_a["url"] + "set").json()["user"] == "67"
        assert len(browser.cookies.jar) == 3
        for cookie in browser.cookies.jar:  # none wider than A's own prefix, none for another domain
            assert cookie.path.startswith(f"/{token_a}/") and not cookie.domain_specified, cookie
        at_b = browser.get(of_b["url"] + "show")
        assert "user67" not in at_b.request.headers.get("cookie", "") and at_b.json() == {"cookie": "", "user": "17"}
        for api_url in (f"http://127.0.0.1:{api_port}/v1/runs", f"http://127.0.0.1:{api_port}/", "http://127.0.0.1/healthz"):
            assert "cookie" not in browser.build_request("GET", api_url).headers, api_url
        # A's app gets its own cookies back, as it named them, and nothing else of the jar's.
        browser.cookies.set("session", "api-secret", domain="127.0.0.1", path="/")
        seen = browser.get(of_a["url"] + "show").json()["cookie"]
        assert sorted(seen.split("; ")) == ["sid=user67", "wide=user67"] and "api-secret" not in seen
        assert browser.get(of_a["url"] + "app/show").json()["cookie"].count("deep=user67") == 1
        # A's page's script (or any page on the host) sets a cookie under the relay's naming for the
        # whole host, hoping to plant it in B's app (a session fixed for B): B's app never gets it.
        for name, _ in [c.split("=", 1) for c in seen.split("; ")]:
            planted = [c.name for c in browser.cookies.jar if c.name.endswith("_" + name) and c.name != name]
            for jar_name in planted:
                browser.cookies.set(jar_name, "planted", domain="127.0.0.1", path="/")
        browser.cookies.set("pv_sid", "planted", domain="127.0.0.1", path="/")
        assert browser.get(of_b["url"] + "show").json() == {"cookie": "", "user": "17"}


def test_an_answer_head_that_hides_a_cookie_from_a_crlf_reader_is_refused(server: Served) -> None:
    """A browser may split an answer's head at a bare LF and join a folded line; the relay reads
    it at CRLF only. An app hiding a `Set-Cookie` that way would slip it past the scoping: the
    relay answers 502 instead of passing such a head."""
    client, _ = server
    run_id = web_run(client, 67)
    write_app(client, run_id, "smuggle.py", SMUGGLING_COOKIE_APP)
    start(client, run_id, "exec python3 smuggle.py 8116")
    preview = expose(client, run_id, 8116)
    assert wait_served(preview["url"]).status_code == 204
    host, port = preview["url"].split("/")[2].split(":")
    path = "/" + preview["url"].split("/", 3)[3]
    for trick in ("lf", "fold"):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(f"GET {path}{trick} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            received = b""
            while piece := sock.recv(65536):
                received += piece
        assert received.startswith(b"HTTP/1.1 502"), received
        assert b"Path=/\r" not in received and b"Path=/\n" not in received


def test_a_guessed_a_revoked_and_an_expired_token_are_404(server: Served) -> None:
    client, service = server
    run_id = web_run(client, 67)
    start(client, run_id, "exec python3 -m http.server 8102 --bind 127.0.0.1")
    kept, revoked, short = expose(client, run_id, 8102), expose(client, run_id, 8102), expose(client, run_id, 8102, ttl_s=1)
    assert wait_served(kept["url"]).status_code == 200
    assert httpx.get(revoked["url"], timeout=10).status_code == 200
    base = service.previews.base_url  # type: ignore[union-attr]
    assert httpx.get(f"{base}/{'a' * 32}/", timeout=10).status_code == 404  # a token of the right form
    assert httpx.get(f"{base}/", timeout=10).status_code == 404

    assert client.delete(f"/v1/previews/{revoked['preview_id']}").status_code == 204
    assert httpx.get(revoked["url"], timeout=10).status_code == 404
    assert client.get(f"/v1/previews/{revoked['preview_id']}").status_code == 404
    time.sleep(1.2)
    assert httpx.get(short["url"], timeout=10).status_code == 404
    assert httpx.get(kept["url"], timeout=10).status_code == 200
    listed = client.get(f"/v1/runs/{run_id}/previews").json()
    assert listed == {"run_id": run_id, "previews": [kept]}  # neither the revoked nor the expired one
    too_long = client.post(f"/v1/runs/{run_id}/previews", json={"port": 8102, "ttl_s": 10**9})
    assert too_long.status_code == 422 and too_long.json()["error"]["field"] == "ttl_s"


def test_another_users_token_never_reaches_this_sandbox(server: Served) -> None:
    client, _ = server
    run_17, run_67 = web_run(client, 17), web_run(client, 67)
    for user, run_id in ((17, run_17), (67, run_67)):  # both on the same port, each in its own sandbox
        write_app(client, run_id, "echo_headers.py", ECHO_HEADERS_APP)
        start(client, run_id, f"exec python3 echo_headers.py 8103 {user} >> seen.log 2>&1")
    of_17, of_67 = expose(client, run_17, 8103), expose(client, run_67, 8103)
    token_17 = of_17["url"].rstrip("/").rsplit("/", 1)[1]
    assert wait_served(of_17["url"] + "who").json()["user"] == "17"
    assert wait_served(of_67["url"] + "who").json()["user"] == "67"
    # 67's page asking for a root-relative URL with 17's token in its path still reaches 17 only.
    assert httpx.get(of_17["url"] + "x", headers={"Referer": of_67["url"]}, timeout=10).json()["user"] == "17"
    log_67 = shell(client, run_67, "cat seen.log")
    assert token_17 not in log_67 and "/who" in log_67


def test_a_port_with_nothing_listening_answers_503_quickly_with_retry_after(server: Served) -> None:
    client, _ = server
    run_id = web_run(client, 67)
    shell(client, run_id, "true")  # the sandbox is up
    preview = expose(client, run_id, 8199)
    started = time.monotonic()
    response = httpx.get(preview["url"], timeout=10)
    assert response.status_code == 503 and response.headers["retry-after"].isdigit()
    assert time.monotonic() - started < 2.0


def test_a_stopped_sandbox_is_started_by_a_visitor(server: Served) -> None:
    client, service = server
    run_id = web_run(client, 31)
    preview = expose(client, run_id, 8198)
    for backend in service.sandboxes.backends.values():
        backend.stop(31)
    response = httpx.get(preview["url"], timeout=30)  # nothing listens after the start: 503
    assert response.status_code == 503 and "Retry-After" in response.headers
    assert any(s.user_id == 31 and s.state == "running" for s in service.sandboxes.status())


def test_a_streamed_answer_arrives_progressively(server: Served) -> None:
    client, _ = server
    run_id = web_run(client, 67)
    write_app(client, run_id, "streaming.py", STREAMING_APP)
    start(client, run_id, "exec python3 streaming.py 8104")
    preview = expose(client, run_id, 8104)
    assert wait_served(preview["url"] + "ready").status_code == 200
    with httpx.stream("GET", preview["url"] + "stream", timeout=30) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        pieces = response.iter_raw()
        first = next(pieces)
        assert first.startswith(b"first")
        shell(client, run_id, "touch go")  # only now does the app send the rest
        rest = b"".join(pieces)
    assert rest.endswith(b"last\n")


def test_a_websocket_echoes_through_the_preview(server: Served) -> None:
    client, _ = server
    run_id = web_run(client, 67)
    write_app(client, run_id, "ws_echo.py", WEBSOCKET_ECHO_APP)
    start(client, run_id, "exec python3 ws_echo.py 8105")
    preview = expose(client, run_id, 8105)
    assert wait_served(preview["url"]).status_code == 426  # the echo server wants an upgrade
    assert websocket_echo(preview["url"] + "ws", [b"hello", b"x" * 70_000]) == [b"hello", b"x" * 70_000]


def test_a_silent_app_and_500_connections_leave_another_users_preview_and_healthz_responsive(server: Served) -> None:
    client, service = server
    run_67, run_17 = web_run(client, 67), web_run(client, 17)
    write_app(client, run_67, "silent.py", SILENT_APP)
    start(client, run_67, "exec python3 silent.py 8106")
    start(client, run_17, "exec python3 -m http.server 8107 --bind 127.0.0.1")
    silent, other = expose(client, run_67, 8106), expose(client, run_17, 8107)
    assert wait_served(other["url"]).status_code == 200
    host, port = service.previews.address.split(":")  # type: ignore[union-attr]
    path = "/" + silent["url"].split("/", 3)[3]
    flood = []
    try:
        for _ in range(500):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            flood.append(sock)
        time.sleep(0.5)
        for _ in range(5):
            started = time.monotonic()
            assert httpx.get(other["url"], timeout=10).status_code == 200
            assert client.get("/healthz").status_code == 200
            assert time.monotonic() - started < 1.0
        # 67's share of connections is bounded: the rest were refused at once with a 429.
        refused = 0
        for sock in flood:
            sock.settimeout(0.01)
            try:
                refused += sock.recv(64).startswith(b"HTTP/1.1 429")
            except (TimeoutError, OSError):
                pass
        assert refused > 300
    finally:
        for sock in flood:
            sock.close()
    # Visitors that hung up free 67's share at once, though its app never answered them.
    deadline = time.monotonic() + 5
    while service.descriptors.in_use(Feature.PREVIEWS, 67):
        assert time.monotonic() < deadline, service.descriptors.in_use(Feature.PREVIEWS, 67)
        time.sleep(0.05)


def test_a_paused_sandbox_is_resumed_by_a_visitor(server: Served) -> None:
    client, service = server
    run_id = web_run(client, 29)
    shell(client, run_id, "true")
    preview = expose(client, run_id, 8197)
    backend = service.sandboxes.backends["process"]
    backend.reap_idle(now=time.monotonic() + service.settings.pause_after_s + 1)
    assert any(s.user_id == 29 and s.state == "paused" for s in service.sandboxes.status())
    started = time.monotonic()
    response = httpx.get(preview["url"], timeout=30)
    assert response.status_code == 503 and "Retry-After" in response.headers  # thawed; nothing listens yet
    assert time.monotonic() - started < 5.0
    assert any(s.user_id == 29 and s.state == "running" for s in service.sandboxes.status())


def test_revoking_a_preview_cuts_its_open_websocket(server: Served) -> None:
    client, _ = server
    run_id = web_run(client, 67)
    write_app(client, run_id, "ws_echo.py", WEBSOCKET_ECHO_APP)
    start(client, run_id, "exec python3 ws_echo.py 8108")
    preview = expose(client, run_id, 8108)
    assert wait_served(preview["url"]).status_code == 426
    with open_websocket(preview["url"] + "ws") as sock:
        assert client.delete(f"/v1/previews/{preview['preview_id']}").status_code == 204
        sock.settimeout(5)
        assert sock.recv(1) == b""  # closed by the relay, not left open


def test_host_mode_serves_a_preview_at_its_own_host_and_nothing_by_path() -> None:
    port = free_port()
    with served(preview_listen=f"127.0.0.1:{port}", preview_base_url=f"http://{{token}}.preview.test:{port}", **block(1)) as pair:
        client, _ = pair
        run_id = web_run(client, 67)
        write_app(client, run_id, "echo_headers.py", ECHO_HEADERS_APP)
        start(client, run_id, "exec python3 echo_headers.py 8109")
        preview = expose(client, run_id, 8109)
        host = preview["url"].split("://", 1)[1].rstrip("/")
        token = host.split(".", 1)[0]
        assert preview["url"] == f"http://{token}.preview.test:{port}/"
        local = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while (answer := httpx.get(f"{local}/page?q=1", headers={"Host": host}, timeout=10)).status_code == 503:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert answer.status_code == 200 and answer.json()["path"] == "/page?q=1"
        assert httpx.get(f"{local}/{token}/page", timeout=10).status_code == 404  # the path form is not served
        assert httpx.get(f"{local}/page", headers={"Host": f"{'a' * 32}.preview.test:{port}"}, timeout=10).status_code == 404


def test_every_preview_of_a_deleted_user_ends_and_its_open_connections_are_cut(server: Served) -> None:
    """What the user purge calls (`PreviewService.revoke_all_of_user`): that user's links are
    404 at once and an open WebSocket of theirs is closed; another user's preview is untouched."""
    client, service = server
    previews = service.previews
    assert previews is not None
    run_43, run_17 = web_run(client, 43), web_run(client, 17)
    write_app(client, run_43, "ws_echo.py", WEBSOCKET_ECHO_APP)
    start(client, run_43, "exec python3 ws_echo.py 8111")
    start(client, run_17, "exec python3 -m http.server 8112 --bind 127.0.0.1")
    socket_43, plain_43, of_17 = expose(client, run_43, 8111), expose(client, run_43, 8111, ttl_s=60), expose(client, run_17, 8112)
    assert wait_served(socket_43["url"]).status_code == 426 and wait_served(of_17["url"]).status_code == 200
    with open_websocket(socket_43["url"] + "ws") as sock:
        assert previews.revoke_all_of_user(43, actor="admin:purge") == 2
        sock.settimeout(5)
        assert sock.recv(1) == b""
    for gone in (socket_43, plain_43):
        assert httpx.get(gone["url"], timeout=10).status_code == 404
        assert client.get(f"/v1/previews/{gone['preview_id']}").status_code == 404
    assert httpx.get(of_17["url"], timeout=10).status_code == 200
    assert client.get(f"/v1/previews/{of_17['preview_id']}").json() == of_17
    assert previews.revoke_all_of_user(43, actor="admin:purge") == 0  # nothing left: a second purge is a no-op
    revoked = {r.detail["preview_id"] for r in audit.entries(service.store, action="preview_revoked", limit=100) if r.actor == "admin:purge"}
    assert revoked == {socket_43["preview_id"], plain_43["preview_id"]}


def test_with_the_access_cookie_a_link_mints_a_cookie_and_a_stale_link_or_a_bare_url_is_refused() -> None:
    with served(preview_cookie_link_s=3, **block(2)) as (client, service):
        run_id = web_run(client, 67)
        write_app(client, run_id, "echo_headers.py", ECHO_HEADERS_APP)
        start(client, run_id, "exec python3 echo_headers.py 8113")
        preview, other = expose(client, run_id, 8113), expose(client, run_id, 8113)
        assert set(preview) == {"preview_id", "url", "port", "expires_at"}
        clean, _, key = preview["url"].partition("?preview_key=")
        assert key and clean.endswith("/")
        token = clean.rstrip("/").rsplit("/", 1)[1]
        assert httpx.get(clean, timeout=10).status_code == 403  # the token alone no longer opens it

        with httpx.Client(timeout=10) as browser:
            minted = browser.get(preview["url"].replace("?", "page?x=1&"))
            assert minted.status_code == 303 and minted.headers["location"] == f"/{token}/page?x=1"
            set_cookie = minted.headers["set-cookie"]
            assert "HttpOnly" in set_cookie and "Path=/;" in set_cookie and "SameSite=Lax" in set_cookie
            deadline = time.monotonic() + 20
            while (page := browser.get(clean + "page?x=1")).status_code == 503:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert page.status_code == 200 and page.json()["path"] == "/page?x=1"
            assert "preview_access" not in repr(page.json()["headers"])  # the cookie never reaches the app
            (cookie,) = list(browser.cookies.jar)
            # The cookie is this preview's alone: under another preview's name, or altered, it is refused.
            other_clean = other["url"].partition("?")[0]
            other_name = httpx.get(other["url"], timeout=10).headers["set-cookie"].split("=", 1)[0]
            assert httpx.get(other_clean, cookies={other_name: cookie.value}, timeout=10).status_code == 403
            forged = cookie.value.rsplit(".", 1)[0] + ".AAAA"
            assert httpx.get(clean, cookies={cookie.name: forged}, timeout=10).status_code == 403
            until, _, signature = cookie.value.partition(".")
            assert httpx.get(clean, cookies={cookie.name: f"{int(until) + 10**6}.{signature}"}, timeout=10).status_code == 403

            time.sleep(3.2)  # the link's key has expired: a late visitor is refused, the early one keeps access
            stale = httpx.get(preview["url"], timeout=10)
            assert stale.status_code == 403 and "expired" in stale.text
            assert browser.get(clean + "again").status_code == 200
        # The API hands out a fresh link on demand.
        fresh = client.get(f"/v1/previews/{preview['preview_id']}").json()["url"]
        assert fresh != preview["url"] and httpx.get(fresh, timeout=10).status_code == 303
        # A revoked preview is a 404 even with its cookie.
        assert client.delete(f"/v1/previews/{preview['preview_id']}").status_code == 204
        assert httpx.get(clean, cookies={cookie.name: cookie.value}, timeout=10).status_code == 404
        service.previews.flush_audit()  # type: ignore[union-attr]
        outcomes = {r.detail["outcome"] for r in audit.entries(service.store, action="preview_connection", limit=100)}
        assert {"cookie_minted", "no_access_cookie", "relayed"} <= outcomes


def test_a_slow_head_an_oversized_head_a_quiet_app_and_the_daily_bytes_are_bounded() -> None:
    settings = {"preview_head_timeout_s": 0.5, "preview_idle_timeout_s": 1.0, "preview_max_bytes_per_day": 1024 * 1024}
    with served(**settings, **block(3)) as (client, service):
        previews = service.previews
        assert previews is not None
        host, port = previews.address.split(":")
        run_id = web_run(client, 67)
        write_app(client, run_id, "silent.py", SILENT_APP)
        start(client, run_id, "exec python3 silent.py 8114")
        shell(client, run_id, "mkdir -p site && head -c 2097152 /dev/urandom > site/big.bin")
        start(client, run_id, "cd site && exec python3 -m http.server 8115 --bind 127.0.0.1")
        quiet, files = expose(client, run_id, 8114), expose(client, run_id, 8115)

        def answer(data: bytes, wait_s: float = 10) -> tuple[bytes, float]:
            with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
                started = time.monotonic()
                sock.sendall(data)
                received = b""
                while piece := sock.recv(65536):
                    received += piece
                return received, time.monotonic() - started

        # A visitor that never finishes its head is answered 408 after the head deadline.
        slow, took = answer(b"GET /" + files["url"].split("/", 3)[3].encode() + b" HTTP/1.1\r\nHost: x\r\n")
        assert slow.startswith(b"HTTP/1.1 408") and 0.4 < took < 3, (slow, took)
        big, _ = answer(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 20_000)
        assert big.startswith(b"HTTP/1.1 431")
        # An app that accepts and never answers: the connection is closed after the idle time.
        path = "/" + quiet["url"].split("/", 3)[3]
        nothing, took = answer(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert nothing == b"" and 0.9 < took < 5, took

        # 1 MiB a day: the 2 MiB download is cut near the bound, and the next request is a 429.
        assert wait_served(files["url"]).status_code == 200
        with httpx.stream("GET", files["url"] + "big.bin", timeout=30) as response:
            got = 0
            with pytest.raises(httpx.HTTPError):
                for chunk in response.iter_raw():
                    got += len(chunk)
        assert got < 2 * 1024 * 1024
        refused = httpx.get(files["url"], timeout=10)
        assert refused.status_code == 429 and refused.headers["retry-after"].isdigit()
        previews.flush_audit()
        outcomes = {r.detail["outcome"] for r in audit.entries(service.store, action="preview_connection", limit=100)}
        assert {"idle", "daily_bytes"} <= outcomes, outcomes
