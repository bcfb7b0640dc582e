"""What a preview is and the pure decisions about it (docs/previews.md): its expiry, its URL,
which preview a visitor's request names, and the request head the sandbox's app receives.
No socket, no database here."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from orchestrator.clock import iso
from orchestrator.errors import InvalidInput
from orchestrator.request_head import smuggles

TOKEN_BYTES = 20  # 160 bits, as 32 characters of lowercase base32: a DNS label too (host mode)
_TOKEN = re.compile(r"[a-z2-7]{32}")
TOKEN_PLACEHOLDER = "{token}"  # in ORCH_PREVIEW_BASE_URL: host mode
# Never passed to the app: the API's credentials, and what only this hop may decide.
DROPPED_HEADERS = frozenset(
    {
        "authorization", "proxy-authorization", "cookie", "connection", "keep-alive", "proxy-connection", "te",
        "trailer", "host", "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto",
        "x-forwarded-prefix", "x-real-ip",
    }
)  # fmt: skip


@dataclass(frozen=True)
class PreviewRecord:
    preview_id: str
    token: str
    user_id: int  # the runtime user whose sandbox serves it
    run_id: str
    session_id: str
    port: int
    created_at: str
    expires_at: str

    def live(self, now: datetime) -> bool:
        return iso(now) < self.expires_at


def expiry(now: datetime, ttl_s: int | None, *, default_s: int, max_s: int) -> datetime:
    """When a preview asked for now with `ttl_s` (None: the default) ends; longer than the
    operator's maximum is a clear refusal, not a silent cut."""
    ttl = default_s if ttl_s is None else ttl_s
    if ttl <= 0:
        raise InvalidInput("ttl_s must be positive", field="ttl_s")
    if ttl > max_s:
        raise InvalidInput(f"ttl_s may be at most {max_s} on this server", field="ttl_s", maximum=max_s)
    return now.astimezone(timezone.utc) + timedelta(seconds=ttl)


def check_port(port: int) -> None:
    if not 0 < port < 65536:
        raise InvalidInput("port must be between 1 and 65535", field="port")


def new_token() -> str:
    return base64.b32encode(secrets.token_bytes(TOKEN_BYTES)).decode().lower()


def preview_url(base_url: str, token: str) -> str:
    """Path mode `{base}/{token}/`; host mode (the base names `{token}`, e.g.
    `https://{token}.preview.example.com`) `https://<token>.preview.example.com/`."""
    if TOKEN_PLACEHOLDER in base_url:
        return f"{base_url.replace(TOKEN_PLACEHOLDER, token).rstrip('/')}/"
    return f"{base_url.rstrip('/')}/{token}/"


def host_suffix(base_url: str) -> str | None:
    """Pure: in host mode, what a preview's Host ends with after its token (`.preview.example.com`,
    lower-case, without a port); None in path mode."""
    if TOKEN_PLACEHOLDER not in base_url:
        return None
    authority = base_url.split("://", 1)[-1].split("/", 1)[0]
    after = authority.split(TOKEN_PLACEHOLDER, 1)[1]
    return after.rsplit(":", 1)[0].lower() if after.count(":") == 1 else after.lower()


def host_token(host: str | None, suffix: str) -> str | None:
    """Pure: the token a host-mode Host header names (`<token>.preview.example.com[:port]`)."""
    if not host:
        return None
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.lower()
    if not name.endswith(suffix):
        return None
    token = name[: len(name) - len(suffix)]
    return token if _TOKEN.fullmatch(token) else None


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((value for key, value in self.headers if key.lower() == name), None)


class BadHead(ValueError):
    """A request head the preview listener does not relay (answered 400)."""


def parse_head(raw: bytes) -> RequestHead:
    """Pure: a request head (without its final blank line) as sent by a visitor."""
    if any(smuggles(line) for line in raw.split(b"\r\n")):
        raise BadHead("a bare CR, LF or NUL in the request head, or a folded header line")
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
        raise BadHead("not an HTTP/1 request line")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t"):
            raise BadHead("a malformed header line")
        headers.append((name, value.strip()))
    return RequestHead(parts[0], parts[1], parts[2], headers)


def split_target(target: str) -> tuple[str, str] | None:
    """Pure: (token, the path the app sees) of a path-mode target `/{token}/rest`; None when
    the target names no token. `/{token}` alone is the app's `/` too (answered with a
    redirect to `/{token}/` so relative links resolve)."""
    if not target.startswith("/"):
        return None
    token, slash, rest = target[1:].partition("/")
    token, query_sep, query = token.partition("?")
    if not _TOKEN.fullmatch(token):
        return None
    if not slash:
        return token, "" if not query_sep else f"?{query}"
    return token, f"/{rest}"


def referred_token(referer: str | None) -> str | None:
    """Pure: the token of the preview page that asked for a root-relative URL (`/static/app.js`
    from a page under `/{token}/`): browsers name that page in `Referer`."""
    if not referer:
        return None
    _, sep, after = referer.partition("://")
    path = "/" + after.partition("/")[2] if sep else referer
    named = split_target(path)
    return named[0] if named is not None else None


