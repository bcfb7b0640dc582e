"""The API contract: one error shape for every non-2xx, a request id on every response, the
two 500s the fuzzer found are 422s, and the OpenAPI document describes the API (docs/api.md)."""

from __future__ import annotations

import logging
import re

import pytest
from fastapi.testclient import TestClient

from mounts import ids
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.agent_env import agent_client, agent_data_dir, agent_service, traversable_tmp  # noqa: F401 - fixtures
from tests.conftest import API_TOKEN, admin_headers

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


def _assert_error_shape(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", response.headers["x-request-id"])
    return body["error"]


@pytest.mark.parametrize("flag", ["archived", "pinned", "allow_cross_read", "cross_private"])
def test_patch_session_with_a_null_flag_is_422_and_changes_nothing(client: TestClient, flag: str) -> None:
    client.post("/v1/sessions", json={"session_id": "s1", "owner_user_id": 17, "channel": "web", "title": "t"})
    before = client.get("/v1/sessions/s1").json()
    error = _assert_error_shape(client.patch("/v1/sessions/s1", json={flag: None}), 422, "invalid_request")
    assert error["field"] == flag
    assert client.get("/v1/sessions/s1").json() == before
    # A title may still be cleared, and an omitted flag stays as it is.
    cleared = client.patch("/v1/sessions/s1", json={"title": None, "pinned": True})
    assert cleared.status_code == 200 and cleared.json()["title"] is None and cleared.json()["pinned"] is True
    assert cleared.json()["archived"] is False


@pytest.mark.parametrize("before", ["9223372036854775808", "99999999999999999999999"])
def test_collaborations_cursor_beyond_sqlite_is_422(client: TestClient, before: str) -> None:
    client.post("/v1/sessions", json={"session_id": "s1", "owner_user_id": 17, "channel": "web"})
    response = client.get(f"/v1/sessions/s1/collaborations?before={before}")
    assert _assert_error_shape(response, 422, "invalid_request")["field"] == "before"
    largest = client.get("/v1/sessions/s1/collaborations?before=9223372036854775807")
    assert largest.status_code == 200, largest.text


def test_framework_errors_have_the_one_shape(client: TestClient) -> None:
    _assert_error_shape(client.get("/v1/no-such-route"), 404, "not_found")
    _assert_error_shape(client.get("/nothing-here"), 404, "not_found")
    error = _assert_error_shape(client.delete("/v1/tools"), 405, "method_not_allowed")
    assert error["message"]
    assert client.delete("/v1/tools").headers["allow"] == "GET"
    bad_json = client.post("/v1/sessions", content=b"{not json", headers={"content-type": "application/json"})
    _assert_error_shape(bad_json, 422, "invalid_request")


def test_validation_errors_have_no_second_detail_list(client: TestClient) -> None:
    error = _assert_error_shape(client.post("/v1/sessions", json={"channel": "web"}), 422, "invalid_request")
    assert error["field"] == "owner_user_id"


def test_guard_and_auth_refusals_have_the_shape_and_a_request_id(service: OrchestratorService) -> None:
    with TestClient(create_app(service)) as anonymous:
        _assert_error_shape(anonymous.get("/v1/tools"), 401, "unauthorized")
    with TestClient(create_app(service), headers=AUTH) as bot:
        _assert_error_shape(bot.get("/v1/admin/audit"), 403, "forbidden")


def test_every_response_has_a_request_id_and_a_safe_caller_id_is_kept(client: TestClient) -> None:
    first, second = client.get("/healthz"), client.get("/healthz")
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    assert client.get("/healthz", headers={"X-Request-Id": "bot-42.a"}).headers["x-request-id"] == "bot-42.a"
    # An id that would forge a log line or is too long is replaced, not echoed.
    for hostile in ("a b=c", "x" * 65, "id\tz"):
        replaced = client.get("/healthz", headers={"X-Request-Id": hostile}).headers["x-request-id"]
        assert replaced != hostile and re.fullmatch(r"[0-9a-f]{32}", replaced)


def test_an_unexpected_failure_is_a_500_in_the_shape_with_the_request_id_logged(
    service: OrchestratorService, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(service)

    def broken() -> None:
        raise RuntimeError("boom from a bug")

    app.add_api_route("/v1/broken-for-test", broken)
    with TestClient(app, headers=AUTH, raise_server_exceptions=False) as c, caplog.at_level(logging.ERROR):
        response = c.get("/v1/broken-for-test")
    error = _assert_error_shape(response, 500, "internal_error")
    request_id = response.headers["x-request-id"]
    assert error["request_id"] == request_id and request_id in error["message"]
    assert "boom" not in response.text  # the traceback stays in the log
    logged = [r for r in caplog.records if f"request_id={request_id}" in r.getMessage()]
    assert logged and logged[0].exc_info is not None


# --- the OpenAPI document ----------------------------------------------------------------


def test_openapi_declares_errors_security_and_acting_user(client: TestClient, settings) -> None:
    doc = client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearerAuth"]["description"],
    }
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "500" in responses, (method, path)
            if path.startswith("/v1/"):
                assert operation["security"] == [{"bearerAuth": []}]
                for status in ("401", "404", "422"):
                    schema = responses[status]["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorOut"}, (method, path, status)
    get_session = doc["paths"]["/v1/sessions/{session_id}"]["get"]
    acting = [p for p in get_session["parameters"] if p["name"] == "X-Acting-User"]
    assert len(acting) == 1 and acting[0]["in"] == "header" and not acting[0]["required"]
    integer, person = acting[0]["schema"]["anyOf"]
    assert (integer["type"], integer["minimum"], integer["maximum"]) == ("integer", 1, ids.MAX_USER_ID)
    assert (person["type"], person["pattern"]) == ("string", ids.PERSON_PATTERN)
    # The token is the security scheme, not a parameter a fuzzer or a docs user fills in.
    assert not [p for p in get_session["parameters"] if p["name"].lower() == "authorization"]
    assert not [p for p in doc["paths"]["/v1/tools"]["get"].get("parameters", []) if p["name"] == "X-Acting-User"]
    error = doc["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"code", "message"}


def test_openapi_carries_the_servers_limits(client: TestClient, settings) -> None:
    doc = client.get("/openapi.json").json()
    params = {p["name"]: p["schema"] for p in doc["paths"]["/v1/sessions/{session_id}"]["get"]["parameters"]}
    assert params["session_id"]["pattern"] and params["session_id"]["maxLength"] == 128
    owner = doc["components"]["schemas"]["SessionCreate"]["properties"]["owner_user_id"]["anyOf"][0]
    assert owner["maximum"] == settings.max_user_id and owner["exclusiveMinimum"] == 0
    before = {p["name"]: p["schema"] for p in doc["paths"]["/v1/sessions/{session_id}/collaborations"]["get"]["parameters"]}
    assert before["before"]["anyOf"][0]["maximum"] == 2**63 - 1


def test_docs_pages_load_only_local_assets(client: TestClient) -> None:
    for page in ("/docs", "/redoc"):
        html = client.get(page)
        assert html.status_code == 200
        urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html.text)
        urls += re.findall(r"""url:\s*['"]([^'"]+)['"]""", html.text)
        urls += re.findall(r"""spec-url=["']([^"']+)["']""", html.text)
        assert urls, html.text
        for url in urls:
            assert url.startswith("/"), (page, url)  # nothing from another host
            assert client.get(url).status_code == 200, url
        assert "https://" not in html.text.replace("https://swagger.io", "")


def test_a_tool_call_after_end_run_says_the_run_has_ended(client: TestClient) -> None:
    client.post("/v1/sessions", json={"session_id": "s1", "owner_user_id": 17, "channel": "web"})
    run_id = client.post("/v1/sessions/s1/runs", json={"trigger": "web"}).json()["run_id"]
    assert client.post(f"/v1/runs/{run_id}/end", json={"status": "succeeded"}).status_code == 200
    response = client.post(f"/v1/runs/{run_id}/tools/list_dir", json={"arguments": {"path": "."}})
    error = _assert_error_shape(response, 409, "run_ended")
    assert run_id in error["message"] and "start a new run" in error["message"]


def test_dump_user_messages_into_a_planted_symlink_is_a_tool_level_failure(
    client: TestClient, service: OrchestratorService, tmp_path
) -> None:
    client.post("/v1/sessions", json={"session_id": "s1", "owner_user_id": 17, "channel": "web"})
    run_id = client.post("/v1/sessions/s1/runs", json={"trigger": "web"}).json()["run_id"]
    # What the user's own shell can do: replace its session's runtime directory by a symlink.
    runtime = service.settings.data_dir / "runtime" / "17" / "s1"
    if runtime.exists():
        import shutil

        shutil.rmtree(runtime)
    runtime.parent.mkdir(parents=True, exist_ok=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    runtime.symlink_to(elsewhere)
    response = client.post(f"/v1/runs/{run_id}/tools/dump_user_messages", json={"arguments": {}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ok"] is False and body["error"]["code"] == "unsafe_directory"
    assert list(elsewhere.iterdir()) == []  # nothing was written through the link


def test_send_file_of_a_too_large_file_names_send_files_limit(traversable_tmp) -> None:
    from tests.conftest import make_settings

    data = traversable_tmp / "data"
    data.mkdir()
    service = OrchestratorService(make_settings(data, read_bytes_max=1000))
    try:
        with TestClient(create_app(service), headers=AUTH) as c:
            c.post("/v1/sessions", json={"session_id": "s1", "owner_user_id": 17, "channel": "web"})
            run_id = c.post("/v1/sessions/s1/runs", json={"trigger": "web"}).json()["run_id"]
            made = {"command": "head -c 5000 /dev/zero > big.txt"}
            wrote = c.post(f"/v1/runs/{run_id}/tools/shell", json={"arguments": made})
            assert wrote.json()["ok"] is True, wrote.text
            sent = c.post(f"/v1/runs/{run_id}/tools/send_file", json={"arguments": {"path_or_url": "big.txt"}}).json()
    finally:
        service.close()
    assert sent["ok"] is False and sent["error"]["code"] == "too_large", sent
    assert "send_file" in sent["error"]["message"] and "1000" in sent["error"]["message"]
    assert "read_bytes" not in sent["error"]["message"]


def test_reading_a_unix_socket_is_not_a_regular_file_and_errors_carry_no_null_path(agent_client: TestClient) -> None:
    c = agent_client
    c.post("/v1/sessions", json={"session_id": "s1", "owner_user_id": 17, "channel": "web"})
    run_id = c.post("/v1/sessions/s1/runs", json={"trigger": "web"}).json()["run_id"]
    # The user's own shell binds a socket in its working directory and keeps it there.
    bind = "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('agent.sock')\" && test -S agent.sock"
    made = c.post(f"/v1/runs/{run_id}/tools/shell", json={"arguments": {"command": bind}}).json()
    assert made["ok"] is True and made["result"]["exit_code"] == 0, made
    for tool in ("read_file", "read_bytes"):
        read = c.post(f"/v1/runs/{run_id}/tools/{tool}", json={"arguments": {"path": "agent.sock"}}).json()
        assert read["ok"] is False and read["error"]["code"] == "not_a_regular_file", (tool, read)
        assert read["error"]["path"].endswith("agent.sock")
    # An error about no path has no "path" key at all (not "path": null), also when the agent
    # (not the host) refuses it.
    bad = c.post(f"/v1/runs/{run_id}/tools/read_file", json={"arguments": {"path": "a", "offset": 0}}).json()
    assert bad["ok"] is False and bad["error"]["code"] == "invalid_arguments" and "path" not in bad["error"], bad
    # A refused path argument is named as sent, a NUL in it too (never as null).
    nul = c.post(f"/v1/runs/{run_id}/tools/read_file", json={"arguments": {"path": "a\u0000b"}}).json()
    assert nul["ok"] is False and nul["error"]["code"] == "invalid_arguments" and nul["error"]["path"] == "a\x00b", nul
