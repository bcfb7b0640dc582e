"""One structured access line per request: method, route template, status, duration, request
id, acting user (orchestrator/http/access_log.py)."""

from __future__ import annotations

import logging
import re

import pytest
from fastapi.testclient import TestClient

from orchestrator.log import kv

ACCESS = "orchestrator.access"


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line))


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    return [_fields(r.getMessage()) for r in caplog.records if r.name == ACCESS]


def test_each_request_gives_one_line_with_the_route_template(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS)
    assert client.put("/v1/users/17", json={"display_name": "A"}).status_code == 200
    assert client.get("/v1/sessions/s-nothing-here", headers={"X-Acting-User": "17", "X-Request-Id": "bot-42"}).status_code == 404
    assert client.get("/v1/users/17", headers={"X-Acting-User": "+17"}).status_code == 422
    assert client.get("/no/such/route").status_code == 404
    assert client.get("/v1/users/17", headers={"Authorization": "Bearer wrong"}).status_code == 401
    lines = _access_lines(caplog)
    assert [(f["method"], f["route"], f["status"]) for f in lines] == [
        ("PUT", "/v1/users/{user_id}", "200"),
        ("GET", "/v1/sessions/{session_id}", "404"),
        ("GET", "/v1/users/{user_id}", "422"),
        ("GET", "-", "404"),
        ("GET", "-", "401"),  # refused by the guard before any route matched
    ]
    assert [f["acting_user"] for f in lines] == ["null", "17", "invalid", "null", "null"]
    assert lines[1]["request_id"] == "bot-42"  # the caller's own id, for its logs
    assert all(re.fullmatch(r"[0-9a-f]{32}", f["request_id"]) for f in lines if f is not lines[1])
    assert all(float(f["duration_ms"]) >= 0 for f in lines)
    assert "s-nothing-here" not in " ".join(r.getMessage() for r in caplog.records if r.name == ACCESS)


def test_an_unsafe_request_id_is_replaced(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS)
    client.get("/healthz", headers={"X-Request-Id": "x y=1 injected"})
    (line,) = _access_lines(caplog)
    assert re.fullmatch(r"[0-9a-f]{32}", line["request_id"]) and line["route"] == "/healthz"


def test_kv_quotes_what_would_break_a_line() -> None:
    assert kv(a="x y", b=None, c='q"') == 'a="x y" b=null c="q\\""'


def test_headers_a_client_chose_cannot_forge_an_access_line(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    """X-Request-Id and X-Acting-User with an escape sequence, a tab or U+2028 (h11 already
    refuses CR and LF in header values), and a path full of them: the line keeps only safe
    tokens (a fresh id, `invalid`, the route template)."""
    caplog.set_level(logging.INFO, logger=ACCESS)
    hostile = {"X-Request-Id": b"a\x1b[2Kaccess\tmethod=GET", "X-Acting-User": "17\x1b[2K\u2028x".encode()}
    client.get("/v1/sessions/%1B%5B2K%E2%80%A8x", headers=hostile)
    client.get("/%1B%5B2Kaccess%20method=GET%0D", headers=hostile)
    messages = [r.getMessage() for r in caplog.records if r.name == ACCESS]
    assert len(messages) == 2 and all(m.isprintable() for m in messages), messages
    fields = [_fields(m) for m in messages]
    assert [f["route"] for f in fields] == ["/v1/sessions/{session_id}", "-"]
    assert all(f["acting_user"] == "invalid" and re.fullmatch(r"[0-9a-f]{32}", f["request_id"]) for f in fields), fields