def app_cookie_prefix(token: str) -> str:
    """Pure: the prefix the app's cookies carry in the visitor's browser, its preview's own
    (`pv` and 10 hex digits of the token's SHA-256: unguessable without the token). The relay
    adds it to the names the app sets and passes on only the cookies that carry it, without
    it: so no cookie of the API, of another site on the same host (cookies ignore ports), or
    one another preview's page planted for the whole host, reaches the app."""
    return f"pv{hashlib.sha256(token.encode()).hexdigest()[:10]}_"


def app_cookies(head: RequestHead, name_prefix: str) -> str | None:
    """Pure: the `Cookie` value the app receives: of the visitor's cookies only those under its
    preview's `name_prefix` (`app_cookie_prefix`), under the names the app gave them; None
    when none."""
    pairs = []
    for name, value in head.headers:
        if name.lower() != "cookie":
            continue
        for pair in value.split(";"):
            name, sep, _ = (pair := pair.strip()).partition("=")
            if sep and name.startswith(name_prefix) and len(name) > len(name_prefix):
                pairs.append(pair[len(name_prefix) :])
    return "; ".join(pairs) or None


def scoped_set_cookie(value: str, prefix: str, name_prefix: str) -> str | None:
    """Pure: a `Set-Cookie` value of the app as the visitor's browser receives it: the name under
    `name_prefix` (`app_cookie_prefix`), no `Domain` (so it stays on the preview's own host, never a parent
    domain other previews or the API share), and its `Path` under the preview's `prefix`
    (`/{token}` in path mode, where previews share one origin: another preview's pages and
    the API's paths are never sent it). None for a value that names no cookie (dropped)."""
    first, *attributes = value.split(";")
    name, sep, cookie_value = first.strip().partition("=")
    if not sep or not name.strip() or smuggles(value.encode("latin-1", "replace")):
        return None
    path = "/"
    kept = []
    for attribute in attributes:
        key, _, attr_value = attribute.strip().partition("=")
        if key.strip().lower() == "path":
            path = attr_value.strip() if attr_value.strip().startswith("/") else "/"
        elif key.strip().lower() != "domain" and attribute.strip():
            kept.append(attribute.strip())
    return "; ".join([f"{name_prefix}{name.strip()}={cookie_value.strip()}", f"Path={prefix}{path}", *kept])


def scoped_response_head(raw: bytes, prefix: str, name_prefix: str) -> bytes | None:
    """Pure: a response head of the app (without its final blank line) with each `Set-Cookie`
    scoped to the preview (`scoped_set_cookie`); every other line as the app sent it. None for
    a head another reader would split or join differently (a bare CR, LF or NUL, a folded
    line): a browser could find a `Set-Cookie` there that this reading never saw."""
    lines = []
    for line in raw.split(b"\r\n"):
        if smuggles(line):
            return None
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"set-cookie":
            scoped = scoped_set_cookie(value.decode("latin-1").strip(), prefix, name_prefix)
            if scoped is None:
                continue
            line = b"Set-Cookie: " + scoped.encode("latin-1")
        lines.append(line)
    return b"\r\n".join(lines)


def interim_status(raw: bytes) -> bool:
    """Pure: whether a response head is an interim one (1xx, other than 101 Switching Protocols)
    after which the app sends another head."""
    parts = raw.split(b"\r\n", 1)[0].split(b" ", 2)
    return len(parts) >= 2 and parts[1].startswith(b"1") and len(parts[1]) == 3 and parts[1] != b"101"


def upstream_head(head: RequestHead, path: str, *, port: int, visitor_ip: str, public_host: str | None,
                  scheme: str, prefix: str, cookie_prefix: str) -> bytes:  # fmt: skip
    """Pure: the head the app in the sandbox receives: its own path, `Host` as it listens
    (localhost:{port}), `X-Forwarded-*` saying where the visitor came from, and none of the
    API's credentials (`Authorization`; of the cookies only the app's own, `app_cookies`). One
    request per connection: `Connection: close`, unless the visitor asks to upgrade (a WebSocket), which is passed on."""
    connection = (head.header("connection") or "").lower()
    upgrade = head.header("upgrade")
    upgrading = upgrade is not None and "upgrade" in [t.strip() for t in connection.split(",")]
    lines = [f"{head.method} {path} HTTP/1.1", f"Host: localhost:{port}"]
    lines += [f"{name}: {value}" for name, value in head.headers if name.lower() not in DROPPED_HEADERS]
    if (cookies := app_cookies(head, cookie_prefix)) is not None:
        lines.append(f"Cookie: {cookies}")
    lines.append("Connection: Upgrade" if upgrading else "Connection: close")
    lines.append(f"X-Forwarded-For: {visitor_ip}")
    lines.append(f"X-Forwarded-Proto: {scheme}")
    if public_host:
        lines.append(f"X-Forwarded-Host: {public_host}")
    if prefix:
        lines.append(f"X-Forwarded-Prefix: {prefix}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def plain_answer(status: int, reason: str, message: str, *, extra: dict[str, str] | None = None) -> bytes:
    """A short text answer of the preview listener itself (never cached, never framed)."""
    body = (message + "\n").encode()
    headers = {
        "Content-Type": "text/plain; charset=utf-8", "Content-Length": str(len(body)), "Connection": "close",
        "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", **(extra or {}),
    }  # fmt: skip
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode("latin-1") + body


def utc_day(now: datetime) -> str:
    return now.astimezone(timezone.utc).strftime("%Y-%m-%d")
