"""Files from the chat into the sandbox (issue 14 item 6): `PUT /v1/runs/{run_id}/files/incoming/{name}`.

Real agents, real sandbox uids (as root), real files. The attacks are made the way a hostile
sandbox would: through the run's own `shell`, before the bot uploads."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import pytest

from mounts.layout import GroupRef
from orchestrator.errors import InvalidInput
from orchestrator.users.incoming import candidate_names, upload_name
from tests.agent_env import Served, serving, traversable_tmp  # noqa: F401 - a fixture
from tests.api_calls import MEMBER, OWNER, group_session, start_run, tool
from tests.conftest import make_settings
from tests.orchestrator.sandboxes.test_concurrent_output import UID_BLOCK

AS_ROOT = os.geteuid() == 0
CAP = 6 * 1024 * 1024  # above the 4 MiB body cap of routes without their own


@pytest.fixture
def served(traversable_tmp: Path) -> Iterator[Served]:
    data = traversable_tmp / "data"
    data.mkdir()
    with serving(make_settings(data, upload_max_bytes=CAP, **UID_BLOCK)) as pair:
        yield pair


@pytest.fixture
def outside(traversable_tmp: Path) -> Path:
    """A root-owned directory outside the data dir with a file the attacks aim at."""
    path = traversable_tmp / "outside"
    path.mkdir()
    (path / "passwd").write_text("root:x:0:0\n")
    os.chmod(path, 0o777)  # so that only the orchestrator's refusal keeps an upload out of it
    return path


def member_run(client) -> dict:  # type: ignore[no-untyped-def]
    return start_run(client, group_session(client), trigger="group_message", speaker_user_id=MEMBER)


def planted_run(served: Served, command: str) -> tuple[dict, Path]:
    """A member's run whose own shell ran `command` (with {incoming} filled in): the attack."""
    client, service = served
    run = member_run(client)
    incoming = service.layout.incoming_dir(MEMBER, run["session_id"])
    planted = tool(client, run["run_id"], "shell", command=command.format(incoming=incoming))
    assert planted["ok"] and planted["result"]["exit_code"] == 0, planted
    return run, incoming


def put(client, run_id: str, name: str, data: bytes, **params: str):  # type: ignore[no-untyped-def]
    return client.put(f"/v1/runs/{run_id}/files/incoming/{quote(name, safe='')}", content=data, params=params)


def test_item6_an_upload_lands_in_the_runtime_users_incoming_dir(served: Served) -> None:
    client, service = served
    run = member_run(client)
    data = os.urandom(5 * 1024 * 1024)
    answer = put(client, run["run_id"], "photo 1.png", data)
    assert answer.status_code == 201, answer.text
    body = answer.json()
    incoming = service.layout.incoming_dir(MEMBER, run["session_id"])
    assert body["path"] == str(incoming / "photo 1.png") and body["size"] == len(data) and body["scope"] == "personal"
    st = os.stat(body["path"])
    assert stat.S_IMODE(st.st_mode) == 0o600
    if AS_ROOT:
        assert st.st_uid == service.directories.sandbox_uid(MEMBER)
    # the model reads it with its own tools, in its own sandbox
    read = tool(client, run["run_id"], "shell", command=f"sha256sum '{body['path']}'")
    assert read["result"]["stdout"].split()[0] == hashlib.sha256(data).hexdigest(), read
    again = put(client, run["run_id"], "photo 1.png", b"second")
    assert again.status_code == 201 and again.json()["path"] == str(incoming / "photo 1-2.png")
    assert Path(body["path"]).read_bytes() == data  # never overwritten


