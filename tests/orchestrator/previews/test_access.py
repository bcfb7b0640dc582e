"""The access cookie's pure decisions and its signing key file."""

from __future__ import annotations

import os
import stat
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from orchestrator.previews.access import AccessCookie, cookie_name, load_or_create_key, split_key
from orchestrator.previews.model import PreviewRecord, parse_head
from tests.conftest import TEST_ROOT

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
RECORD = PreviewRecord("pv_1", "t" * 32, 67, "run", "session", 8000, NOW.isoformat(), (NOW + timedelta(hours=1)).isoformat())


def test_the_key_is_taken_out_of_the_apps_path() -> None:
    assert split_key("/a?preview_key=k") == ("/a", "k")
    assert split_key("/a?x=1&preview_key=k&y=a%2Fb") == ("/a?x=1&y=a/b", "k")
    assert split_key("/a?x=1") == ("/a?x=1", None) and split_key("/a") == ("/a", None)


def test_a_link_mints_a_cookie_only_while_its_key_is_good_and_only_for_its_preview() -> None:
    access = AccessCookie(key=b"k" * 32, link_s=60, secure=True)
    url = access.link("https://p.example/" + "t" * 32 + "/", RECORD, NOW)
    key = url.split("preview_key=", 1)[1]
    admission, path = access.admit(RECORD, parse_head(b"GET / HTTP/1.1"), f"/x?preview_key={key}", "/tok", NOW)
    assert admission.status == 303 and admission.location == "/tok/x" and path == "/x"
    assert "; Secure" in admission.set_cookie and admission.set_cookie.startswith(cookie_name(RECORD) + "=")
    cookie = admission.set_cookie.split(";", 1)[0]
    with_cookie = parse_head(f"GET / HTTP/1.1\r\nCookie: a=b; {cookie}".encode())
    assert access.admit(RECORD, with_cookie, "/x", "/tok", NOW + timedelta(minutes=59))[0].allowed
    assert not access.admit(RECORD, with_cookie, "/x", "/tok", NOW + timedelta(hours=1))[0].allowed  # the preview ended
    late, _ = access.admit(RECORD, parse_head(b"GET / HTTP/1.1"), f"/?preview_key={key}", "", NOW + timedelta(seconds=61))
    assert late.status == 403
    other = PreviewRecord(**{**RECORD.__dict__, "preview_id": "pv_2", "token": "u" * 32})
    assert cookie_name(other) != cookie_name(RECORD)
    stolen = parse_head(f"GET / HTTP/1.1\r\nCookie: {cookie_name(other)}={cookie.split('=', 1)[1]}".encode())
    assert access.admit(other, stolen, "/", "", NOW)[0].status == 403
    assert AccessCookie(key=b"j" * 32, link_s=60, secure=True).admit(RECORD, with_cookie, "/", "", NOW)[0].status == 403


def test_the_signing_key_is_made_once_private_and_kept() -> None:
    with tempfile.TemporaryDirectory(dir=TEST_ROOT, prefix="preview-key-") as directory:
        _key_file_checks(Path(directory))


def _key_file_checks(tmp_path: Path) -> None:
    path = tmp_path / "preview-access.key"
    key = load_or_create_key(path)
    assert len(key) == 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_or_create_key(path) == key
    path.write_bytes(b"short")
    with pytest.raises(ValueError):
        load_or_create_key(path)
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(OSError):
        load_or_create_key(link)
