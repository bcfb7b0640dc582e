"""The pure deciders: what a credential may look like, the header a template renders, which
credential (own or delegated) a connection gets, and the session a connection belongs to."""

from __future__ import annotations

import base64

import pytest

from orchestrator.credentials.injection import connection_session
from orchestrator.credentials.model import Credential, Grant, InvalidCredential, choose_credential, render_header, validate_spec
from orchestrator.egress.intercept import with_header, without_header

NOW = "2026-01-01T00:00:00.000000Z"


def cred(user_id: int, name: str, *hosts: str) -> Credential:
    return Credential(user_id, name, hosts, "Authorization", "Bearer {secret}", None, NOW, None)


def grant(grantee: int | None, session: str, *, expires: str = "2026-01-01T00:01:00.000000Z", revoked: str | None = None) -> Grant:
    return Grant("gr_1", 17, "deploy", grantee, session, NOW, expires, revoked)


def test_templates_render_bearer_and_basic() -> None:
    assert render_header("Bearer {secret}", "t0k") == "Bearer t0k"
    assert render_header("Basic {base64(user:secret)}", "alice:pw") == "Basic " + base64.b64encode(b"alice:pw").decode()
    assert render_header("Basic {base64(x-access-token:secret)}", "t0k") == "Basic " + base64.b64encode(b"x-access-token:t0k").decode()
    assert render_header("{secret}", "k") == "k"


@pytest.mark.parametrize(
    ("name", "hosts", "header", "template", "env", "secret", "field"),
    [
        ("GitHub", ["api.github.com"], "Authorization", "Bearer {secret}", None, "s", "name"),
        ("gh", [], "Authorization", "Bearer {secret}", None, "s", "hosts"),
        ("gh", ["*.com.*"], "Authorization", "Bearer {secret}", None, "s", "hosts"),
        ("gh", ["api.github.com"], "Bad Header", "Bearer {secret}", None, "s", "header"),
        ("gh", ["api.github.com"], "Host", "Bearer {secret}", None, "s", "header"),
        ("gh", ["api.github.com"], "Proxy-Authorization", "Bearer {secret}", None, "s", "header"),
        ("gh", ["api.github.com"], "Authorization", "Bearer token", None, "s", "template"),
        ("gh", ["api.github.com"], "Authorization", "Bearer {secret}\r\nX: y", None, "s", "template"),
        ("gh", ["api.github.com"], "Authorization", "Bearer {secret}", "1BAD", "s", "env"),
        ("gh", ["api.github.com"], "Authorization", "Bearer {secret}", None, "a\r\nHost: evil", "secret"),
        ("gh", ["api.github.com"], "Authorization", "Basic {base64(user:secret)}", None, "nocolon", "secret"),
    ],
)
def test_a_bad_credential_is_refused_naming_the_field(name, hosts, header, template, env, secret, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidCredential) as caught:
        validate_spec(name, hosts, header, template, env, secret)
    assert caught.value.field == field


def test_own_credentials_first_then_a_grant_that_applies_to_this_runtime_user_and_session() -> None:
    own = [cred(67, "mine", "api.example.org")]
    delegated = [(grant(67, "s-1"), cred(17, "deploy", "api.example.org", "deploy.example.org"))]
    pick = lambda host, user, session, **kw: choose_credential(  # noqa: E731
        host, 443, runtime_user_id=user, session_id=session, own=kw.get("own", own), delegated=kw.get("delegated", delegated), now_iso=NOW
    )
    assert pick("api.example.org", 67, "s-1").credential.name == "mine"
    chosen = pick("deploy.example.org", 67, "s-1")
    assert chosen.credential.name == "deploy" and chosen.grant is not None
    assert pick("deploy.example.org", 67, "s-2") is None  # another session
    assert pick("deploy.example.org", 68, "s-1", own=[]) is None  # another runtime user
    assert pick("deploy.example.org", 67, None) is None
    assert pick("deploy.example.org", 67, "s-1", delegated=[(grant(67, "s-1", expires="2025-12-31T00:00:00.000000Z"), delegated[0][1])]) is None
    assert pick("deploy.example.org", 67, "s-1", delegated=[(grant(67, "s-1", revoked=NOW), delegated[0][1])]) is None
    assert pick("deploy.example.org", 99, "s-1", own=[], delegated=[(grant(None, "s-1"), delegated[0][1])]) is not None
    assert pick("deploy.example.org:8443", 67, "s-1") is None


def test_the_session_of_a_connection_is_ambiguous_with_calls_of_two_sessions_in_flight() -> None:
    assert connection_session({"s-1"}, "s-2") == "s-1"
    assert connection_session({"s-1", "s-2"}, "s-1") is None
    assert connection_session(set(), "s-2") == "s-2"


def test_the_injected_header_replaces_every_placeholder_of_that_name() -> None:
    lines = [b"Host: api.example.org", b"authorization: Bearer cred:github", b"AUTHORIZATION: x", b"Accept: */*"]
    assert without_header(lines, "Authorization") == [b"Host: api.example.org", b"Accept: */*"]
    head = b"GET / HTTP/1.1\r\nHost: api.example.org\r\nConnection: close\r\n\r\n"
    assert with_header(head, "Authorization", "Bearer real") == (
        b"GET / HTTP/1.1\r\nHost: api.example.org\r\nConnection: close\r\nAuthorization: Bearer real\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("connect", "gets"),
    [
        ("a.example.com:443", True),
        ("A.EXAMPLE.COM.:443", True),  # case and a trailing dot are the same name
        ("a.example.com:0443", True),
        ("example.com:443", False),  # `*.domain` is below it, not the domain itself
        ("example.com.evil:443", False),
        ("evilexample.com:443", False),
        ("a.example.com:8443", False),  # no port in the pattern: 443 only
        ("api.github.com.:443", True),
        ("[0:0::1]:8443", True),  # an IPv6 literal however it is written
        ("[::ffff:127.0.0.1]:8443", False),
        ("xn--bcher-kva.de:443", True),  # IDNA: patterns and targets are ASCII (A-labels)
    ],
)
def test_which_connect_targets_a_credentials_patterns_take(connect: str, gets: bool) -> None:
    """Held: the CONNECT's target, normalized as the proxy parses it, against the patterns."""
    from orchestrator.egress.policy import parse_authority

    host, port = parse_authority(connect)
    own = [cred(67, "c", "*.example.com", "api.github.com", "[::1]:8443", "xn--bcher-kva.de")]
    assert (choose_credential(host, port, runtime_user_id=67, session_id=None, own=own, delegated=[], now_iso=NOW) is not None) is gets


@pytest.mark.parametrize("connect", ["bücher.de:443", "a..example.com:443", "%61.example.com:443", "a.example.com\x00.evil:443"])
def test_targets_that_are_no_host_name_are_refused_before_any_credential_is_looked_at(connect: str) -> None:
    from orchestrator.egress.policy import InvalidTarget, parse_authority

    with pytest.raises(InvalidTarget):
        parse_authority(connect)
