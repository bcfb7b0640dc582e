"""docs/bots.md's Slack and Feishu bots, their code blocks run literally against a live server.
The chat platforms are fakes (named so: no platform is reachable from here) that record what
the bot posts; people are named by their platform ids only."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchestrator.client import OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures
from tests.conftest import API_TOKEN, make_settings
from tests.live_server import free_port, live_server
from tests.orchestrator.test_readme_bot import ToolCall

BOTS = Path(__file__).resolve().parents[2] / "docs" / "bots.md"


def handler(heading: str, name: str) -> Any:
    text = BOTS.read_text()
    match = re.search(r"```python\n(.*?)```", text[text.index(heading) :], re.S)
    assert match, f"docs/bots.md lost its {heading!r} example"
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), str(BOTS), "exec"), namespace)
    return namespace[name]


@dataclass
class ScriptedModel:
    calls: list[ToolCall]
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    sections: list[str | None] = field(default_factory=list)

    def turn(self, identity_section: str | None, catalog: list[Any]) -> Iterator[ToolCall]:
        self.sections.append(identity_section)
        yield from self.calls

    def observe(self, call_id: str, body: dict[str, Any]) -> None:
        self.seen[call_id] = body


@dataclass
class FakeSlack:
    """Stands in for Slack's WebClient: records uploads."""

    uploads: list[tuple[str, str | None, bytes]] = field(default_factory=list)

    def files_upload_v2(self, *, channel: str, content: bytes, filename: str | None) -> None:
        self.uploads.append((channel, filename, content))


@dataclass
class FakeFeishu:
    """Stands in for a Feishu client: records files sent to chats."""

    sent: list[tuple[str, str | None, bytes]] = field(default_factory=list)

    def send_file(self, chat_id: str, file_name: str | None, data: bytes) -> None:
        self.sent.append((chat_id, file_name, data))


@pytest.fixture
def bot(agent_data_dir: Path) -> Iterator[OrchestratorClient]:
    port = free_port()
    service = OrchestratorService(make_settings(agent_data_dir, public_base_url=f"http://127.0.0.1:{port}"))
    try:
        with live_server(create_app(service), port) as base, OrchestratorClient(base, token=API_TOKEN) as client:
            yield client
    finally:
        service.close()


def scripted(marker: str) -> ScriptedModel:
    return ScriptedModel(
        [
            ToolCall("c-id", "shell", {"command": "id -u"}),
            ToolCall("c-write", "write_file", {"path": "note.txt", "content": f"{marker}\n"}),
            ToolCall("c-send", "send_file", {"path_or_url": "note.txt"}),
        ]
    )


def test_the_slack_bot_runs_each_speaker_in_their_own_sandbox(bot: OrchestratorClient) -> None:
    on_slack_message = handler("## A Slack bot", "on_slack_message")
    slack = FakeSlack()
    first, second = scripted("from U0ALICE"), scripted("from U0BOB")
    on_slack_message(bot, {"type": "message", "channel": "C0TEAM", "user": "U0ALICE", "channel_type": "channel"}, first, slack)
    on_slack_message(bot, {"type": "message", "channel": "C0TEAM", "user": "U0BOB", "channel_type": "channel"}, second, slack)
    alice, bob = bot.get_identity("slack", "U0ALICE").user_id, bot.get_identity("slack", "U0BOB").user_id
    session = bot.get_session("slack-C0TEAM")
    assert session.owner_user_id == alice and session.owner_identity is not None and session.owner_identity.id == "U0ALICE"
    assert session.group is not None and (session.group.channel, session.group.chat_id) == ("slack", "C0TEAM")
    assert first.seen["c-id"]["ok"] and second.seen["c-id"]["ok"]
    if first.seen["c-id"]["result"]["stdout"].strip().isdigit():
        assert first.seen["c-id"]["result"]["stdout"] != second.seen["c-id"]["result"]["stdout"]  # own uids as root
    assert [content for _, _, content in slack.uploads] == [b"from U0ALICE\n", b"from U0BOB\n"]
    assert all(channel == "C0TEAM" for channel, _, _ in slack.uploads)
    assert first.sections[0] is not None and "the session owner" in first.sections[0]  # a group session's owner run
    assert second.sections[0] is not None and f"#{bob}" in second.sections[0]  # Bob's own environment
    runs = bot.list_runs("slack-C0TEAM").runs
    assert {(r.speaker_identity.id if r.speaker_identity else None) for r in runs} == {"U0ALICE", "U0BOB"}

    dm = scripted("private")
    on_slack_message(bot, {"type": "message", "channel": "D0BOB", "user": "U0BOB", "channel_type": "im"}, dm, slack)
    private = bot.get_session("slack-D0BOB")
    assert private.owner_user_id == bob and private.group is None
    assert dm.sections == [None]  # a private session's owner run: no identity section


def test_the_feishu_bot_names_people_by_open_id(bot: OrchestratorClient) -> None:
    on_feishu_message = handler("## A Feishu bot", "on_feishu_message")
    feishu = FakeFeishu()

    def event(open_id: str, chat_id: str, chat_type: str) -> dict:
        return {"sender": {"sender_id": {"open_id": open_id}}, "message": {"chat_id": chat_id, "chat_type": chat_type}}

    owner_turn, member_turn = scripted("owner"), scripted("member")
    on_feishu_message(bot, event("ou_owner", "oc_team", "group"), owner_turn, feishu)
    on_feishu_message(bot, event("ou_member", "oc_team", "group"), member_turn, feishu)
    session = bot.get_session("feishu-oc_team")
    assert session.channel == "feishu_group" and session.owner_identity is not None and session.owner_identity.id == "ou_owner"
    assert [data for _, _, data in feishu.sent] == [b"owner\n", b"member\n"]
    member = bot.get_identity("feishu", "ou_member").user_id
    assert member_turn.sections[0] is not None and f"#{member}" in member_turn.sections[0]
