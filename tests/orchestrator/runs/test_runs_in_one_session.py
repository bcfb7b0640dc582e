"""What docs/bots.md promises a bot about runs: users need no registration, two runs may run
at once in one session (each as its own speaker, in its own runtime directory), and the
messages a bot appends are what `dump_user_messages` hands the model."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

OWNER, MEMBER = 17, 67  # never PUT /v1/users: both exist from first mention on


def test_two_speakers_run_at_once_in_one_session_and_see_the_appended_messages(client: TestClient) -> None:
    created = client.post(
        "/v1/sessions",
        json={"session_id": "g-two", "owner_user_id": OWNER, "channel": "feishu_group",
              "group": {"channel": "feishu", "chat_id": "oc_two"}},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    appended = client.post(
        "/v1/sessions/g-two/messages",
        json={"messages": [
            {"role": "user", "content": "owner asks", "speaker_user_id": OWNER},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": "member asks", "speaker_user_id": MEMBER},
        ]},
    )  # fmt: skip
    assert appended.status_code == 200, appended.text

    runs = {}
    for speaker in (OWNER, MEMBER):
        started = client.post("/v1/sessions/g-two/runs", json={"trigger": "group_message", "speaker_user_id": speaker})
        assert started.status_code == 201, started.text
        runs[speaker] = started.json()
    # Neither run has ended: both are running in the one session at the same time.
    assert {client.get(f"/v1/runs/{run['run_id']}").json()["status"] for run in runs.values()} == {"running"}
    assert runs[OWNER]["workdir"] != runs[MEMBER]["workdir"]
    assert client.get(f"/v1/users/{MEMBER}").json()["groups"] == [{"channel": "feishu", "chat_id": "oc_two"}]

    for speaker, run in runs.items():
        called = client.post(f"/v1/runs/{run['run_id']}/tools/dump_user_messages", json={"arguments": {}})
        assert called.status_code == 200, called.text
        body = called.json()
        assert body["ok"] is True, body
        dump = Path(body["result"]["path"])
        assert dump.parent.parent == Path(run["workdir"])  # the speaker's own runtime dir
        document = json.loads(dump.read_text())
        assert [(m["speaker_user_id"], m["content"]) for m in document["messages"]] == [
            (OWNER, "owner asks"),
            (MEMBER, "member asks"),
        ]