def test_item6_too_large_is_413_and_leaves_nothing(served: Served) -> None:
    client, service = served
    run = member_run(client)
    incoming = service.layout.incoming_dir(MEMBER, run["session_id"])
    declared = put(client, run["run_id"], "big.bin", b"x" * (CAP + 1))
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "payload_too_large", declared.text

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap is counted while streaming
        for _ in range(CAP // 65536 + 2):
            yield b"y" * 65536

    streamed = client.put(f"/v1/runs/{run['run_id']}/files/incoming/big.bin", content=chunks())
    assert streamed.status_code == 413, streamed.text
    assert list(incoming.iterdir()) == []


@pytest.mark.parametrize("name", ["a\x01b", "a\nb", ".hidden", "x" * 201, "é" * 101, "a\\b", "a\u202eb"])
def test_item6_bad_names_are_422(served: Served, name: str) -> None:
    client, service = served
    run = member_run(client)
    answer = put(client, run["run_id"], name, b"data")
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"
    assert list(service.layout.incoming_dir(MEMBER, run["session_id"]).iterdir()) == []


def test_item6_an_ended_run_refuses_uploads(served: Served) -> None:
    client, _ = served
    run = member_run(client)
    assert client.post(f"/v1/runs/{run['run_id']}/end", json={"status": "succeeded"}).status_code == 200
    answer = put(client, run["run_id"], "late.txt", b"late")
    assert answer.status_code == 409 and "ended" in answer.json()["error"]["message"], answer.text


@pytest.mark.skipif(not AS_ROOT, reason="the host writes as root only when it runs as root")
def test_item6_a_planted_symlink_at_the_name_is_not_followed(served: Served, outside: Path) -> None:
    run, incoming = planted_run(served, f"ln -s {outside}/passwd {{incoming}}/x")
    answer = put(served[0], run["run_id"], "x", b"attacker-chosen bytes\n")
    assert answer.status_code == 201, answer.text
    assert answer.json()["path"] == str(incoming / "x-2")
    assert (outside / "passwd").read_text() == "root:x:0:0\n"
    assert os.readlink(incoming / "x") == f"{outside}/passwd"


@pytest.mark.skipif(not AS_ROOT, reason="the host writes as root only when it runs as root")
def test_item6_an_incoming_dir_replaced_by_a_symlink_is_refused(served: Served, outside: Path) -> None:
    run, _ = planted_run(served, f"rmdir {{incoming}} && ln -s {outside} {{incoming}}")
    answer = put(served[0], run["run_id"], "y.txt", b"attacker-chosen bytes\n")
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "unsafe_directory", answer.text
    assert sorted(p.name for p in outside.iterdir()) == ["passwd"]


def test_item6_group_scope_goes_to_the_chats_files_readable_by_members(served: Served) -> None:
    client, service = served
    run = member_run(client)
    answer = put(client, run["run_id"], "minutes.txt", b"the team's minutes\n", scope="group")
    assert answer.status_code == 201, answer.text
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    workspace = service.layout.group_dir(GroupRef("feishu", "oc_team"))
    assert answer.json()["path"] == str(workspace / "chat-files" / day / "minutes.txt")
    read = tool(client, run["run_id"], "read_file", path=answer.json()["path"])
    assert read["ok"] and read["result"]["content"] == "the team's minutes\n", read
    owner_run = start_run(client, run["session_id"], trigger="group_message", speaker_user_id=OWNER)
    assert tool(client, owner_run["run_id"], "read_file", path=answer.json()["path"])["ok"]
    if AS_ROOT:  # the chat's files: no member changes or removes them
        changed = tool(client, run["run_id"], "shell", command=f"rm -f {answer.json()['path']}; echo x >> {answer.json()['path']}")
        assert Path(answer.json()["path"]).read_bytes() == b"the team's minutes\n", changed
        st = os.stat(workspace / "chat-files")
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o2750)


# A member's shell squats `chat-files` before the chat's first group upload: a directory of its
# own (holding a date directory that links outside), a symlink out of the data dir, a plain file.
SQUATS = {
    "directory": "mkdir -p {ws}/chat-files && ln -s {outside} {ws}/chat-files/{day}",
    "symlink": "ln -s {outside} {ws}/chat-files",
    "file": "echo mine > {ws}/chat-files",
}


