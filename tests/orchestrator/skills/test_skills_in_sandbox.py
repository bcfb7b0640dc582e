"""Skills as a sandbox sees them: a real process-backend agent (as the user's own uid when the
tests run as root) reads a skill through the session link -> view -> version chain, and
cannot change it."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.agent_env import agent_client, agent_data_dir, agent_service, traversable_tmp  # noqa: F401 - fixtures
from tests.api_calls import tool
from tests.mounts.skillstore.conftest import write_skill

OWNER, MEMBER = 17, 67


def test_a_member_reads_its_skills_in_its_sandbox_and_cannot_write_them(
    agent_client: TestClient, agent_service: OrchestratorService
) -> None:
    layout = agent_service.layout
    assert agent_service.skills_watcher is not None and agent_service.skills_watcher.wait_ready()
    write_skill(layout.skill_source("pdf"), {"SKILL.md": "# pdf\n", "scripts/fill.py": "print('fill')\n"},
                executable=("scripts/fill.py",))
    write_skill(layout.userskill_source(MEMBER, "qin-notes"), {"SKILL.md": "qin's notes\n"})
    write_skill(layout.userskill_source(OWNER, "alice-private"), {"SKILL.md": "alice only\n"})
    body = {"owner_user_id": OWNER, "channel": "feishu_group", "group": {"channel": "feishu", "chat_id": "oc_sk"}}
    sid = agent_client.post("/v1/sessions", json=body).json()["session_id"]
    run = agent_client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": MEMBER})
    run = run.json()
    rid = run["run_id"]
    catalog = {e["name"]: e["path"] for e in run["skills"]["catalog"]}
    assert set(catalog) == {"pdf", "qin-notes"}

    # relative to the workdir, and by the catalog's absolute path
    assert tool(agent_client, rid, "read_file", path="skills/pdf/SKILL.md")["result"]["content"] == "# pdf\n"
    fill = tool(agent_client, rid, "read_file", path=f"{catalog['pdf']}/scripts/fill.py")
    assert fill["ok"] is True and fill["result"]["content"] == "print('fill')\n"
    notes = tool(agent_client, rid, "read_file", path=f"{catalog['qin-notes']}/SKILL.md")
    assert notes["result"]["content"] == "qin's notes\n"
    listing = tool(agent_client, rid, "list_dir", path="skills/pdf")
    assert listing["ok"] is True and {e["name"] for e in listing["result"]["entries"]} == {"SKILL.md", "scripts"}

    # writes through a skill link end in a read-only root
    refused = tool(agent_client, rid, "write_file", path="skills/pdf/SKILL.md", content="pwned")
    assert refused["ok"] is False and refused["error"]["code"] == "read_only"
    shell = tool(agent_client, rid, "shell",
                 command="cat skills/pdf/SKILL.md; echo pwned > skills/pdf/SKILL.md; rm -f skills/pdf/scripts/fill.py;"
                         " chmod 777 skills/pdf/SKILL.md; echo done")
    assert shell["ok"] is True and "# pdf" in shell["result"]["stdout"] and "done" in shell["result"]["stdout"]
    fp = agent_service.skills.views.current(MEMBER, "pdf")
    assert fp is not None and agent_service.skills.store.verify_entry(fp, "pdf") is None
    assert (Path(catalog["pdf"]) / "SKILL.md").read_text() == "# pdf\n"

    # the owner's personal skill is nowhere in the member's sandbox
    owner_skill = str(layout.userskill_source(OWNER, "alice-private") / "SKILL.md")
    denied = tool(agent_client, rid, "read_file", path=owner_skill)
    assert denied["ok"] is False
    if os.geteuid() == 0:
        base = agent_service.settings.sandbox_uid_base
        for path, user in ((layout.user_views_dir(MEMBER), MEMBER), (layout.userskills_dir(MEMBER), MEMBER)):
            st = path.stat()
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, base + user, 0o750), path
        # The owner's personal skills were created while the service ran: the watcher gives
        # the new userskills/{owner} its policy, after which the member's own uid cannot read it.
        deadline = time.monotonic() + 10
        while stat.S_IMODE(layout.userskills_dir(OWNER).stat().st_mode) != 0o750:
            assert time.monotonic() < deadline, "userskills/17 never got its policy"
            time.sleep(0.05)
        cat = tool(agent_client, rid, "shell", command=f"cat {owner_skill}")["result"]
        assert cat["exit_code"] != 0 and "alice only" not in cat["stdout"]
