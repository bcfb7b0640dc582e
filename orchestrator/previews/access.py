"""The signed access cookie of previews (docs/previews.md, "A cookie instead of the link"): with
ORCH_PREVIEW_COOKIE_LINK_S set, a link carries a key (`?preview_key=`) that is good for that
many seconds after the link was handed out; a visit with a good key gets an HttpOnly cookie,
signed with a key only the host holds and good until the preview ends, and is redirected to
the same URL without the key. Any other request without that cookie is refused (403). So a
link posted in a chat lets those who open it in time in, and is of no use when it turns up
elsewhere later; the API hands out a fresh one on demand (`GET /v1/previews/{id}`).

The decisions are pure (the key is passed in); `load_or_create_key` is the one side effect."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode

from orchestrator.previews.model import PreviewRecord, RequestHead

KEY_PARAM = "preview_key"
COOKIE_PREFIX = "preview_access_"  # never an app's prefix (model.app_cookie_prefix): never passed to the app
KEY_BYTES = 32


def load_or_create_key(path: Path) -> bytes:
    """The host's signing key, made once (0600, the orchestrator's own) and kept across restarts,
    so cookies already handed out stay good."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            key = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
        if len(key) != KEY_BYTES:
            raise ValueError(f"{path} is not a preview signing key ({KEY_BYTES} bytes)") from None
        return key
    key = secrets.token_bytes(KEY_BYTES)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


def _unix(moment: datetime) -> int:
    return int(moment.timestamp())


def _signature(key: bytes, purpose: str, preview_id: str, until: int) -> str:
    mac = hmac.new(key, f"{purpose}\n{preview_id}\n{until}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def _signed(key: bytes, purpose: str, preview_id: str, until: int) -> str:
    return f"{until}.{_signature(key, purpose, preview_id, until)}"


def _good(key: bytes, purpose: str, preview_id: str, value: str | None, now: datetime) -> bool:
    if not value:
        return False
    until, _, signature = value.partition(".")
    if not until.isdigit() or int(until) <= _unix(now):
        return False
    return hmac.compare_digest(signature, _signature(key, purpose, preview_id, int(until)))


def cookie_name(record: PreviewRecord) -> str:
    """One name per preview (in path mode every preview shares the host, and the cookie's path
    is `/`, so root-relative requests a preview page makes carry it too), from its token: no
    other preview's page can name it to overwrite it."""
    return COOKIE_PREFIX + hashlib.sha256(f"access\n{record.token}".encode()).hexdigest()[:16]


def split_key(path: str) -> tuple[str, str | None]:
    """Pure: (the app's path without `preview_key`, the key's value or None)."""
    route, sep, query = path.partition("?")
    if not sep:
        return path, None
    pairs = parse_qsl(query, keep_blank_values=True)
    key = next((value for name, value in pairs if name == KEY_PARAM), None)
    if key is None:
        return path, None
    rest = urlencode([(name, value) for name, value in pairs if name != KEY_PARAM], quote_via=quote, safe="/")
    return (f"{route}?{rest}" if rest else route), key


def _request_cookie(head: RequestHead, name: str) -> str | None:
    for header, value in head.headers:
        if header.lower() == "cookie":
            for pair in value.split(";"):
                key, sep, cookie_value = pair.strip().partition("=")
                if sep and key == name:
                    return cookie_value
    return None


@dataclass(frozen=True)
class Admission:
    """What the listener does with a request under the access cookie: relay it (`allowed`), or
    answer it itself: `status` 303 (the cookie minted: `location`, `set_cookie`) or 403."""

    allowed: bool
    status: int = 0
    location: str = ""
    set_cookie: str = ""
    message: str = ""


@dataclass(frozen=True)
class AccessCookie:
    key: bytes
    link_s: int
    secure: bool  # the public origin is https: the cookie is sent over it only

    def link(self, url: str, record: PreviewRecord, now: datetime) -> str:
        """The preview's URL with a key good for `link_s` from `now` (never past the preview's end)."""
        until = min(_unix(now) + self.link_s, _unix(datetime.fromisoformat(record.expires_at)))
        return f"{url}?{KEY_PARAM}={_signed(self.key, 'link', record.preview_id, until)}"

    def admit(self, record: PreviewRecord, head: RequestHead, path: str, prefix: str, now: datetime) -> tuple[Admission, str]:
        """Pure: the admission of a request for `path` (the app's) of the preview, and the path
        to relay (without the key)."""
        clean, key = split_key(path)
        if key is not None:
            if not _good(self.key, "link", record.preview_id, key, now):
                return Admission(False, 403, message="This preview link has expired: ask for a new one."), clean
            ends = _unix(datetime.fromisoformat(record.expires_at))
            value = _signed(self.key, "cookie", record.preview_id, ends)
            attributes = f"Path=/; Max-Age={max(ends - _unix(now), 1)}; HttpOnly; SameSite=Lax" + ("; Secure" if self.secure else "")
            cookie = f"{cookie_name(record)}={value}; {attributes}"
            return Admission(False, 303, location=f"{prefix}{clean}", set_cookie=cookie), clean
        if _good(self.key, "cookie", record.preview_id, _request_cookie(head, cookie_name(record)), now):
            return Admission(True), clean
        return Admission(False, 403, message="This preview needs its link opened first (or a new link)."), clean
