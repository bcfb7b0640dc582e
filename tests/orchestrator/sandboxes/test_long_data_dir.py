"""A data dir deeper than a Unix socket path can be (108 bytes): agents still bind, the
orchestrator still connects, and the egress socket is still reached (through a directory fd)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.agent_env import serving, traversable_tmp  # noqa: F401 - fixture
from tests.api_calls import MEMBER, group_session, start_run, tool
from tests.conftest import make_settings

DEPTH = 150


def long_data_dir(base: Path) -> Path:
    path = base
    while len(str(path)) < DEPTH:
        path = path / "deep-directory-name"
        path.mkdir(mode=0o711)
    return path / "data"


def test_agents_and_tools_work_with_a_data_dir_150_characters_deep(traversable_tmp: Path) -> None:
    data = long_data_dir(traversable_tmp)
    data.mkdir()
    assert len(str(data)) >= DEPTH
    with serving(make_settings(data)) as (client, _):
        run = start_run(client, group_session(client), trigger="group_message", speaker_user_id=MEMBER)
        answer = tool(client, run["run_id"], "shell", command="echo hello; pwd")
        assert answer["ok"] and answer["result"]["stdout"].startswith("hello\n"), answer
        assert tool(client, run["run_id"], "write_file", path="a.txt", content="x")["ok"]
        assert tool(client, run["run_id"], "read_file", path="a.txt")["result"]["content"] == "x"
        sockets = [p for p in Path(data).rglob("*.sock")]
        assert sockets and all(len(os.fsencode(str(p))) > 108 for p in sockets), sockets