@pytest.mark.skipif(not AS_ROOT, reason="members squat names only where root owns the rest")
@pytest.mark.parametrize("squat", sorted(SQUATS))
def test_a_member_squatting_chat_files_is_moved_aside_and_the_upload_lands(
    served: Served, outside: Path, squat: str
) -> None:
    client, service = served
    run = member_run(client)
    workspace = service.layout.group_dir(GroupRef("feishu", "oc_team"))
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    command = SQUATS[squat].format(ws=workspace, outside=outside, day=day)
    planted = tool(client, run["run_id"], "shell", command=command)
    assert planted["ok"] and planted["result"]["exit_code"] == 0, planted
    answer = put(client, run["run_id"], "z.txt", b"the chat's bytes", scope="group")
    assert answer.status_code == 201, answer.text
    path = Path(answer.json()["path"])
    assert path == workspace / "chat-files" / day / "z.txt"
    # nothing went through the planted link; the real directory is the host's own
    assert sorted(p.name for p in outside.iterdir()) == ["passwd"]
    st = os.lstat(workspace / "chat-files")
    assert stat.S_ISDIR(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o2750)
    assert os.lstat(path.parent).st_uid == 0 and path.read_bytes() == b"the chat's bytes"
    # the squatter still sees what it planted, under a quarantine name, and can remove it
    aside = [p for p in workspace.iterdir() if p.name.startswith("chat-files.planted-")]
    assert len(aside) == 1 and os.lstat(aside[0]).st_uid == service.directories.sandbox_uid(MEMBER), aside
    listed = tool(client, run["run_id"], "shell", command=f"ls -a {workspace}")
    assert aside[0].name in listed["result"]["stdout"], listed
    # every member reads the upload: the speaker and the owner
    assert tool(client, run["run_id"], "read_file", path=str(path))["result"]["content"] == "the chat's bytes"
    owner_run = start_run(client, run["session_id"], trigger="group_message", speaker_user_id=OWNER)
    assert tool(client, owner_run["run_id"], "read_file", path=str(path))["result"]["content"] == "the chat's bytes"
    removed = tool(client, run["run_id"], "shell", command=f"rm -rf {aside[0]}")
    assert removed["ok"] and removed["result"]["exit_code"] == 0 and not os.path.lexists(aside[0]), removed


def test_item6_group_scope_needs_a_group_session(served: Served) -> None:
    client, _ = served
    created = client.post("/v1/sessions", json={"owner_user_id": OWNER, "channel": "web"})
    assert created.status_code == 201, created.text
    run = start_run(client, created.json()["session_id"], trigger="web")
    answer = put(client, run["run_id"], "a.txt", b"x", scope="group")
    assert answer.status_code == 422 and answer.json()["error"]["field"] == "scope", answer.text


def test_upload_names() -> None:
    for bad in ["", ".", "..", ".x", "a/b", "a\\b", "a\x00b", "a\tb", "\u202e", "x" * 201, "\ud800"]:
        with pytest.raises(InvalidInput):
            upload_name(bad)
    assert upload_name("Résumé 2026 (final).pdf") == "Résumé 2026 (final).pdf"
    assert candidate_names("a.tar.gz")[:3] == ["a.tar.gz", "a.tar-2.gz", "a.tar-3.gz"]
    assert candidate_names("README")[1] == "README-2"


def test_item6_write_bytes_writes_binary_content_with_write_files_path_rules(served: Served) -> None:
    import base64

    client, service = served
    run = member_run(client)
    data = bytes(range(256)) * 64
    written = tool(client, run["run_id"], "write_bytes", path="out/blob.bin", content_base64=base64.b64encode(data).decode())
    assert written["ok"] and written["result"]["bytes_written"] == len(data), written
    assert (Path(run["workdir"]) / "out" / "blob.bin").read_bytes() == data
    bad = tool(client, run["run_id"], "write_bytes", path="x.bin", content_base64="not base64!")
    assert bad["ok"] is False and bad["error"]["code"] == "invalid_arguments", bad
    outside = tool(client, run["run_id"], "write_bytes", path="/etc/x.bin", content_base64="AAAA")
    assert outside["ok"] is False, outside
    listed = client.get("/v1/tools").json()
    assert any(t["name"] == "write_bytes" for t in (listed["tools"] if isinstance(listed, dict) else listed))


