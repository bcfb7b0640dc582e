"""One live `orchestrator serve` app (real sockets, process-backend agents) for the MCP tests of
a module, with a system skill (and a broken one) in its data dir, and helpers to open an MCP
client session of a run with the official SDK."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.client import OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import ADMIN_TOKEN, API_TOKEN, TEST_ROOT, make_settings
from tests.live_server import free_port, live_server

OWNER, MEMBER = 17, 67
SKILL = "mcp-demo"
BROKEN_SKILL = "mcp-broken"
SKILL_DOC = """---
name: MCP demo
description: >
  Shows how a skill reaches an MCP client
  as resources.
---
# MCP demo skill
Run scripts/hello.sh.
"""


@dataclass(frozen=True)
class Live:
    url: str
    service: OrchestratorService
    data: Path


def write_skills(data: Path) -> None:
    skill = data / "skills" / SKILL
    (skill / "scripts").mkdir(parents=True)
    (skill / "SKILL.md").write_text(SKILL_DOC)
    (skill / "scripts" / "hello.sh").write_text("#!/bin/sh\necho hello\n")
    broken = data / "skills" / BROKEN_SKILL
    broken.mkdir()
    (broken / "SKILL.md").write_text("---\nname: broken\ndescription: leaves its tree\n---\n")
    os.symlink("/etc/passwd", broken / "escape")  # an absolute link: the skill fails, never linked
    for path in [data / "skills", skill, skill / "scripts", broken]:
        path.chmod(0o755)


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    base = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="orch-mcp-"))
    os.chmod(base, 0o711)
    data = base / "data"
    data.mkdir()
    write_skills(data)
    port = free_port()
    settings = make_settings(data, public_base_url=f"http://127.0.0.1:{port}", mcp_progress_interval_s=0.2)
    service = OrchestratorService(settings)
    try:
        with live_server(create_app(service), port) as url:
            yield Live(url, service, data)
    finally:
        service.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def bot(live: Live) -> Iterator[OrchestratorClient]:
    with OrchestratorClient(live.url, token=API_TOKEN, admin_token=ADMIN_TOKEN) as client:
        yield client
