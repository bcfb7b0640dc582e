"""The skill-view attack from inside a sandbox, for every container-like backend's isolation
test (docker, kubernetes): B reads its skills through the session link, the write through the
API is refused, and the skill views test's attack (tests/mounts/skillstore/test_skill_views.py)
run by B's `shell` changes nothing of the content store."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from fastapi.testclient import TestClient

from mounts.layout import DataLayout
from tests.api_calls import group_session, start_run, tool
from tests.mounts.skillstore.test_skill_views import ATTACK

SKILLS = {
    "pdf": {"SKILL.md": "# pdf\n", "scripts/fill.py": "print(1)\n", "ref/a.md": "a" * 5000},
    "xlsx": {"SKILL.md": "# xlsx\n", "x.txt": "x"},
}


def write_skills(layout: DataLayout) -> None:
    for name, files in SKILLS.items():
        for rel, text in files.items():
            path = layout.skill_source(name) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def attack_skill_views(client: TestClient, layout: DataLayout, user_id: int) -> None:
    """`write_skills` ran before the service started; `user_id` speaks in a group session."""
    sid = group_session(client)
    run = start_run(client, sid, trigger="group_message", speaker_user_id=user_id)
    assert sorted(run["skills"]["available"]) == sorted(SKILLS)
    stored = {
        path: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in layout.content_store.rglob("*")
        if path.is_file() and not path.is_symlink()
    }
    assert len(stored) >= 5  # the five skill files, and the store's manifests

    # The model reads a skill through its session link, inside the sandbox.
    skill_md = f"{run['workdir']}/skills/pdf/SKILL.md"
    assert tool(client, run["run_id"], "read_file", path=skill_md)["result"]["content"].startswith("# pdf")
    refused = tool(client, run["run_id"], "write_file", path=skill_md, content="pwned")
    assert refused["ok"] is False and refused["error"]["code"] == "read_only"

    files, dirs, links = [], [], []
    for name in SKILLS:
        for base in (layout.user_view(user_id, name), Path(run["workdir"]) / "skills" / name):
            for root, dirnames, filenames in os.walk(base):
                if Path(root) != Path(run["workdir"]) / "skills" / name:
                    dirs.append(root)
                files += [os.path.join(root, f) for f in filenames if not os.path.islink(os.path.join(root, f))]
        links.append(str(layout.user_view(user_id, name)))
    dirs += [str(layout.user_views_dir(user_id)), str(layout.user_view_versions_dir(user_id))]
    assert len(files) == 2 * 5
    # The attack of the skill views test, now as the user's uid inside its sandbox, via `shell`.
    own_dir = f"{run['workdir']}/attack-own"
    assert tool(client, run["run_id"], "write_file", path="attack.py", content=ATTACK)["ok"]
    assert tool(client, run["run_id"], "write_file", path="attack.json",
                content=json.dumps([files, dirs, links, own_dir]))["ok"]  # fmt: skip
    answer = tool(
        client,
        run["run_id"],
        "shell",
        command=f"mkdir -p {own_dir} && test ! -e {layout.content_store} && python3 attack.py \"$(cat attack.json)\"",
    )
    assert answer["ok"] is True, answer
    result = answer["result"]
    assert result["exit_code"] == 0, result
    report = json.loads(result["stdout"])
    assert report["reads"] == len(files)  # the views are readable by their user
    assert (Path(own_dir) / "control").read_text() == "ok"  # and the attacker ran with rights
    assert [o for o in report["outcomes"] if o[2] == "succeeded"] == []
    # EROFS: the read-only mount; EXDEV: no hard link out of it; EBUSY: a mount point
    assert {o[2] for o in report["outcomes"]} <= {"EACCES", "EPERM", "EROFS", "EXDEV", "EBUSY"}
    for path, digest in stored.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
        assert stat.S_IMODE(path.stat().st_mode) in (0o444, 0o555) and path.stat().st_uid == 0