def _read_answer(sock: socket.socket) -> str:
    """A whole HTTP answer: its head and as many body bytes as its Content-Length says (the
    server may write them in separate pieces)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        piece = sock.recv(65536)
        if not piece:
            return raw.decode(errors="replace")
        raw += piece
    head, _, body = raw.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(body) < length:
        piece = sock.recv(65536)
        if not piece:
            break
        body += piece
    return (head + b"\r\n\r\n" + body).decode(errors="replace")


def test_item6_a_stalled_upload_is_408_and_leaves_nothing(traversable_tmp: Path) -> None:
    """Over a real socket: the upload is streamed past the request guard, which still bounds it."""
    from orchestrator.http.app import create_app
    from tests.conftest import API_TOKEN
    from tests.live_server import live_server

    data = traversable_tmp / "data"
    data.mkdir()
    with serving(make_settings(data, http_body_stall_s=0.5, **UID_BLOCK)) as (client, service):
        run = member_run(client)
        with live_server(create_app(service)) as url:
            host, port = url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                head = (
                    f"PUT /v1/runs/{run['run_id']}/files/incoming/slow.bin HTTP/1.1\r\nHost: {host}\r\n"
                    f"Authorization: Bearer {API_TOKEN}\r\nContent-Length: 100000\r\n\r\n"
                )
                sock.sendall(head.encode() + b"x" * 1000)  # then nothing: a stalled client
                answer = _read_answer(sock)
        assert answer.startswith("HTTP/1.1 408"), answer
        assert "request_timeout" in answer
        assert list(service.layout.incoming_dir(MEMBER, run["session_id"]).iterdir()) == []


@pytest.mark.skipif(not AS_ROOT, reason="the host writes as root only when it runs as root")
def test_a_directory_planted_at_the_temporary_name_neither_leaks_an_fd_nor_turns_the_refusal_into_500(
    traversable_tmp: Path,
) -> None:
    """The sandbox owns incoming/, so it sees the upload's temporary name while the body streams:
    its shell moves the temporary file away and makes a directory there. The refusal (413 here)
    must stay the refusal, and the host must not keep the directory's fd open (a leak per upload
    is a sandbox exhausting the server's descriptors)."""
    import threading

    import httpx

    from orchestrator.http.app import create_app
    from tests.conftest import API_TOKEN
    from tests.live_server import live_server

    data = traversable_tmp / "data"
    data.mkdir()
    cap = 256 * 1024
    with serving(make_settings(data, upload_max_bytes=cap, **UID_BLOCK)) as (client, service):
        run = member_run(client)
        incoming = service.layout.incoming_dir(MEMBER, run["session_id"])
        swapped: dict = {}
        attack = (
            f"cd {incoming} && for i in $(seq 400); do t=$(ls -A | grep '^[.]upload-' | head -1); "
            '[ -n "$t" ] && break; sleep 0.05; done; mv "$t" stolen && mkdir "$t" && echo swapped'
        )
        shell = threading.Thread(target=lambda: swapped.update(tool(client, run["run_id"], "shell", command=attack)))
        with live_server(create_app(service)) as url:

            def body() -> Iterator[bytes]:
                yield b"a" * 65536
                shell.join(timeout=60)  # the sandbox swaps the temporary file for a directory now
                for _ in range(cap // 65536 + 2):
                    yield b"b" * 65536

            shell.start()
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=60) as http:
                answer = http.put(f"/v1/runs/{run['run_id']}/files/incoming/big.bin", content=body())
            assert swapped["result"]["stdout"].strip() == "swapped", swapped
            assert _fds_on(incoming) == [], "the upload left the incoming directory's descriptor open"
            assert answer.status_code == 413 and answer.json()["error"]["code"] == "payload_too_large", answer.text


