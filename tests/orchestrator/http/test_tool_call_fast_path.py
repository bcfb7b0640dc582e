"""The tool call's fast path (orchestrator/http/tool_call_fast_path.py) serves the well-formed
call and hands everything else to the framework's route: each answer, refusal or not, is the
one the framework's route gives for the same request."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from orchestrator.http import tool_call_fast_path
from orchestrator.http.tool_call_fast_path import ToolCallFastPath, well_formed
from tests.agent_env import agent_client, agent_data_dir, agent_service, traversable_tmp  # noqa: F401 - fixtures
from tests.conftest import API_TOKEN

JSON = {b"content-type": b"application/json"}


@pytest.mark.parametrize(
    "run_id,name,headers,body,served",
    [
        ("r1", "read_file", JSON, b'{"arguments": {"path": "a"}}', True),
        ("r1", "read_file", {b"content-type": b"application/json; charset=utf-8"}, b"{}", True),
        ("r1", "read_file", {b"content-type": b"Application/JSON"}, b'{"tool_call_id": "c1"}', True),
        ("r1", "x" * 100, JSON, b"{}", True),
        ("r1", "x" * 101, JSON, b"{}", False),  # the route's 422 on the name
        ("../r", "read_file", JSON, b"{}", False),  # the route's 422 on the run id
        ("r" * 129, "read_file", JSON, b"{}", False),
        ("r1", "read_file", {}, b"{}", False),  # no content type: the framework decides
        ("r1", "read_file", {b"content-type": b"text/plain"}, b"{}", False),
        ("r1", "read_file", JSON, b"", False),
        ("r1", "read_file", JSON, b"{not json", False),
        ("r1", "read_file", JSON, b"\xff\xfe", False),
        ("r1", "read_file", JSON, b"[]", False),
        ("r1", "read_file", JSON, b'{"arguments": []}', False),
        ("r1", "read_file", JSON, b'{"arguments": {}, "extra": 1}', False),
        ("r1", "read_file", JSON, b'{"tool_call_id": ""}', False),
        ("r1", "read_file", JSON, b'{"tool_call_id": "' + b"c" * 201 + b'"}', False),
    ],
)
def test_only_a_request_the_route_accepts_as_it_is_is_served(run_id, name, headers, body, served) -> None:
    call = well_formed(run_id, name, headers, body)
    assert (call is not None) is served
    if served:
        assert call.arguments == json.loads(body).get("arguments", {})


def _requests(run_id: str) -> list[tuple[str, dict[str, str], bytes]]:
    auth = {"Authorization": f"Bearer {API_TOKEN}"}
    as_json = {**auth, "Content-Type": "application/json"}
    return [
        (f"/v1/runs/{run_id}/tools/read_file", as_json, b'{"arguments": {"path": "missing.txt"}}'),
        (f"/v1/runs/{run_id}/tools/no_such_tool", as_json, b'{"arguments": {}}'),
        (f"/v1/runs/{run_id}/tools/read_file", as_json, b'{"arguments": {"path": 5}}'),
        (f"/v1/runs/{run_id}/tools/a/b", as_json, b"{}"),
        (f"/v1/runs/{run_id}/tools/" + "x" * 101, as_json, b"{}"),
        ("/v1/runs/no-such-run/tools/read_file", as_json, b"{}"),
        ("/v1/runs/a$b/tools/read_file", as_json, b"{}"),
        (f"/v1/runs/{run_id}/tools/read_file", as_json, b'{"arguments": {}, "extra": 1}'),
        (f"/v1/runs/{run_id}/tools/read_file", as_json, b"{not json"),
        (f"/v1/runs/{run_id}/tools/read_file", as_json, b"[]"),
        (f"/v1/runs/{run_id}/tools/read_file", {**auth, "Content-Type": "text/plain"}, b"{}"),
        (f"/v1/runs/{run_id}/tools/read_file", {**as_json, "X-Acting-User": "99"}, b"{}"),  # not its person
        (f"/v1/runs/{run_id}/tools/read_file", {**as_json, "X-Acting-User": "17"}, b'{"arguments": {"path": "x"}}'),
        (f"/v1/runs/{run_id}/tools/read_file", {**as_json, "X-Acting-User": "017"}, b"{}"),
        (f"/v1/runs/{run_id}/tools/read_file", {**as_json, "X-Acting-User": "slack:U1"}, b"{}"),
        (f"/v1/runs/{run_id}/tools/read_file", {"Authorization": "Bearer wrong", "Content-Type": "application/json"}, b"{}"),
    ]


def _answers(client: TestClient, requests: list[tuple[str, dict[str, str], bytes]]) -> list[tuple[int, object]]:
    answers = []
    for path, headers, body in requests:
        response = client.post(path, content=body, headers=headers)
        answers.append((response.status_code, response.json()))
    return answers


def test_every_answer_is_the_framework_routes_answer(agent_client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    client = agent_client
    sid = client.post("/v1/sessions", json={"owner_user_id": 17, "channel": "web"}).json()["session_id"]
    run_id = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web"}).json()["run_id"]
    served = []
    answer = tool_call_fast_path.answer_tool_call

    async def counted(*args, **kwargs):
        served.append(args[1:3])  # (run id, tool name)
        return await answer(*args, **kwargs)

    monkeypatch.setattr(tool_call_fast_path, "answer_tool_call", counted)
    requests = _requests(run_id)
    fast = _answers(client, requests)
    # The well-formed ones (a file, an unknown tool, arguments the tool refuses, a name with a
    # `/`, an unknown run) were the fast path's; the rest went on to the framework's route.
    assert served == [(run_id, "read_file"), (run_id, "no_such_tool"), (run_id, "read_file"), (run_id, "a/b"),
                      ("no-such-run", "read_file"), (run_id, "read_file"), (run_id, "read_file")]  # fmt: skip
    routes = client.app.router.routes  # type: ignore[attr-defined]
    assert isinstance(routes[0], ToolCallFastPath)
    routes.pop(0)
    framework = _answers(client, requests)
    assert fast == framework
    assert [status for status, _ in fast] == [200, 200, 200, 200, 422, 404, 422, 422, 422, 422, 422, 404, 200, 422, 404, 401]
    assert fast[0][1]["error"]["code"] == "not_found"
    assert fast[1][1]["error"]["code"] == "unknown_tool"
    assert fast[2][1]["error"]["code"] == "invalid_arguments"
