"""docs/mcp.md's recipes for idempotent MCP calls from agent frameworks, run literally: each
framework's own MCP client and agent loop (a scripted model, no LLM) in a venv of its own, against
a live server with real process-backend agents. A repeated model call id answers the first
result and runs nothing; another id runs again."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.client import OrchestratorClient
from tests.conftest import API_TOKEN
from tests.orchestrator.mcp.conftest import OWNER, Live
from tests.orchestrator.mcp.framework_venv import run_driver

DOC = Path(__file__).resolve().parents[3] / "docs" / "mcp.md"
# Each execution appends a line and prints how many there are: a repeat that ran again would say 2.
COMMAND = "echo ran >> executions.txt; wc -l < executions.txt"


def recipe(heading: str) -> str:
    text = DOC.read_text()
    section = text[text.index(f"### {heading}\n") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"docs/mcp.md lost its {heading} recipe"
    return match.group(1)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("framework", "heading", "driver"),
    [
        ("pydantic-ai", "pydantic-ai", "pydantic_ai_driver.py"),
        ("langchain", "LangChain (langchain-mcp-adapters)", "langchain_driver.py"),
        ("openai-agents", "OpenAI Agents SDK (openai-agents)", "openai_agents_driver.py"),
    ],
    ids=["pydantic-ai", "langchain", "openai-agents"],
)
def test_a_repeated_model_call_id_answers_the_first_result(
    live: Live, bot: OrchestratorClient, tmp_path: Path, framework: str, heading: str, driver: str
) -> None:
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    (tmp_path / "recipe.py").write_text(recipe(heading))
    env = {
        "ORCH_URL": live.url,
        "BOT_TOKEN": API_TOKEN,
        "RUN_ID": run.run_id,
        "RECIPE": str(tmp_path / "recipe.py"),
        "COMMAND": COMMAND,
        "CALL_IDS": json.dumps(["call-1", "call-1", "call-2"]),
    }
    (first, repeat, other) = run_driver(framework, driver, env)
    assert [first[0], repeat[0], other[0]] == ["call-1", "call-1", "call-2"]
    assert first[1]["stdout"] == "1\n" and first[1]["exit_code"] == 0, first
    assert repeat[1] == first[1]  # the recorded answer, as the model saw it the first time
    assert other[1]["stdout"] == "2\n", other  # a new id runs again
    assert (Path(run.workdir) / "executions.txt").read_text() == "ran\nran\n"