def _fds_on(path: Path) -> list[str]:
    """This process's descriptors open on `path` (the server runs in the test's process)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                found.append(fd)
        except FileNotFoundError:
            pass
    return found


FILL_BYTES = "dd if=/dev/zero of={incoming}/fill bs=64k 2>&1"
FILL_INODES = "for i in $(seq 100); do touch {incoming}/f$i 2>&1 || break; done; dd if=/dev/zero of={incoming}/f1 bs=64k 2>&1"


@pytest.mark.skipif(not AS_ROOT, reason="mounting a small filesystem needs root")
@pytest.mark.parametrize("fill", [FILL_BYTES, FILL_INODES], ids=["bytes", "inodes"])
def test_a_disk_the_sandbox_filled_is_a_structured_507_and_leaves_no_temporary_file(served: Served, fill: str) -> None:
    """The sandbox's shell fills the filesystem its incoming/ is on (a small one of its own
    here, so that the state database keeps its room); the upload then is a clear refusal,
    not an internal error, and the partial temporary file is gone."""
    import subprocess

    client, service = served
    run = member_run(client)
    incoming = service.layout.incoming_dir(MEMBER, run["session_id"])
    st = os.stat(incoming)
    options = f"size=2m,nr_inodes=8,uid={st.st_uid},gid={st.st_gid},mode=0700"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(incoming)], check=True)
    try:
        filled = tool(client, run["run_id"], "shell", command=fill.format(incoming=incoming))
        assert "No space left" in filled["result"]["stdout"], filled
        planted = sorted(p.name for p in incoming.iterdir())
        answer = put(client, run["run_id"], "report.pdf", os.urandom(1024 * 1024))
        assert answer.status_code == 507 and answer.json()["error"]["code"] == "insufficient_storage", answer.text
        assert sorted(p.name for p in incoming.iterdir()) == planted
    finally:
        subprocess.run(["umount", "-l", str(incoming)], check=False)


def test_a_slow_big_upload_does_not_delay_other_callers(traversable_tmp: Path) -> None:
    """A 48 MiB upload trickling in over a real socket: /healthz and another user's tool call
    keep answering at once (the body is written a network chunk at a time, the fsync and
    rename in a worker thread)."""
    import threading
    import time

    import httpx

    from orchestrator.http.app import create_app
    from tests.conftest import API_TOKEN
    from tests.live_server import live_server

    data = traversable_tmp / "data"
    data.mkdir()
    with serving(make_settings(data, upload_max_bytes=64 * 1024 * 1024, **UID_BLOCK)) as (client, service):
        run = member_run(client)
        other = start_run(client, client.post("/v1/sessions", json={"owner_user_id": OWNER, "channel": "web"}).json()["session_id"], trigger="web")
        # The other user's sandbox is started first: its cold start (seconds on a loaded host)
        # is not what this test measures, and it used to be the slowest "delay" seen.
        warm = client.post(f"/v1/runs/{other['run_id']}/tools/shell", json={"arguments": {"command": "true"}})
        assert warm.status_code == 200 and warm.json()["ok"], warm.text
        answers: dict = {}
        with live_server(create_app(service)) as url:
            auth = {"Authorization": f"Bearer {API_TOKEN}"}

            def body() -> Iterator[bytes]:
                for i in range(48):
                    yield os.urandom(1024 * 1024)
                    if i % 4 == 0:
                        time.sleep(0.1)

            def upload() -> None:
                with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
                    answers["upload"] = http.put(f"/v1/runs/{run['run_id']}/files/incoming/big.bin", content=body())

            def round_trip(http: httpx.Client) -> float:
                started = time.monotonic()
                assert http.get("/healthz").status_code == 200
                called = http.post(f"/v1/runs/{other['run_id']}/tools/shell", json={"arguments": {"command": "true"}})
                assert called.status_code == 200 and called.json()["ok"], called.text
                return time.monotonic() - started

            with httpx.Client(base_url=url, headers=auth, timeout=30) as http:
                # What a round trip costs on this host right now, with no upload: a loaded
                # machine is slow for everyone, and that is not a delay behind the upload.
                usual = max(round_trip(http) for _ in range(5))
                uploading = threading.Thread(target=upload)
                uploading.start()
                slowest = 0.0
                while uploading.is_alive():
                    slowest = max(slowest, round_trip(http))
            uploading.join()
        assert answers["upload"].status_code == 201, answers["upload"].text
        allowed = max(1.0, 5 * usual)
        assert slowest < allowed, f"another caller waited {slowest:.2f} s behind the upload (usual {usual:.2f} s)"
