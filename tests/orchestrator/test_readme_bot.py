"""The README's bot example, run literally (its code block read from README.md and executed)
against a live server: an invented tool name, a retried call and (slow) a shell call longer than
every default time limit on its way go through without an error and without running anything
twice."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import orchestrator.client
from orchestrator.client import OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures
from tests.conftest import API_TOKEN, make_settings
from tests.live_server import free_port, live_server

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_bot() -> str:
    text = README.read_text()
    section = text[text.index("## A chat bot in ten lines") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's bot example is gone"
    return match.group(1)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class ScriptedModel:
    """A model that asks for the given calls, and remembers what it was shown."""

    calls: list[ToolCall]
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    identity: str | None = None

    def turn(self, identity_section: str | None, catalog: list[Any]) -> Iterator[ToolCall]:
        self.identity = identity_section
        yield from self.calls

    def observe(self, call_id: str, body: dict[str, Any]) -> None:
        self.seen.append((call_id, body))


@dataclass
class Chat:
    posted: list[Any] = field(default_factory=list)

    def post(self, delivery: Any) -> None:
        self.posted.append(delivery)


# The long call's test shortens every default time limit a shell call passes (the server's
# default shell timeout and its deadline of other sandbox calls, the bot client's HTTP timeout:
# 60 s, 30 s and 60 s out of the box) so that a call of a few seconds outlasts them all, as a
# 90 s call outlasts the real defaults.
SHORT_DEFAULT_S = 5.0
LONG_CALL_S = 10  # well past each shortened default, not at its edge


@pytest.fixture
def server_settings() -> dict[str, Any]:
    return {}


@pytest.fixture
def server_url(agent_data_dir, monkeypatch, server_settings) -> Iterator[str]:
    port = free_port()
    service = OrchestratorService(
        make_settings(agent_data_dir, public_base_url=f"http://127.0.0.1:{port}", **server_settings)
    )
    try:
        with live_server(create_app(service), port) as base:
            monkeypatch.setenv("ORCH_URL", base)
            yield base
    finally:
        service.close()


def run_readme(calls: list[ToolCall]) -> tuple[ScriptedModel, Chat, dict[str, Any]]:
    model, chat = ScriptedModel(calls), Chat()
    namespace: dict[str, Any] = {"BOT_TOKEN": API_TOKEN, "chat_id": "oc_readme", "speaker": 67, "model": model, "chat": chat}
    try:
        exec(compile(readme_bot(), str(README), "exec"), namespace)
    finally:
        if "bot" in namespace:
            namespace["bot"].close()
    return model, chat, namespace


def by_id(model: ScriptedModel) -> dict[str, list[dict[str, Any]]]:
    seen: dict[str, list[dict[str, Any]]] = {}
    for call_id, body in model.seen:
        seen.setdefault(call_id, []).append(body)
    return seen


RETRIED = ToolCall("t-count", "shell", {"command": "echo ran >> retried.txt; echo counted"})


def test_the_readme_bot_survives_an_invented_tool_and_a_retried_call(server_url) -> None:
    model, chat, ns = run_readme(
        [
            ToolCall("t-invented", "search_the_web", {"query": "x"}),
            ToolCall("t-escape", "../end", {}),
            ToolCall("t-write", "write_file", {"path": "report.txt", "content": "report\n"}),
            RETRIED,
            RETRIED,  # the bot repeats a call it did not see the answer of
            ToolCall("t-send", "send_file", {"path_or_url": "report.txt"}),
        ]
    )
    seen = by_id(model)
    assert seen["t-invented"][0]["error"]["code"] == "unknown_tool"
    assert "shell" in seen["t-invented"][0]["error"]["tools"]
    assert seen["t-escape"][0]["error"]["code"] == "unknown_tool"
    first, repeat = seen["t-count"]
    assert first == repeat and first["result"]["stdout"] == "counted\n"
    assert [d.data for d in chat.posted] == [b"report\n"]
    run = ns["run"]
    assert (Path(run.workdir) / "retried.txt").read_text() == "ran\n"  # ran once


class ShortDefaultClient(OrchestratorClient):
    """The README's client with a short default HTTP timeout (the README passes none)."""

    def __init__(self, *args: Any, timeout: float = SHORT_DEFAULT_S, **kwargs: Any) -> None:
        super().__init__(*args, timeout=timeout, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize(
    "server_settings", [{"tool_timeout_s": SHORT_DEFAULT_S, "agent_call_timeout_s": SHORT_DEFAULT_S}]
)
def test_the_readme_bot_waits_for_a_shell_call_longer_than_every_default_limit(server_url, monkeypatch) -> None:
    monkeypatch.setattr(orchestrator.client, "OrchestratorClient", ShortDefaultClient)
    command = f"sleep {LONG_CALL_S}; echo done"
    model, _, ns = run_readme([ToolCall("t-long", "shell", {"command": command, "timeout_s": 4 * LONG_CALL_S})])
    (body,) = by_id(model)["t-long"]
    assert body["ok"] and body["result"]["stdout"] == "done\n" and body["result"]["exit_code"] == 0
