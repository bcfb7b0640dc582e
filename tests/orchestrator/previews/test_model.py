"""The pure decisions about previews: which preview a target names, the head the app gets,
expiry bounds. No socket here."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from orchestrator.errors import InvalidInput
from orchestrator.previews.model import (
    BadHead,
    app_cookie_prefix,
    app_cookies,
    expiry,
    host_suffix,
    host_token,
    interim_status,
    new_token,
    parse_head,
    preview_url,
    referred_token,
    scoped_response_head,
    scoped_set_cookie,
    split_target,
    upstream_head,
)
from sandbox_agent.port_tunnel import tunnel_target

TOKEN = "abcdefghijklmnopqrstuvwxyz234567"
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_a_target_names_its_token_and_the_apps_path() -> None:
    assert split_target(f"/{TOKEN}/a/b?c=1") == (TOKEN, "/a/b?c=1")
    assert split_target(f"/{TOKEN}") == (TOKEN, "")
    assert split_target("/short/x") is None and split_target("http://x/") is None
    assert referred_token(f"http://preview:9000/{TOKEN}/page.html") == TOKEN
    assert referred_token("http://preview:9000/other") is None


def test_the_apps_head_carries_no_credentials_and_says_where_the_visitor_came_from() -> None:
    head = parse_head(
        b"GET /x HTTP/1.1\r\nHost: p:9\r\nAuthorization: Bearer api\r\nCookie: a=b\r\nX-Forwarded-For: 6.6.6.6\r\n"
        b"Proxy-Authorization: x\r\nAccept: */*"
    )
    sent = upstream_head(head, "/x", port=8000, visitor_ip="127.0.0.1", public_host="p:9", scheme="https", prefix="/t", cookie_prefix="pv0_").decode()
    assert "Authorization" not in sent and "Cookie" not in sent and "6.6.6.6" not in sent
    assert "Host: localhost:8000\r\n" in sent and "Connection: close\r\n" in sent and "Accept: */*\r\n" in sent
    assert "X-Forwarded-Proto: https\r\n" in sent and "X-Forwarded-Host: p:9\r\n" in sent


def test_a_websocket_upgrade_is_passed_on() -> None:
    head = parse_head(b"GET /ws HTTP/1.1\r\nHost: p\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade")
    sent = upstream_head(head, "/ws", port=1, visitor_ip="1", public_host=None, scheme="http", prefix="/t", cookie_prefix="pv0_").decode()
    assert "Connection: Upgrade\r\n" in sent and "Upgrade: websocket\r\n" in sent


def test_expiry_has_a_default_and_a_maximum() -> None:
    assert (expiry(NOW, None, default_s=60, max_s=120) - NOW).total_seconds() == 60
    with pytest.raises(InvalidInput):
        expiry(NOW, 121, default_s=60, max_s=120)


def test_the_agent_tunnels_only_to_its_sandboxs_loopback_and_never_its_own_ports() -> None:
    auth = b"\r\nAuthorization: Bearer t"
    assert tunnel_target(b"CONNECT 127.0.0.1:8000 HTTP/1.1" + auth, frozenset())[:2] == (8000, "Bearer t")
    assert tunnel_target(b"CONNECT 10.0.0.1:8000 HTTP/1.1" + auth, frozenset())[0] is None
    assert tunnel_target(b"CONNECT 127.0.0.1:3128 HTTP/1.1" + auth, frozenset({3128}))[0] is None
    assert tunnel_target(b"CONNECT 127.0.0.1:0 HTTP/1.1" + auth, frozenset())[0] is None


def test_host_mode_names_the_preview_by_its_host() -> None:
    base = "https://{token}.preview.example.com"
    token = new_token()
    assert preview_url(base, token) == f"https://{token}.preview.example.com/"
    assert preview_url("http://127.0.0.1:9000", token) == f"http://127.0.0.1:9000/{token}/"
    suffix = host_suffix(base)
    assert suffix == ".preview.example.com" and host_suffix("http://127.0.0.1:9000") is None
    assert host_token(f"{token.upper()}.Preview.Example.com:443", suffix) == token  # hosts are case-blind
    assert host_token(f"{token}.evil.com", suffix) is None
    assert host_token(f"x.{token}.preview.example.com", suffix) is None
    assert host_suffix("http://{token}.preview.test:9000") == ".preview.test"


@pytest.mark.parametrize("raw", [b"GET / HTTP/1.1\r\nX: a\nAuthorization: b", b"GET / HTTP/1.1\r\nX: a\rY: b",
                                 b"GET /\x00 HTTP/1.1", b"GET / HTTP/2", b"GET  / HTTP/1.1", b"GET / HTTP/1.1\r\n folded"])
def test_a_head_with_a_bare_line_break_or_a_bad_line_is_refused(raw: bytes) -> None:
    with pytest.raises(BadHead):
        parse_head(raw)


def test_an_apps_cookie_is_scoped_to_its_preview_and_renamed() -> None:
    prefix, pv = f"/{TOKEN}", app_cookie_prefix(TOKEN)
    assert pv.startswith("pv") and pv.endswith("_") and pv != app_cookie_prefix("b" * 32)
    assert scoped_set_cookie("sid=abc; Path=/; Domain=.example.com; HttpOnly; SameSite=Lax", prefix, pv) == (
        f"{pv}sid=abc; Path=/{TOKEN}/; HttpOnly; SameSite=Lax"
    )
    assert scoped_set_cookie("a=1", prefix, pv) == f"{pv}a=1; Path=/{TOKEN}/"  # the default path is the app's root
    assert scoped_set_cookie("a=1; path=/app/; domain=127.0.0.1", prefix, pv) == f"{pv}a=1; Path=/{TOKEN}/app/"
    assert scoped_set_cookie("a=1; Path=relative", prefix, pv) == f"{pv}a=1; Path=/{TOKEN}/"
    assert scoped_set_cookie("a=1; Domain=example.com", "", pv) == f"{pv}a=1; Path=/"  # host mode: its own host only
    assert scoped_set_cookie("novalue", prefix, pv) is None and scoped_set_cookie("=x", prefix, pv) is None
    head = b"HTTP/1.1 200 OK\r\nset-cookie: a=1; Domain=x\r\nSet-Cookie: junk\r\nContent-Length: 0"
    assert scoped_response_head(head, prefix, pv) == f"HTTP/1.1 200 OK\r\nSet-Cookie: {pv}a=1; Path=/{TOKEN}/\r\nContent-Length: 0".encode()
    # A head another reader splits or joins differently could hide a cookie from this reading: refused.
    assert scoped_response_head(b"HTTP/1.1 200 OK\r\nX: 1\nSet-Cookie: a=1; Path=/", prefix, pv) is None
    assert scoped_response_head(b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1;\r\n Path=/", prefix, pv) is None
    assert scoped_response_head(b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\x00; Path=/", prefix, pv) is None


def test_the_app_gets_back_only_its_own_cookies() -> None:
    pv, other = app_cookie_prefix(TOKEN), app_cookie_prefix("b" * 32)
    head = parse_head(
        f"GET / HTTP/1.1\r\nCookie: session=api; {pv}sid=abc; {pv}=x; {other}sid=planted\r\n"
        f"Cookie: {pv}b=2; preview_access_x=s; pv_c=3".encode()
    )
    assert app_cookies(head, pv) == "sid=abc; b=2"
    assert app_cookies(parse_head(b"GET / HTTP/1.1\r\nCookie: session=api"), pv) is None
    sent = upstream_head(head, "/", port=8000, visitor_ip="127.0.0.1", public_host=None, scheme="http", prefix="", cookie_prefix=pv)
    assert b"Cookie: sid=abc; b=2\r\n" in sent and b"session=api" not in sent and b"planted" not in sent


def test_an_interim_head_is_followed_by_another() -> None:
    assert interim_status(b"HTTP/1.1 100 Continue") and interim_status(b"HTTP/1.1 103 Early Hints\r\nLink: x")
    assert not interim_status(b"HTTP/1.1 101 Switching Protocols") and not interim_status(b"HTTP/1.1 200 OK")
