"""The host's URL fetch: size cap, timeout, redirects, and no private-range address
is ever connected to. Only loopback traffic: the server is this test's own."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from orchestrator.errors import ToolError
from orchestrator.deliveries.url_fetch import UrlFetcher, address_refusal
from tests.live_server import live_server

BODY = b"%PDF-1.7 report" * 100


def make_app(hits: list[str]) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def count(request: Request, call_next):
        hits.append(f"{request.url.path} host={request.headers.get('host')}")
        return await call_next(request)

    @app.get("/files/report.pdf")
    def report() -> Response:
        return Response(BODY, media_type="application/pdf")

    @app.get("/named")
    def named() -> Response:
        return Response(b"x", media_type="text/plain; charset=utf-8", headers={"Content-Disposition": 'attachment; filename="q3 sales.csv"'})

    @app.get("/redirect/{n}")
    def redirect(n: int) -> RedirectResponse:
        return RedirectResponse("/files/report.pdf" if n == 0 else f"/redirect/{n - 1}", status_code=302)

    @app.get("/to-private")
    def to_private() -> RedirectResponse:
        return RedirectResponse("http://10.0.0.1/secret", status_code=302)

    @app.get("/big")
    def big() -> Response:
        return Response(b"a" * 5000, media_type="application/octet-stream")

    @app.get("/big-chunked")
    def big_chunked() -> StreamingResponse:
        return StreamingResponse(iter([b"a" * 1000] * 5), media_type="application/octet-stream")

    @app.get("/slow")
    async def slow() -> StreamingResponse:
        import asyncio

        async def drip():
            for _ in range(50):
                yield b"."
                await asyncio.sleep(0.1)

        return StreamingResponse(drip())

    @app.get("/missing")
    def missing() -> Response:
        return Response(b"no", status_code=404)

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []
    with live_server(make_app(hits)) as base:
        yield base, hits


def fetcher(**kwargs) -> UrlFetcher:
    return UrlFetcher(timeout_s=kwargs.pop("timeout_s", 5), allow_loopback=kwargs.pop("allow_loopback", True), **kwargs)


def test_fetches_a_file_with_its_type_and_name(server) -> None:
    base, _ = server
    fetched = fetcher().fetch(f"{base}/files/report.pdf", max_bytes=10_000)
    assert fetched.data == BODY and fetched.media_type == "application/pdf" and fetched.file_name == "report.pdf"
    named = fetcher().fetch(f"{base}/named", max_bytes=10)
    assert named.file_name == "q3 sales.csv" and named.media_type == "text/plain"


def test_follows_a_few_redirects_and_refuses_more(server) -> None:
    base, _ = server
    fetched = fetcher().fetch(f"{base}/redirect/3", max_bytes=10_000)
    assert fetched.data == BODY and fetched.url.endswith("/files/report.pdf")
    with pytest.raises(ToolError) as error:
        fetcher().fetch(f"{base}/redirect/9", max_bytes=10_000)
    assert error.value.code == "url_fetch_failed" and "redirects" in error.value.message


def test_the_size_cap_holds_with_and_without_content_length(server) -> None:
    base, _ = server
    for path in ("/big", "/big-chunked"):
        with pytest.raises(ToolError) as error:
            fetcher().fetch(f"{base}{path}", max_bytes=4096)
        assert error.value.code == "too_large", path
    assert len(fetcher().fetch(f"{base}/big", max_bytes=5000).data) == 5000


def test_a_slow_server_times_out(server) -> None:
    base, _ = server
    started = time.monotonic()
    with pytest.raises(ToolError) as error:
        fetcher(timeout_s=0.5).fetch(f"{base}/slow", max_bytes=10_000)
    assert error.value.code == "timeout"
    assert time.monotonic() - started < 3


def test_http_errors_are_tool_errors(server) -> None:
    base, _ = server
    with pytest.raises(ToolError) as error:
        fetcher().fetch(f"{base}/missing", max_bytes=100)
    assert error.value.code == "url_fetch_failed" and "404" in error.value.message


def test_loopback_is_refused_unless_allowed_and_nothing_is_sent(server) -> None:
    base, hits = server
    before = len(hits)
    for url in (f"{base}/files/report.pdf", base.replace("127.0.0.1", "[::1]") + "/x", base.replace("127.0.0.1", "127.1.2.3") + "/x"):
        with pytest.raises(ToolError) as error:
            fetcher(allow_loopback=False).fetch(url, max_bytes=10_000)
        assert error.value.code == "url_refused", url
        assert "loopback" in error.value.message
    assert len(hits) == before


def test_a_redirect_to_a_private_address_is_refused_before_connecting(server) -> None:
    base, _ = server
    with pytest.raises(ToolError) as error:
        fetcher().fetch(f"{base}/to-private", max_bytes=10_000)
    assert error.value.code == "url_refused" and "10.0.0.1" in error.value.message


@pytest.mark.parametrize(
    "url",
    [
        "http://10.1.2.3/x",
        "http://172.17.0.1/x",  # Docker's bridge
        "http://192.168.1.1/x",
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata
        "http://100.64.0.1/x",  # shared address space
        "http://0.0.0.0/x",
        "http://[fd00::1]/x",
        "http://[fe80::1]/x",
        "http://[::ffff:10.0.0.1]/x",
        "http://224.0.0.1/x",
        "http://240.0.0.1/x",
        "http://localhost/x",
    ],
)
def test_private_and_special_addresses_are_refused_without_any_traffic(url: str) -> None:
    def resolver(host: str, port: int) -> list[str]:
        assert host == "localhost", "only names are resolved; literals are checked as they are"
        return ["127.0.0.1", "::1"]

    with pytest.raises(ToolError) as error:
        fetcher(allow_loopback=False, resolver=resolver).fetch(url, max_bytes=10)
    assert error.value.code == "url_refused"


def test_a_name_is_resolved_first_and_refused_when_any_address_is_private() -> None:
    asked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append(f"{host}:{port}")
        return ["93.184.216.34", "10.0.0.7"]  # a rebinding-style mixed answer

    with pytest.raises(ToolError) as error:
        fetcher(resolver=resolver).fetch("https://files.example.test/a.png", max_bytes=10)
    assert error.value.code == "url_refused" and "10.0.0.7" in error.value.message
    assert asked == ["files.example.test:443"]


def test_the_request_goes_to_the_checked_address_with_the_original_host_header(server) -> None:
    base, hits = server
    port = base.rsplit(":", 1)[1]
    fetched = fetcher(resolver=lambda host, p: ["127.0.0.1"]).fetch(
        f"http://files.example.test:{port}/files/report.pdf", max_bytes=10_000
    )
    assert fetched.data == BODY
    assert hits[-1] == f"/files/report.pdf host=files.example.test:{port}"


@pytest.mark.parametrize("url", ["ftp://example.com/x", "http://user:pw@example.com/x", "not a url", "http:///x"])
def test_bad_urls(url: str) -> None:
    with pytest.raises(ToolError) as error:
        fetcher(resolver=lambda h, p: ["93.184.216.34"]).fetch(url, max_bytes=10)
    assert error.value.code in ("invalid_arguments", "url_refused")


def test_address_refusal_is_a_pure_decision() -> None:
    assert address_refusal(ipaddress.ip_address("93.184.216.34"), allow_loopback=False) is None
    assert address_refusal(ipaddress.ip_address("2606:4700::1111"), allow_loopback=False) is None
    assert address_refusal(ipaddress.ip_address("127.0.0.1"), allow_loopback=True) is None
    assert address_refusal(ipaddress.ip_address("127.0.0.1"), allow_loopback=False) == "a loopback address"
    assert address_refusal(ipaddress.ip_address("10.0.0.1"), allow_loopback=True) == "a private or reserved address"
