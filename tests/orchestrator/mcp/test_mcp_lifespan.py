"""The MCP endpoint serves through every lifespan of its app: the SDK's session manager runs once
per instance, and an app's lifespan may be entered again (a second client of the same app, even
nested in the first), which failed at start-up before each lifespan got managers of its own."""

from __future__ import annotations

from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.api_calls import group_session, start_run
from tests.conftest import API_TOKEN

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "lifespan-test", "version": "1"}},
}
HEADERS = {"Authorization": f"Bearer {API_TOKEN}", "Accept": "application/json, text/event-stream"}


def _initializes(client: TestClient, run_id: str) -> bool:
    answer = client.post(f"/v1/runs/{run_id}/mcp", json=INITIALIZE, headers=HEADERS)
    return answer.status_code == 200 and answer.json()["result"]["serverInfo"]["name"] != ""


def test_the_endpoint_serves_in_a_second_and_a_nested_lifespan_of_one_app(service: OrchestratorService) -> None:
    app = create_app(service)
    with TestClient(app, headers={"Authorization": f"Bearer {API_TOKEN}"}) as first:
        run_id = start_run(first, group_session(first), trigger="web")["run_id"]
        assert _initializes(first, run_id)
        with TestClient(app) as nested:
            assert _initializes(nested, run_id)
        assert _initializes(first, run_id)  # the outer lifespan's managers still serve
    with TestClient(app) as again:
        assert _initializes(again, run_id)
