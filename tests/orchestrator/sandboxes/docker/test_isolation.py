"""Real Docker: from B's container, A's runtime, uploads and home are not there;
skill views are read-only and the content store cannot be changed by anything B runs; there
is no network. Everything runs through the API, as a model's tool calls would."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.service import OrchestratorService
from tests.mounts.skillstore.test_skill_views import ATTACK
from tests.api_calls import group_session, start_run, tool

pytestmark = [pytest.mark.docker, pytest.mark.slow]

A, B = 17, 67


def shell(client: TestClient, run_id: str, command: str) -> dict:
    answer = tool(client, run_id, "shell", command=command)
    assert answer["ok"] is True, answer
    return answer["result"]


def test_b_cannot_see_as_runtime_uploads_or_home_and_there_is_no_network(
    docker_client: TestClient, docker_service: OrchestratorService
) -> None:
    layout = docker_service.layout
    sid = group_session(docker_client)
    a_run = start_run(docker_client, sid, trigger="web")
    assert tool(docker_client, a_run["run_id"], "write_file", path="secret.txt", content="A's")["ok"]
    assert tool(docker_client, a_run["run_id"], "write_file", path=f"{a_run['upload_dir']}/a.png", content="png")["ok"]
    assert tool(docker_client, a_run["run_id"], "write_file", path=f"{layout.home_dir(A)}/.netrc", content="x")["ok"]

    b_run = start_run(docker_client, sid, trigger="group_message", speaker_user_id=B)
    assert b_run["runtime_user_id"] == B
    a_places = [layout.runtime_user_dir(A), a_run["workdir"], layout.uploads_dir(A), layout.home_dir(A),
                layout.deps_dir(A), layout.tmp_dir(A), layout.socket_dir(A), layout.state_dir,
                layout.sessions_root, layout.content_store]  # fmt: skip
    for place in a_places:
        # `shell` goes around the PathSandbox: only the container's mounts keep A's files away.
        result = shell(docker_client, b_run["run_id"], f"ls -a {place}; cat {place}/secret.txt {place}/a.png")
        assert result["exit_code"] != 0, place
        assert "No such file or directory" in result["stderr"], place
        assert "A's" not in result["stdout"] and "png" not in result["stdout"]
    # B's own places are there and B's own
    mine = shell(docker_client, b_run["run_id"], f"id -u; stat -c %u {layout.home_dir(B)} {b_run['upload_dir']} /tmp")
    assert mine["stdout"].split() == [str(docker_service.settings.sandbox_uid_base + B)] * 4

    # no network: only the loopback interface, and the host's loopback services are not reachable
    probe = (
        "import socket; print([n for _, n in socket.if_nameindex()]);"
        "s = socket.socket(); s.settimeout(2)\n"
        "try:\n s.connect(('127.0.0.1', 8700)); print('connected')\n"
        "except OSError as e: print('refused', e.errno)"
    )
    result = shell(docker_client, b_run["run_id"], f"python3 -c \"{probe}\"")
    assert result["stdout"].splitlines() == ["['lo']", "refused 111"]


def test_skill_views_are_read_only_and_the_store_survives_an_attack_from_inside(
    docker_client: TestClient, docker_service: OrchestratorService
) -> None:
    layout = docker_service.layout
    for name, files in {"pdf": {"SKILL.md": "# pdf\n", "scripts/fill.py": "print(1)\n", "ref/a.md": "a" * 5000},
                        "xlsx": {"SKILL.md": "# xlsx\n", "x.txt": "x"}}.items():  # fmt: skip
        for rel, text in files.items():
            path = layout.skill_source(name) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    sid = group_session(docker_client)
    run = start_run(docker_client, sid, trigger="group_message", speaker_user_id=B)
    assert sorted(run["skills"]["available"]) == ["pdf", "xlsx"]
    stored = {
        path: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in layout.content_store.rglob("*")
        if path.is_file() and not path.is_symlink()
    }
    assert len(stored) >= 5  # the five skill files, and the store's manifests

    # The model reads a skill through its session link, inside B's container.
    skill_md = f"{run['workdir']}/skills/pdf/SKILL.md"
    assert tool(docker_client, run["run_id"], "read_file", path=skill_md)["result"]["content"].startswith("# pdf")
    refused = tool(docker_client, run["run_id"], "write_file", path=skill_md, content="pwned")
    assert refused["ok"] is False and refused["error"]["code"] == "read_only"

    files, dirs, links = [], [], []
    for name in ("pdf", "xlsx"):
        for base in (layout.user_view(B, name), Path(run["workdir"]) / "skills" / name):
            for root, dirnames, filenames in os.walk(base):
                if Path(root) != Path(run["workdir"]) / "skills" / name:
                    dirs.append(root)
                files += [os.path.join(root, f) for f in filenames if not os.path.islink(os.path.join(root, f))]
        links.append(str(layout.user_view(B, name)))
    dirs += [str(layout.user_views_dir(B)), str(layout.user_view_versions_dir(B))]
    assert len(files) == 2 * 5
    # The attack of the skill views test, now as B's uid inside B's container, via `shell`.
    own_dir = f"{run['workdir']}/attack-own"
    assert tool(docker_client, run["run_id"], "write_file", path="attack.py", content=ATTACK)["ok"]
    assert tool(docker_client, run["run_id"], "write_file", path="attack.json",
                content=json.dumps([files, dirs, links, own_dir]))["ok"]  # fmt: skip
    result = shell(
        docker_client,
        run["run_id"],
        f"mkdir -p {own_dir} && test ! -e {layout.content_store} && python3 attack.py \"$(cat attack.json)\"",
    )
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
