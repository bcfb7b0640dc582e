"""The MCP endpoint with every user in their own Docker container: skills read as resources
inside the member's container, its shell, and the diagnostics, through the official client."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from orchestrator.client import OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.mcp.connect import run_session
from orchestrator.service import OrchestratorService
from tests.conftest import API_TOKEN
from tests.live_server import free_port, live_server
from tests.orchestrator.mcp.conftest import MEMBER, OWNER, SKILL, write_skills
from tests.orchestrator.sandboxes.docker.conftest import docker_data_dir, docker_settings, sandbox_image  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_a_member_in_a_container_through_mcp(docker_data_dir: Path, sandbox_image: str) -> None:  # noqa: F811
    write_skills(docker_data_dir)
    port = free_port()
    service = OrchestratorService(docker_settings(docker_data_dir, sandbox_image, public_base_url=f"http://127.0.0.1:{port}"))
    try:
        with live_server(create_app(service), port) as url, OrchestratorClient(url, token=API_TOKEN) as bot:
            session = bot.create_session(owner_user_id=OWNER, channel="feishu_group", group=("feishu", "oc_mcp_docker"))
            owner_run = bot.start_run(session.session_id, trigger="group_message", speaker_user_id=OWNER)
            bot.call_tool(owner_run.run_id, "write_file", {"path": "a.png", "content": "x"}).raise_for_error()
            published = bot.call_tool(owner_run.run_id, "publish_artifact", {"path": "a.png"}).raise_for_error().result
            member_run = bot.start_run(session.session_id, trigger="group_message", speaker_user_id=MEMBER)

            async def scenario() -> None:
                async with run_session(url, member_run.run_id, API_TOKEN) as (mcp, initialized):
                    assert "## Runtime identity" in (initialized.instructions or "")
                    uris = [r.uri for r in (await mcp.list_resources()).resources]
                    assert f"skill://{SKILL}/scripts/hello.sh" in uris
                    script = await mcp.read_resource(f"skill://{SKILL}/scripts/hello.sh")
                    assert script.contents[0].text == "#!/bin/sh\necho hello\n"
                    shell = await mcp.call_tool("shell", {"command": f"sh skills/{SKILL}/scripts/hello.sh; id -u"})
                    assert shell.structured_content["stdout"].split() == ["hello", str(service.settings.sandbox_uid_base + MEMBER)]
                    refused = await mcp.call_tool("read_file", {"path": published["path"]})
                    assert refused.is_error and refused.structured_content["code"] == "foreign_upload_path"

            anyio.run(scenario)
            assert {s.backend for s in service.sandboxes.status()} == {"docker"}
    finally:
        service.close()
