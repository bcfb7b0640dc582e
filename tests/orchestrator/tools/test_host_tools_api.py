"""The runtime-scoped host tools through the HTTP API, against real process-backend agents:
the acceptance list of issue 6 (B speaks in A's group session)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.api_calls import MEMBER, OWNER, group_session, start_run, tool
from tests.conftest import admin_headers

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(40))


def write_bytes_in_sandbox(client: TestClient, run_id: str, name: str, data: bytes) -> None:
    escaped = "".join(f"\\x{b:02x}" for b in data)
    answer = tool(client, run_id, "shell", command=f"printf '{escaped}' > {name}")
    assert answer["ok"] and answer["result"]["exit_code"] == 0, answer


def fetch_delivery(client: TestClient, delivery_id: str) -> bytes:
    response = client.get(f"/v1/deliveries/{delivery_id}")
    assert response.status_code == 200, response.text
    return response.content


def test_member_in_owners_group_session_acceptance(agent_client: TestClient, agent_service: OrchestratorService) -> None:
    sid = group_session(agent_client)
    owner_run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=OWNER)
    write_bytes_in_sandbox(agent_client, owner_run["run_id"], "chart.png", PNG)
    published = tool(agent_client, owner_run["run_id"], "publish_artifact", path="chart.png")
    assert published["ok"], published
    upload_path, url = published["result"]["path"], published["result"]["url"]
    assert upload_path.startswith(f"{owner_run['upload_dir']}/") and upload_path.endswith(".png")
    assert url == f"http://testserver/uploads/{OWNER}/{Path(upload_path).name}"
    # publish_artifact, then GET of the URL: the same bytes without a token
    anonymous = TestClient(agent_client.app)  # not entered: the app's lifespan is agent_client's
    assert "authorization" not in anonymous.headers
    public = anonymous.get(url)
    assert public.status_code == 200 and public.content == PNG
    assert tool(agent_client, owner_run["run_id"], "write_file", path="notes.md", content="owner notes\n")["ok"]
    owner_runtime_file = f"{owner_run['workdir']}/notes.md"

    member_run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    run_id = member_run["run_id"]
    assert member_run["runtime_user_id"] == MEMBER
    # the container's read_file: the upload diagnostic, without a URL
    read = tool(agent_client, run_id, "read_file", path=upload_path)
    assert read["error"]["code"] == "foreign_upload_path"
    assert "http" not in read["error"]["message"]
    # the host's send_file of the same local path: the public URL, to pass instead
    sent = tool(agent_client, run_id, "send_file", path_or_url=upload_path)
    assert sent["ok"] is False
    assert sent["error"]["code"] == "foreign_upload_path"
    assert sent["error"]["url"] == url
    assert f"pass this URL to send_file instead: {url}" in sent["error"]["message"]
    assert f"current runtime identity {MEMBER}" in sent["error"]["message"]
    # ... and sending that URL succeeds: the delivery's bytes are the file's
    sent = tool(agent_client, run_id, "send_file", path_or_url=sent["error"]["url"])
    assert sent["ok"], sent
    assert fetch_delivery(agent_client, sent["result"]["delivery_id"]) == PNG
    assert sent["result"]["sha256"] == hashlib.sha256(PNG).hexdigest()
    image = tool(agent_client, run_id, "send_image", path_or_url=url)
    assert image["ok"] and image["result"]["media_type"] == "image/png"
    # another member's runtime file: no URL, ask the member or regenerate into the group workspace
    for name in ("send_file", "send_image"):
        refused = tool(agent_client, run_id, name, path_or_url=owner_runtime_file)
        assert refused["error"]["code"] == "foreign_runtime_path"
        assert "url" not in refused["error"] and "http" not in refused["error"]["message"]
        assert "group workspace" in refused["error"]["message"]
    # relative to the member's workdir, the same answers
    relative = tool(agent_client, run_id, "send_file", path_or_url=f"../../../uploads/{OWNER}/{Path(upload_path).name}")
    assert relative["error"]["url"] == url


def test_the_pre_check_answers_before_any_sandbox_is_asked(agent_client: TestClient, agent_service: OrchestratorService) -> None:
    sid = group_session(agent_client)
    member_run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    data = agent_service.layout.root
    for name in ("send_file", "send_image", "publish_artifact"):
        argument = "path" if name == "publish_artifact" else "path_or_url"
        upload = tool(agent_client, member_run["run_id"], name, **{argument: f"{data}/uploads/{OWNER}/x.png"})
        assert upload["error"]["code"] == "foreign_upload_path"
        assert upload["error"]["url"] == f"http://testserver/uploads/{OWNER}/x.png"
        runtime = tool(agent_client, member_run["run_id"], name, **{argument: f"{data}/runtime/{OWNER}/{sid}/a"})
        assert runtime["error"]["code"] == "foreign_runtime_path"
    # No sandbox was started for anybody: the answers came from the host alone.
    assert agent_service.sandboxes.status() == []


def test_own_files_are_read_by_the_runtime_users_sandbox(agent_client: TestClient, agent_data_dir: Path) -> None:
    sid = group_session(agent_client)
    run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    run_id = run["run_id"]
    write_bytes_in_sandbox(agent_client, run_id, "photo.png", PNG)
    assert tool(agent_client, run_id, "write_file", path="report.txt", content="numbers\n")["ok"]
    sent = tool(agent_client, run_id, "send_file", path_or_url="report.txt")
    assert sent["ok"], sent
    assert sent["result"]["file_name"] == "report.txt" and sent["result"]["media_type"] == "text/plain"
    assert sent["result"]["source"] == f"{run['workdir']}/report.txt"
    assert fetch_delivery(agent_client, sent["result"]["delivery_id"]) == b"numbers\n"
    image = tool(agent_client, run_id, "send_image", path_or_url="photo.png")
    assert image["ok"] and fetch_delivery(agent_client, image["result"]["delivery_id"]) == PNG
    # the content decides what an image is, not the name
    not_image = tool(agent_client, run_id, "send_image", path_or_url="report.txt")
    assert not_image["error"]["code"] == "not_an_image"
    assert tool(agent_client, run_id, "write_file", path="fake.png", content="<svg/>")["ok"]
    assert tool(agent_client, run_id, "send_image", path_or_url="fake.png")["error"]["code"] == "not_an_image"
    # the sandbox's PathSandbox still decides everything the host pre-check does not
    escape = tool(agent_client, run_id, "send_file", path_or_url="/etc/passwd")
    assert escape["error"]["code"] == "path_escape"
    missing = tool(agent_client, run_id, "send_file", path_or_url="nope.txt")
    assert missing["error"]["code"] == "not_found"
    assert tool(agent_client, run_id, "write_file", path="empty.txt", content="")["ok"]
    assert tool(agent_client, run_id, "send_file", path_or_url="empty.txt")["error"]["code"] == "empty_file"
    for bad in ("file:///etc/passwd", "ftp://example.com/x", "   "):
        assert tool(agent_client, run_id, "send_file", path_or_url=bad)["error"]["code"] == "invalid_arguments"
    listed = agent_client.get(f"/v1/runs/{run_id}/deliveries").json()["deliveries"]
    assert [d["tool"] for d in listed] == ["send_file", "send_image"]
    assert all(d["runtime_user_id"] == MEMBER and d["session_id"] == sid for d in listed)


def test_publish_artifact_copies_under_a_random_name_owned_by_the_runtime_user(
    agent_client: TestClient, agent_service: OrchestratorService
) -> None:
    sid = group_session(agent_client)
    run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    assert tool(agent_client, run["run_id"], "write_file", path="out/result.csv", content="a,b\n1,2\n")["ok"]
    first = tool(agent_client, run["run_id"], "publish_artifact", path="out/result.csv")["result"]
    second = tool(agent_client, run["run_id"], "publish_artifact", path="out/result.csv")["result"]
    assert first["path"] != second["path"]
    for result in (first, second):
        path = Path(result["path"])
        assert path.parent == agent_service.layout.uploads_dir(MEMBER)
        assert path.suffix == ".csv" and len(path.stem) == 32
        assert path.read_bytes() == b"a,b\n1,2\n"
        if os.geteuid() == 0:
            assert path.stat().st_uid == agent_service.directories.sandbox_uid(MEMBER)
    # the member's own sandbox can use what was published for it
    listed = tool(agent_client, run["run_id"], "read_file", path=first["path"])
    assert listed["ok"], listed
    assert tool(agent_client, run["run_id"], "publish_artifact", path="https://example.com/x")["error"]["code"] == "invalid_arguments"


def test_dump_user_messages_is_readable_by_the_same_runtime_user_only(agent_client: TestClient) -> None:
    sid = group_session(agent_client)
    messages = [
        {"role": "user", "content": "please chart the sales", "speaker_user_id": OWNER},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "make it blue 蓝色", "speaker_user_id": MEMBER},
    ]
    assert agent_client.post(f"/v1/sessions/{sid}/messages", json={"messages": messages}).status_code == 200
    member_run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    dumped = tool(agent_client, member_run["run_id"], "dump_user_messages")
    assert dumped["ok"], dumped
    path = dumped["result"]["path"]
    assert path.startswith(f"{member_run['workdir']}/user-messages/") and dumped["result"]["count"] == 2
    read = tool(agent_client, member_run["run_id"], "read_file", path=path)
    assert read["ok"], read
    document = json.loads(Path(path).read_text())
    assert [m["content"] for m in document["messages"]] == ["please chart the sales", "make it blue 蓝色"]
    assert [m["speaker_user_id"] for m in document["messages"]] == [OWNER, MEMBER]
    owner_run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=OWNER)
    assert tool(agent_client, owner_run["run_id"], "read_file", path=path)["error"]["code"] == "foreign_runtime_path"
    assert tool(agent_client, owner_run["run_id"], "send_file", path_or_url=path)["error"]["code"] == "foreign_runtime_path"


def test_owner_mode_makes_the_owners_upload_the_runtime_users_own(agent_client: TestClient) -> None:
    sid = group_session(agent_client)
    owner_run = start_run(agent_client, sid, trigger="web")
    write_bytes_in_sandbox(agent_client, owner_run["run_id"], "pic.png", PNG)
    upload = tool(agent_client, owner_run["run_id"], "publish_artifact", path="pic.png")["result"]["path"]
    assert agent_client.put("/v1/admin/runtime-identity", json={"mode": "owner"}, headers=admin_headers()).status_code == 200
    run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    assert run["runtime_user_id"] == OWNER
    sent = tool(agent_client, run["run_id"], "send_file", path_or_url=upload)
    assert sent["ok"], sent
    assert fetch_delivery(agent_client, sent["result"]["delivery_id"]) == PNG


def test_deliveries_can_be_deleted_and_go_with_their_session(agent_client: TestClient, agent_service: OrchestratorService) -> None:
    sid = group_session(agent_client)
    run = start_run(agent_client, sid, trigger="web")
    assert tool(agent_client, run["run_id"], "write_file", path="a.txt", content="a")["ok"]
    first = tool(agent_client, run["run_id"], "send_file", path_or_url="a.txt")["result"]["delivery_id"]
    second = tool(agent_client, run["run_id"], "send_file", path_or_url="a.txt")["result"]["delivery_id"]
    assert agent_client.delete(f"/v1/deliveries/{first}").json() == {"delivery_id": first, "deleted": True}
    assert agent_client.get(f"/v1/deliveries/{first}").status_code == 404
    assert agent_client.delete(f"/v1/deliveries/{first}").status_code == 404
    assert not agent_service.layout.outbox_file(first).exists()
    assert agent_service.layout.outbox_file(second).exists()
    assert agent_client.delete(f"/v1/sessions/{sid}").status_code == 200
    assert agent_client.get(f"/v1/deliveries/{second}").status_code == 404
    assert not agent_service.layout.outbox_file(second).exists()
    # the bot token is needed to fetch deliveries
    anonymous = TestClient(agent_client.app)  # not entered: the app's lifespan is agent_client's
    assert anonymous.get(f"/v1/deliveries/{second}").status_code == 401
    for bad in ("../../state/orchestrator.sqlite3", "dl-zz", "x" * 99):
        assert agent_client.get(f"/v1/deliveries/{bad}").status_code == 404


def test_send_by_url_fetches_on_the_host_and_never_a_private_address(data_dir: Path) -> None:
    from fastapi import FastAPI
    from fastapi.responses import RedirectResponse, Response

    from orchestrator.http.app import create_app
    from tests.conftest import API_TOKEN, make_settings
    from tests.live_server import live_server

    files = FastAPI()
    files.get("/chart")(lambda: Response(PNG, media_type="application/octet-stream"))
    files.get("/inside")(lambda: RedirectResponse("http://192.168.0.10/admin", status_code=302))
    with live_server(files) as origin:
        for allow_loopback in (True, False):
            service = OrchestratorService(make_settings(data_dir / str(allow_loopback), url_fetch_allow_loopback=allow_loopback))
            try:
                with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
                    run = start_run(client, group_session(client), trigger="web")
                    sent = tool(client, run["run_id"], "send_image", path_or_url=f"{origin}/chart")
                    if allow_loopback:
                        assert sent["ok"], sent
                        assert sent["result"]["media_type"] == "image/png"  # sniffed, not the server's label
                        assert sent["result"]["file_name"] == "chart.png"
                        assert fetch_delivery(client, sent["result"]["delivery_id"]) == PNG
                        refused = tool(client, run["run_id"], "send_file", path_or_url=f"{origin}/inside")
                        assert refused["error"]["code"] == "url_refused" and "192.168.0.10" in refused["error"]["message"]
                    else:
                        assert sent["error"]["code"] == "url_refused" and "loopback" in sent["error"]["message"]
                    assert service.sandboxes.status() == []  # URLs never involve a sandbox
            finally:
                service.close()


def test_item10_only_what_the_orchestrator_published_is_public(
    agent_client: TestClient, agent_service: OrchestratorService
) -> None:
    """Issue 12 item 10, as a hostile sandbox does it with its own shell: a name it wrote into
    its uploads dir, and a hard link to a root-owned file, are not public; a published artifact is."""
    sid = group_session(agent_client)
    run = start_run(agent_client, sid, trigger="group_message", speaker_user_id=MEMBER)
    run_id, uploads = run["run_id"], run["upload_dir"]
    write_bytes_in_sandbox(agent_client, run_id, "chart.png", PNG)
    published = tool(agent_client, run_id, "publish_artifact", path="chart.png")
    assert published["ok"], published
    name = published["result"]["file_name"]
    # A root-owned file with a known secret that 67 may read and write (so protected_hardlinks
    # lets it link it), outside 67's roots.
    secret = b"root-owned secret\n"
    root_file = agent_service.layout.root / "root-secret.txt"
    root_file.write_bytes(secret)
    os.chmod(root_file, 0o666)
    fake = f"{'ab' * 16}.txt"
    planted = tool(
        agent_client,
        run_id,
        "shell",
        command=f"echo top-secret > {uploads}/secret.txt && ln {root_file} {uploads}/{fake}"
        f" && cp {uploads}/{name} {uploads}/keep.png && ln -f {root_file} {uploads}/{name}",
    )
    assert planted["ok"] and planted["result"]["exit_code"] == 0, planted
    with TestClient(agent_client.app) as anonymous:
        for file_name in ("secret.txt", fake, name):
            response = anonymous.get(f"/uploads/{MEMBER}/{file_name}")
            assert response.status_code == 404, (file_name, response.status_code)
            assert b"secret" not in response.content
        # the host's own reading of upload URLs (send_file of an upload URL) refuses them too
        sent = tool(agent_client, run_id, "send_file", path_or_url=f"http://testserver/uploads/{MEMBER}/{fake}")
        assert sent["ok"] is False and sent["error"]["code"] == "not_found", sent
        # a published artifact still downloads
        again = tool(agent_client, run_id, "publish_artifact", path=f"{uploads}/keep.png")
        assert again["ok"], again
        response = anonymous.get(f"/uploads/{MEMBER}/{again['result']['file_name']}")
        assert response.status_code == 200 and response.content == PNG
