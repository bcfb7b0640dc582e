"""`GET /uploads/{uid}/{file}`: public (no token), and nothing outside `uploads/` is reachable
through it: encoded `..`, symlinks planted in uploads, FIFOs, other users' names."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.http.app import create_app
from orchestrator.deliveries.public_uploads import own_upload_ref, upload_ref
from orchestrator.service import OrchestratorService
from tests.conftest import make_settings
from tests.live_server import free_port, live_server, raw_get

SECRET = b"state secret, never public"


@pytest.fixture
def served(data_dir: Path) -> Iterator[tuple[str, OrchestratorService]]:
    port = free_port()
    service = OrchestratorService(make_settings(data_dir, public_base_url=f"http://127.0.0.1:{port}"))
    with live_server(create_app(service), port) as base:
        yield base, service


def put_upload(service: OrchestratorService, user_id: int, name: str, data: bytes) -> Path:
    """An upload as publish_artifact leaves it: the user's file, its name recorded."""
    directory = service.directories.ensure_uploads(user_id)
    path = directory / name
    path.write_bytes(data)
    if service.directories.chown:
        os.chown(path, service.directories.sandbox_uid(user_id), service.directories.sandbox_uid(user_id))
    ref = upload_ref(user_id, name)
    if ref is not None:  # a name no upload can have (".hidden") is only on disk
        service.uploads.record(ref)
    return path


def test_an_upload_is_served_without_a_token_with_safe_headers(served) -> None:
    base, service = served
    put_upload(service, 17, "3f2a.png", b"\x89PNG\r\n\x1a\nimage")
    response = httpx.get(f"{base}/uploads/17/3f2a.png")
    assert response.status_code == 200
    assert response.content == b"\x89PNG\r\n\x1a\nimage"
    assert response.headers["content-type"] == "image/png"
    assert response.headers["content-disposition"].startswith("inline")
    assert response.headers["x-content-type-options"] == "nosniff"
    head = httpx.head(f"{base}/uploads/17/3f2a.png")
    assert head.status_code == 200 and head.headers["content-length"] == str(len(b"\x89PNG\r\n\x1a\nimage"))
    assert head.content == b""


def test_html_and_svg_are_attachments_in_a_sandboxed_context(served) -> None:
    base, service = served
    put_upload(service, 17, "page.html", b"<script>alert(1)</script>")
    put_upload(service, 17, "pic.svg", b"<svg onload='alert(1)'/>")
    for name in ("page.html", "pic.svg"):
        response = httpx.get(f"{base}/uploads/17/{name}")
        assert response.status_code == 200
        assert response.headers["content-disposition"].startswith("attachment")
        assert "sandbox" in response.headers["content-security-policy"]


@pytest.mark.parametrize(
    "target",
    [
        "/uploads/17/../../state/orchestrator.sqlite3",
        "/uploads/17/..%2F..%2Fstate%2Forchestrator.sqlite3",
        "/uploads/17/%2e%2e%2f%2e%2e%2fstate%2forchestrator.sqlite3",
        "/uploads/17/%2E%2E",
        "/uploads/%2e%2e/state",
        "/uploads/..%2fstate/orchestrator.sqlite3",
        "/uploads/17/.%2e/.%2e/state/orchestrator.sqlite3",
        "/uploads/17/..%5c..%5cstate%5corchestrator.sqlite3",
        "/uploads/17/%252e%252e%252fsecret",
        "/uploads/17//etc/passwd",
        "/uploads/17/%2fetc%2fpasswd",
        "/uploads/17/secret%00.png",
        "/uploads/017/3f2a.png",
        "/uploads/-17/3f2a.png",
        "/uploads/0/3f2a.png",
        "/uploads/99999999999999999999/3f2a.png",
        "/uploads/17/.hidden",
        "/uploads/17",
        "/uploads/17/",
        "/uploads/",
    ],
)
def test_traversal_and_malformed_names_never_leave_uploads(served, target: str) -> None:
    base, service = served
    put_upload(service, 17, "3f2a.png", b"png")
    put_upload(service, 17, ".hidden", SECRET)
    (service.layout.state_dir / "secret").write_bytes(SECRET)
    status, body = raw_get(base, target)
    assert status in (400, 404), (target, status)
    assert SECRET not in body
    assert b"SQLite format" not in body


