"""schemathesis against a live server (docs/api.md, "Contract tests"): `--checks all` over the
API's own OpenAPI document, and over a document whose operations are the tool calls with the
argument schemas a model receives from `GET /v1/tools`. Any server error, undocumented status
code, response not matching its schema or schema-valid request refused fails the test.

Deterministic for CI: a fixed seed, `--generation-deterministic`, no shrinking, and a bounded
number of examples per operation that keeps both runs well under three minutes on two cores.
Real parts: a real uvicorn server on loopback, the process backend with real agents (as root).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.agent_env import agent_data_dir, agent_service, traversable_tmp  # noqa: F401 - fixtures
from tests.conftest import API_TOKEN
from tests.live_server import live_server

pytestmark = [pytest.mark.slow]

SEED = "20261201"
AUTH = f"Authorization: Bearer {API_TOKEN}"
FUZZ_SESSION = "fuzz-session"
CONFIG = Path(__file__).with_name("schemathesis.toml")
INBOX_WAIT_MAX_S = 1.0


def schemathesis(schema: str, base_url: str, report: Path, *extra: str, examples: int) -> subprocess.CompletedProcess:
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(CONFIG),
        "run",
        schema,
        "--url",
        base_url,
        "--checks",
        "all",
        "-H",
        AUTH,
        "--max-examples",
        str(examples),
        "--seed",
        SEED,
        "--generation-deterministic",
        "--no-shrink",
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--max-response-time",
        "45",  # the inbox long-polls up to its wait_s (INBOX_WAIT_MAX_S here)
        "--no-color",
        "--report",
        "junit",
        "--report-junit-path",
        str(report),
        *extra,
    ]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.orchestrator.http.schemathesis_hooks",
        "PYTHONPATH": str(Path(__file__).parents[3]),
        "NO_COLOR": "1",
        "COLUMNS": "200",
    }
    # Run in the test's own directory: nothing is written into the checkout.
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, check=False, cwd=report.parent)


def tool_calls_document(tools: list[dict], run_id: str) -> dict:
    """Pure: an OpenAPI document with one operation per tool: POST /v1/runs/{run}/tools/{name},
    whose body is `{"arguments": <the tool's argument schema>}`. The answer is always 200: a
    tool-level failure is `{"ok": false, "error": {...}}` (docs/api.md)."""
    paths: dict[str, dict] = {}
    schemas: dict[str, dict] = {}
    for tool in tools:
        parameters = copy.deepcopy(tool["parameters"])
        url_or_path = parameters.get("properties", {}).get("path_or_url")
        if url_or_path is not None:
            # Paths only: a generated http(s) URL would make the server fetch from the internet,
            # and tests talk to loopback only.
            url_or_path["anyOf"] = [b for b in url_or_path["anyOf"] if "^https?://" not in b.get("pattern", "")]
        if parameters.get("required"):  # a body without `arguments` calls the tool with {}
            required = ["arguments"]
        else:
            required = []
        for name, definition in parameters.pop("$defs", {}).items():
            schemas[name] = definition
        paths[f"/v1/runs/{run_id}/tools/{tool['name']}"] = {
            "post": {
                "operationId": f"tool_{tool['name']}",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"arguments": parameters},
                                "required": required,
                                "additionalProperties": False,
                            }
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "the tool's result, or a tool-level failure",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {"ok": {"type": "boolean"}},
                                    "required": ["ok"],
                                }
                            }
                        },
                    },
                    "400": {"description": "the body is not JSON (bad_request)"},
                    "401": {"description": "missing or wrong bearer token"},
                    "422": {"description": "the body is not a tool call (invalid_request)"},
                },
                "security": [{"bearerAuth": []}],
            }
        }
    text = json.dumps({"paths": paths, "schemas": schemas}).replace("#/$defs/", "#/components/schemas/")
    replaced = json.loads(text)
    return {
        "openapi": "3.1.0",
        "info": {"title": "tool calls", "version": "1"},
        "paths": replaced["paths"],
        "components": {
            "schemas": replaced["schemas"],
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
    }


def _failures(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n{result.stdout[-20000:]}\n{result.stderr[-4000:]}"


@pytest.fixture
def base_url(agent_data_dir: Path):
    """A server with every optional part on (credentials too), so every route is fuzzed."""
    from cryptography.fernet import Fernet

    from tests.conftest import make_settings

    # The inbox's long-poll bound is a setting the OpenAPI document publishes (wait_s ≤ it): at
    # 1 s instead of 30 s, the generated waits and the bound itself are fuzzed in a second each
    # (the long-poll was 40 % of the run).
    settings = make_settings(
        agent_data_dir, credentials_key=Fernet.generate_key().decode(), collaboration_inbox_wait_max_s=INBOX_WAIT_MAX_S
    )
    service = OrchestratorService(settings)
    try:
        with live_server(create_app(service)) as url:
            yield url
    finally:
        service.close()


def test_schemathesis_finds_nothing_in_the_api(base_url: str, tmp_path: Path) -> None:
    result = schemathesis(f"{base_url}/openapi.json", base_url, tmp_path / "api.xml", examples=12)
    print(result.stdout[-6000:])  # the summary, shown with -s
    assert result.returncode == 0, _failures(result)


def test_schemathesis_finds_nothing_in_the_tool_calls(base_url: str, tmp_path: Path) -> None:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as http:
        created = http.post("/v1/sessions", json={"session_id": FUZZ_SESSION, "owner_user_id": 17, "channel": "web"})
        assert created.status_code == 201, created.text
        run = http.post(f"/v1/sessions/{FUZZ_SESSION}/runs", json={"trigger": "web"})
        assert run.status_code == 201, run.text
        tools = http.get("/v1/tools").json()["tools"]
    document = tmp_path / "tools.json"
    document.write_text(json.dumps(tool_calls_document(tools, run.json()["run_id"])))
    # Stateful links need operations that create resources; a tool call creates none.
    extra = ("--phases", "examples,coverage,fuzzing")
    result = schemathesis(str(document), base_url, tmp_path / "tools.xml", *extra, examples=25)
    print(result.stdout[-6000:])  # the summary, shown with -s
    assert result.returncode == 0, _failures(result)
