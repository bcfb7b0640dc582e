"""publish_artifact streams the sandbox's raw answer into a spool file of the user's uploads
(renamed into place, owned by the user's sandbox uid), and sending an own upload by its URL
streams it from that file into the outbox: neither is held whole. A refused publish leaves
no spool behind."""

from __future__ import annotations

import hashlib
import os

from fastapi.testclient import TestClient

from mounts.fs.spool import FileSpool
from orchestrator.deliveries import public_uploads
from orchestrator.service import OrchestratorService
from sandbox_agent import client as agent_client_module
from tests.agent_env import agent_client, agent_data_dir, agent_service, traversable_tmp  # noqa: F401 - fixtures
from tests.api_calls import OWNER, group_session, start_run, tool

SIZE = 3 * 1024 * 1024 + 5


def test_publish_and_send_of_the_upload_stream_file_to_file(agent_client: TestClient, agent_service: OrchestratorService, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    run = start_run(agent_client, group_session(agent_client), trigger="web")["run_id"]
    made = tool(agent_client, run, "shell", command=f"head -c {SIZE} /dev/urandom > art.bin && sha256sum art.bin")
    expected = made["result"]["stdout"].split()[0]
    pieces: list[int] = []
    write = FileSpool.write
    monkeypatch.setattr(FileSpool, "write", lambda self, data: pieces.append(len(data)) or write(self, data))

    published = tool(agent_client, run, "publish_artifact", path="art.bin")
    assert published["ok"], published
    assert published["result"]["size"] == SIZE
    assert max(pieces) <= agent_client_module.SPOOL_CHUNK and sum(pieces) == SIZE  # in pieces, never whole
    uploads = agent_service.layout.uploads_dir(OWNER)
    assert os.listdir(uploads) == [published["result"]["file_name"]]  # no spool left
    st = os.stat(uploads / published["result"]["file_name"])
    assert (st.st_mode & 0o777, st.st_nlink) == (0o644, 1)
    if os.geteuid() == 0:
        assert st.st_uid == agent_service.directories.sandbox_uid(OWNER)
    served = agent_client.get(published["result"]["url"].removeprefix("http://testserver"))
    assert served.status_code == 200 and hashlib.sha256(served.content).hexdigest() == expected

    pieces.clear()
    sent = tool(agent_client, run, "send_file", path_or_url=published["result"]["url"])
    assert sent["ok"], sent
    assert sent["result"]["size"] == SIZE and sent["result"]["sha256"] == expected
    assert max(pieces) <= public_uploads.COPY_CHUNK and sum(pieces) == SIZE  # from the file, in pieces
    fetched = agent_client.get(f"/v1/deliveries/{sent['result']['delivery_id']}")
    assert hashlib.sha256(fetched.content).hexdigest() == expected


def test_a_refused_publish_leaves_no_spool(agent_client: TestClient, agent_service: OrchestratorService) -> None:
    run = start_run(agent_client, group_session(agent_client), trigger="web")["run_id"]
    assert tool(agent_client, run, "publish_artifact", path="missing.bin")["error"]["code"] == "not_found"
    tool(agent_client, run, "shell", command="mkdir adir")
    assert not tool(agent_client, run, "publish_artifact", path="adir")["ok"]
    assert os.listdir(agent_service.layout.uploads_dir(OWNER)) == []