def test_symlinks_planted_in_uploads_are_not_followed(served, tmp_path: Path) -> None:
    base, service = served
    outside = tmp_path / "outside.txt"
    outside.write_bytes(SECRET)
    other = put_upload(service, 2, "theirs.png", SECRET)
    mine = service.directories.ensure_uploads(1)
    os.symlink(outside, mine / "abs.txt")
    os.symlink("../2/theirs.png", mine / "rel.png")
    os.symlink(service.layout.state_db, mine / "db.png")
    os.symlink(str(other), mine / "other.png")
    # a whole user directory swapped for a link to another user's
    os.symlink(service.layout.uploads_dir(2), service.layout.uploads_root / "3")
    for target in ("/uploads/1/abs.txt", "/uploads/1/rel.png", "/uploads/1/db.png", "/uploads/1/other.png", "/uploads/3/theirs.png"):
        status, body = raw_get(base, target)
        assert status == 404, target
        assert SECRET not in body
    assert httpx.get(f"{base}/uploads/2/theirs.png").content == SECRET  # the real owner's URL works


def test_a_fifo_a_directory_and_another_users_name_are_plain_not_found(served) -> None:
    base, service = served
    mine = service.directories.ensure_uploads(1)
    os.mkfifo(mine / "pipe.png")
    (mine / "dir.png").mkdir()
    put_upload(service, 2, "only-2.png", b"two")
    for target in ("/uploads/1/pipe.png", "/uploads/1/dir.png", "/uploads/1/only-2.png", "/uploads/5/x.png"):
        response = httpx.get(f"{base}{target}", timeout=10)
        assert response.status_code == 404, target
        assert response.json()["error"]["code"] == "not_found"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own a file as another uid")
def test_a_hard_link_to_a_file_the_user_does_not_own_is_not_served(served) -> None:
    base, service = served
    mine = service.directories.ensure_uploads(1)
    theirs = put_upload(service, 2, "theirs.bin", SECRET)
    os.chown(theirs, service.directories.sandbox_uid(2), service.directories.sandbox_uid(2))
    service.uploads.record(upload_ref(1, "linked.bin"))  # even under a published name
    os.link(theirs, mine / "linked.bin")
    assert raw_get(base, "/uploads/1/linked.bin")[0] == 404
    # a file with a second link is not served at all, not even to its owner's URL
    assert raw_get(base, "/uploads/2/theirs.bin")[0] == 404
    os.unlink(mine / "linked.bin")
    assert httpx.get(f"{base}/uploads/2/theirs.bin").content == SECRET


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own a file as another uid")
def test_item10_unpublished_and_root_owned_files_are_not_served(served) -> None:
    base, service = served
    mine = service.directories.ensure_uploads(1)
    (mine / "secret.txt").write_bytes(SECRET)  # a name nobody published
    os.chown(mine / "secret.txt", service.directories.sandbox_uid(1), service.directories.sandbox_uid(1))
    assert raw_get(base, "/uploads/1/secret.txt")[0] == 404
    service.uploads.record(upload_ref(1, "root.txt"))
    (mine / "root.txt").write_bytes(SECRET)  # published name, but root's file
    assert raw_get(base, "/uploads/1/root.txt")[0] == 404
    service.uploads.record(upload_ref(1, "secret.txt"))
    assert httpx.get(f"{base}/uploads/1/secret.txt").content == SECRET


def test_own_upload_urls_are_recognized_only_for_this_origin() -> None:
    base = "https://bot.example.com/orch"
    assert own_upload_ref(f"{base}/uploads/17/a.png", base) == upload_ref(17, "a.png")
    assert own_upload_ref("HTTPS://BOT.example.com:443/orch/uploads/17/a.png?x=1#y", base) == upload_ref(17, "a.png")
    for url in [
        "https://bot.example.com:8443/orch/uploads/17/a.png",  # another port
        "http://bot.example.com/orch/uploads/17/a.png",  # another scheme
        "https://evil.example.com/orch/uploads/17/a.png",
        "https://bot.example.com/uploads/17/a.png",  # outside the base path
        f"{base}/uploads/17/..%2F..%2Fstate",
        f"{base}/uploads/17/sub/a.png",
        f"{base}/uploads/017/a.png",
        f"{base}/uploads/17/.env",
        f"{base}/v1/sessions",
    ]:
        assert own_upload_ref(url, base) is None, url
