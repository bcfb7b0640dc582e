"""A refused path argument of a container tool keeps its `path` on the way out: the agent
names it, and the host's tool route answers it unchanged (tests/sandbox_agent/
test_path_safety_corpus.py runs the whole corpus against the agent itself)."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from tests.api_calls import group_session, start_run

TOO_LONG = "/" + "a/" * 2100 + "x"  # longer than the kernel opens


def call(client: TestClient, run_id: str, name: str, arguments: dict[str, object]) -> dict:
    # json.dumps escapes a lone surrogate as JSON's `\ud800`, the way a model's argument arrives.
    body = json.dumps({"arguments": arguments}).encode()
    response = client.post(f"/v1/runs/{run_id}/tools/{name}", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    return response.json()


def test_every_refused_path_argument_answers_its_path(agent_client: TestClient) -> None:
    run_id = start_run(agent_client, group_session(agent_client), trigger="web")["run_id"]
    for name, arguments, path in [
        ("read_file", {"path": ""}, ""),
        ("write_file", {"path": "notes\x00.md", "content": "x"}, "notes\x00.md"),
        ("list_dir", {"path": "/\ud800"}, "/\\ud800"),  # no UTF-8 at all: escaped, and flagged
        ("read_bytes", {"path": TOO_LONG}, TOO_LONG[:200] + "..."),
        ("glob_search", {"pattern": "../*"}, "../*"),
        ("glob_search", {"pattern": ""}, ""),
        ("grep_search", {"pattern": "x", "glob": "/etc/*"}, "/etc/*"),
        ("send_file", {"path_or_url": "  "}, "  "),  # refused by the host before any sandbox
    ]:
        answer = call(agent_client, run_id, name, arguments)
        assert answer["ok"] is False, (name, arguments)
        assert answer["error"]["code"] == "invalid_arguments", answer
        assert answer["error"]["path"] == path, answer
        assert answer["error"].get("path_encoding") == ("escaped" if "\\ud800" in path else None), answer
