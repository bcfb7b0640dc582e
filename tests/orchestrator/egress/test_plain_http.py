"""The plain-HTTP request decider, pure: the Host header must name the checked target, the
body is framed by one Content-Length, and the upstream gets one origin-form request."""

from __future__ import annotations

import pytest

from orchestrator.egress.plain_http import PlainRequestRefused, plan_plain_request


def plan(*headers: str, host: str = "example.com", port: int = 80):  # type: ignore[no-untyped-def]
    return plan_plain_request("POST", "HTTP/1.1", [h.encode() for h in headers], host, port, "/up?x=1")


def test_the_request_is_origin_form_without_proxy_headers() -> None:
    request = plan("Host: Example.COM", "Proxy-Authorization: secret", "Connection: keep-alive", "Content-Length: 5")
    assert request.head == b"POST /up?x=1 HTTP/1.1\r\nHost: Example.COM\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"
    assert request.body_length == 5
    assert plan().head.startswith(b"POST /up?x=1 HTTP/1.1\r\nHost: example.com:80\r\n")  # none sent: the target's
    assert plan("Host: [::1]:8080", host="::1", port=8080).body_length == 0
    assert plan("Host: example.com:80").body_length == 0


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        (["Host: pypi.org"], 400, "host_mismatch"),
        (["Host: example.com:8080"], 400, "host_mismatch"),
        (["Host: example.com", "Host: example.com"], 400, "host_mismatch"),
        (["Host: exa mple.com"], 400, "host_mismatch"),
        (["Host: example.com", "Transfer-Encoding: chunked"], 411, "transfer_encoding"),
        (["Host: example.com", "Content-Length: 5", "Content-Length: 6"], 400, "bad_content_length"),
        (["Host: example.com", "Content-Length: -1"], 400, "bad_content_length"),
    ],
)
def test_refused(headers: list[str], status: int, code: str) -> None:
    with pytest.raises(PlainRequestRefused) as refused:
        plan(*headers)
    assert (refused.value.status, refused.value.code) == (status, code)


@pytest.mark.parametrize(
    "line",
    ["X-Pad: a\nHost: evil.example", "X-Pad: a\rHost: evil.example", "X-Pad: a\x00", " Host: evil.example", "\tX: y"],
)
def test_a_header_line_an_upstream_could_split_is_refused(line: str) -> None:
    with pytest.raises(PlainRequestRefused) as refused:
        plan("Host: example.com", line)
    assert (refused.value.status, refused.value.code) == (400, "bad_header")


@pytest.mark.parametrize("path", ["/x\nHost:evil.example\nX:", "/x\ty", "/x\x7f", "/a b"])
def test_a_request_target_with_a_control_character_is_refused(path: str) -> None:
    with pytest.raises(PlainRequestRefused) as refused:
        plan_plain_request("GET", "HTTP/1.1", [b"Host: example.com"], "example.com", 80, path)
    assert (refused.value.status, refused.value.code) == (400, "bad_target")


@pytest.mark.parametrize(("method", "version"), [("GET", "HTTP/1.1\nHost:evil.example"), ("X\nHOST:EVIL\nGET", "HTTP/1.1"), ("GET", "HTTP/1.2")])
def test_a_request_line_an_upstream_could_split_is_refused(method: str, version: str) -> None:
    with pytest.raises(PlainRequestRefused) as refused:
        plan_plain_request(method, version, [b"Host: example.com"], "example.com", 80, "/")
    assert (refused.value.status, refused.value.code) == (400, "bad_target")
