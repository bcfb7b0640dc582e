"""Request bodies (issue 12 item 5) through a live server: authentication before any body
byte is read, a cap per route (413 with the limit), and a time bound on slow bodies (408)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from orchestrator.http.app import create_app
from orchestrator.http.request_guard import body_limit
from orchestrator.service import OrchestratorService
from orchestrator.settings import ApiSettings
from tests.conftest import API_TOKEN, make_settings
from tests.agent_env import traversable_tmp  # noqa: F401 - fixture
from tests.live_server import live_server

MIB = 1024 * 1024


@pytest.fixture
def served(data_dir: Path) -> Iterator[tuple[str, OrchestratorService]]:
    service = OrchestratorService(
        make_settings(data_dir, http_body_max_bytes=64 * 1024, http_body_stall_s=1.0, http_body_timeout_s=3.0)
    )
    with live_server(create_app(service)) as base:
        yield base, service


def connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(head.split(b" ", 2)[1]), body


def test_item5_a_huge_body_without_a_token_is_refused_before_it_is_read(served) -> None:
    base, _ = served
    size = 200 * MIB
    me = psutil.Process()
    before = me.memory_info().rss
    sock = connect(base)
    head = f"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    sock.sendall(head.encode())
    sent = 0

    def stream() -> None:
        nonlocal sent
        block = b"x" * MIB
        try:
            while sent < size:
                sock.sendall(block)
                sent += len(block)
        except OSError:
            pass  # the server closed the connection: what we want

    sender = threading.Thread(target=stream, daemon=True)
    sender.start()
    sock.settimeout(20)
    status, body = read_response(sock)
    sender.join(timeout=30)
    grown = me.memory_info().rss - before
    sock.close()
    assert status == 401, body
    assert b'"unauthorized"' in body
    assert grown < 20 * MIB, f"the server grew by {grown / MIB:.0f} MiB for a {size / MIB:.0f} MiB body"


def test_item5_a_too_large_body_with_a_token_is_413_with_the_limit(served) -> None:
    base, _ = served
    auth = {"Authorization": f"Bearer {API_TOKEN}"}
    response = httpx.post(f"{base}/v1/sessions", content=b"x" * (65 * 1024), headers=auth)
    assert response.status_code == 413, response.text
    assert response.json() == {
        "error": {"code": "payload_too_large", "message": response.json()["error"]["message"], "limit": 64 * 1024}
    }

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted while it arrives
        for _ in range(100):
            yield b"y" * 4096

    response = httpx.post(f"{base}/v1/sessions", content=chunked(), headers=auth)
    assert response.status_code == 413 and response.json()["error"]["limit"] == 64 * 1024
    # a body under the cap goes through to the route as before
    ok = httpx.post(f"{base}/v1/sessions", json={"owner_user_id": 17, "channel": "web"}, headers=auth)
    assert ok.status_code == 201, ok.text


def test_item5_a_half_sent_body_times_out_while_healthz_answers(served) -> None:
    base, _ = served
    sock = connect(base)
    head = f"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_TOKEN}\r\nContent-Length: 1000\r\n\r\n"
    sock.sendall(head.encode() + b'{"owner_user_id": 1')
    started = time.monotonic()
    assert httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    status, body = read_response(sock)
    assert status == 408, body
    assert b'"request_timeout"' in body
    assert 0.8 < time.monotonic() - started < 5
    assert sock.recv(10) == b""  # and closed
    sock.close()
    # a trickle (one byte every 0.5 s, never stalling 1 s) still ends at the whole-body bound
    sock = connect(base)
    sock.sendall(head.encode())
    started = time.monotonic()
    sock.settimeout(0.5)
    status = None
    while time.monotonic() - started < 8:
        try:
            sock.sendall(b" ")
            status, body = read_response(sock)
            break
        except TimeoutError:
            continue
    sock.close()
    assert status == 408
    assert time.monotonic() - started < 5


def test_body_limits_per_route(data_dir: Path) -> None:
    settings = ApiSettings.of(make_settings(data_dir))
    assert body_limit("PUT", "/v1/users/17/skills/pdf", settings) > 2 * settings.skill_upload_max_bytes
    assert body_limit("PUT", "/v1/admin/skills/pdf", settings) > 2 * settings.skill_upload_max_bytes
    assert body_limit("POST", "/v1/runs/r-1/tools/write_file", settings) > settings.read_bytes_max
    assert body_limit("POST", "/v1/sessions", settings) == settings.http_body_max_bytes
    assert body_limit("GET", "/v1/users/17/skills/pdf", settings) == settings.http_body_max_bytes


@pytest.fixture
def serve(traversable_tmp: Path) -> Iterator[str]:
    """`orchestrator serve` itself: its uvicorn settings are part of what is tested."""
    from tests.live_server import free_port, serve_process

    env = {"ORCH_API_TOKEN": API_TOKEN, "ORCH_BACKEND": "process", "ORCH_HTTP_BODY_STALL_S": "1",
           "ORCH_HTTP_MAX_HEADER_BYTES": str(64 * 1024)}  # fmt: skip
    with serve_process(str(traversable_tmp / "data"), free_port(), env) as url:
        yield url


def test_item5_orchestrator_serve_bounds_the_request_head(serve: str) -> None:
    # a header that never ends: cut at the cap, not held
    sock = connect(serve)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
    try:
        for _ in range(64):
            sock.sendall(b"a" * 65536)
    except OSError:
        pass
    sock.settimeout(5)
    status, _ = read_response(sock)
    assert status == 400
    sock.close()
    # a head that trickles in (or never comes): 408 and closed, while /healthz answers
    slow = connect(serve)
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    silent = connect(serve)
    started = time.monotonic()
    assert httpx.get(f"{serve}/healthz", timeout=2).status_code == 200
    for sock in (slow, silent):
        sock.settimeout(5)
        status, body = read_response(sock)
        assert status == 408 and b"request_timeout" in body
        sock.close()
    assert time.monotonic() - started < 4


def test_a_stalled_body_on_a_crafted_path_logs_one_printable_line(served, caplog: pytest.LogCaptureFixture) -> None:
    """No token is needed outside /v1/: the guard's timeout line names the request's path,
    which the client chose (percent-decoded: CR, an escape sequence, U+2028). It is logged
    escaped and shortened, never raw."""
    import logging

    caplog.set_level(logging.WARNING, logger="orchestrator.http.request_guard")
    base, _ = served
    crafted = "/x%0D%1B%5B2Kaccess%20method=GET%20route=/v1/forged%20status=200%E2%80%A8" + "y" * 5000
    with connect(base) as sock:
        sock.sendall(f"POST {crafted} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc".encode())
        status, _ = read_response(sock)
    assert status == 408
    lines = [r.getMessage() for r in caplog.records if r.name == "orchestrator.http.request_guard"]
    assert len(lines) == 1 and "timed out" in lines[0], lines
    assert lines[0].isprintable() and "\\r\\x1b[2Kaccess" in lines[0] and "\\u2028" in lines[0], lines
    assert len(lines[0]) < 1000, "a client-chosen path is shortened in the log"
