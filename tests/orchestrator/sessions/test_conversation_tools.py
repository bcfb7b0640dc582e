"""orchestrator/tools/conversation_tools.py through the API: the cross-session acceptance matrix, the
fail-closed identity rule, the output format, search scoping, and the audit of every call."""

from __future__ import annotations

import pytest

from orchestrator import audit
from orchestrator.service import OrchestratorService
from orchestrator.sessions.transcript_view import CONVERSATION_NOTICE
from tests.orchestrator.sessions.conftest import GROUP, SessionsApi


@pytest.fixture
def world(api: SessionsApi) -> SessionsApi:
    """Owner 17: A and B in project p1, C in p2, P personal; owner 18: D in p1."""
    for sid, owner, project in [("A", 17, "p1"), ("B", 17, "p1"), ("C", 17, "p2"), ("D", 18, "p1"), ("P", 17, None)]:
        api.create(sid, owner, project=project, title=f"title {sid}")
        assert api.say(sid, f"hello from {sid}", f"secret of {sid}").status_code == 200
    return api


def read(api: SessionsApi, run: dict, target: str, **extra) -> dict:
    return api.tool(run, "read_conversation", conversation_id=target, **extra)


def listed(api: SessionsApi, run: dict) -> list[str]:
    outcome = api.tool(run, "list_conversations")
    assert outcome["ok"], outcome
    return [c["conversation_id"] for c in outcome["result"]["conversations"]]


def refused(outcome: dict, code: str) -> dict:
    assert outcome["ok"] is False, outcome
    assert outcome["error"]["code"] == code, outcome
    return outcome["error"]


def not_found_like_unknown(api: SessionsApi, run: dict, target: str) -> None:
    error = refused(read(api, run, target), "not_found")
    unknown = refused(read(api, run, "no-such-id"), "not_found")
    assert error == {**unknown, "message": unknown["message"].replace("no-such-id", target), "conversation_id": target}


# the acceptance table, row by row -----------------------------------------------------------
def test_all_off_by_default(world: SessionsApi) -> None:
    run = world.run("A")
    refused(read(world, run, "B"), "forbidden")
    refused(world.tool(run, "list_conversations"), "forbidden")


def test_normal(world: SessionsApi) -> None:
    world.gate("p1", True)
    run = world.run("A")
    outcome = read(world, run, "B")
    assert outcome["ok"], outcome
    assert outcome["result"].startswith(CONVERSATION_NOTICE.format(conversation_id="B"))
    assert "secret of B" in outcome["result"]
    assert listed(world, run) == ["B"]  # not A itself, not C (p2), not D (owner 18), not P (personal)


def test_outbound_off(world: SessionsApi) -> None:
    world.gate("p1", True)
    assert world.patch("A", allow_cross_read=False).status_code == 200
    run = world.run("A")
    error = refused(read(world, run, "B"), "forbidden")
    assert "allow_cross_read" in error["message"]
    refused(world.tool(run, "list_conversations"), "forbidden")


def test_target_private_is_refused_and_not_listed(world: SessionsApi) -> None:
    world.gate("p1", True)
    world.create("E", 17, project="p1")
    assert world.patch("B", cross_private=True).status_code == 200
    run = world.run("A")
    not_found_like_unknown(world, run, "B")
    assert listed(world, run) == ["E"]


def test_cross_project_looks_like_not_found(world: SessionsApi) -> None:
    world.gate("p1", True)
    world.gate("p2", True)
    not_found_like_unknown(world, world.run("A"), "C")


def test_cross_owner_looks_like_not_found(world: SessionsApi) -> None:
    world.gate("p1", True)
    not_found_like_unknown(world, world.run("A"), "D")
    not_found_like_unknown(world, world.run("D"), "A")


def test_self_read(world: SessionsApi) -> None:
    world.gate("p1", True)
    outcome = read(world, world.run("A"), "A")
    assert outcome["ok"] and "secret of A" in outcome["result"]


def test_archived_target_is_read_and_listed_marked(world: SessionsApi) -> None:
    world.gate("p1", True)
    assert world.patch("B", archived=True).status_code == 200
    run = world.run("A")
    (entry,) = world.tool(run, "list_conversations")["result"]["conversations"]
    assert entry["conversation_id"] == "B" and entry["archived"] is True
    outcome = read(world, run, "B")
    assert outcome["ok"] and "archived: yes" in outcome["result"]


# beyond the table -------------------------------------------------------------------------
def test_a_group_member_running_in_the_owners_session_is_refused(world: SessionsApi, client) -> None:
    world.gate("p1", True)
    world.create("G", 17, project="p1", group=GROUP)
    member_run = world.run("G", "group_message", speaker=67)
    assert member_run["runtime_user_id"] == 67
    for name, args in [("list_conversations", {}), ("read_conversation", {"conversation_id": "B"}),
                       ("session_search", {"query": "secret"})]:
        error = refused(world.tool(member_run, name, **args), "forbidden")
        assert "member 67" in error["message"]
    # owner mode: the runtime identity is the owner, but a member triggered it: still refused
    from tests.conftest import admin_headers

    assert client.put("/v1/admin/runtime-identity", json={"mode": "owner"}, headers=admin_headers()).status_code == 200
    owner_mode_run = world.run("G", "group_message", speaker=67)
    assert owner_mode_run["runtime_user_id"] == 17
    refused(read(world, owner_mode_run, "B"), "forbidden")
    # the owner speaking in the same group session may read
    assert read(world, world.run("G", "group_message", speaker=17), "B")["ok"]


def test_the_formula_is_checked_on_every_call(world: SessionsApi) -> None:
    world.gate("p1", True)
    run = world.run("A")
    assert read(world, run, "B")["ok"]
    world.gate("p1", False)
    refused(read(world, run, "B"), "forbidden")
    world.gate("p1", True)
    assert world.patch("B", cross_private=True).status_code == 200
    refused(read(world, run, "B"), "not_found")
    assert world.patch("B", cross_private=False).status_code == 200
    assert world.delete("B").status_code == 200
    not_found_like_unknown(world, run, "B")


def test_every_call_is_audited_with_its_verdict(world: SessionsApi, service: OrchestratorService) -> None:
    run = world.run("A")
    read(world, run, "B")  # gate closed
    world.gate("p1", True)
    read(world, run, "B")
    read(world, run, "D")
    world.tool(run, "list_conversations")
    world.tool(run, "session_search", query="hello")
    entries = list(reversed(audit.entries(service.store, session_id="A")))
    mine = [(e.action, e.detail.get("target"), e.detail["verdict"]) for e in entries if e.action.startswith("conversation.")]
    assert mine == [
        ("conversation.read", "B", "project_gate_closed"),
        ("conversation.read", "B", "allowed"),
        ("conversation.read", "D", "other_scope"),
        ("conversation.list", None, "allowed"),
        ("conversation.search", None, "allowed"),
    ]
    assert all(e.runtime_user_id == 17 and e.detail["run_id"] == run["run_id"] for e in entries if e.action.startswith("conversation."))


def test_tool_calls_appear_as_name_and_status_and_text_is_capped(world: SessionsApi) -> None:
    world.gate("p1", True)
    calls = [{"name": "shell", "status": "error"}, {"name": "read_file", "status": "ok"}]
    world.say("B", "let me check", role="assistant", tool_calls=calls)
    world.say("B", "TOOL-OUTPUT-" + "z" * 500, role="tool")
    world.say("B", "w" * 10_000, role="assistant")
    text = read(world, world.run("A"), "B")["result"]
    assert "tool calls: shell (error), read_file (ok)" in text
    assert "TOOL-OUTPUT" not in text and "(tool result, 512 characters, not shown)" in text
    assert "w" * 4_000 in text and "w" * 4_001 not in text and "[6000 more characters cut]" in text


def test_limit_defaults_to_50_and_is_at_most_200(world: SessionsApi) -> None:
    world.gate("p1", True)
    world.say("B", *[f"m{i}" for i in range(60)])  # B now has 62 messages
    run = world.run("A")
    text = read(world, run, "B")["result"]
    assert "the last 50 of 62" in text and "[#13 user" in text and "[#12 user" not in text
    assert "the last 5 of 62" in read(world, run, "B", limit=5)["result"]
    assert "the last 62 of 62" in read(world, run, "B", limit=200)["result"]
    error = refused(read(world, run, "B", limit=201), "invalid_arguments")
    assert error["field"] == "limit"
    refused(read(world, run, "../etc"), "invalid_arguments")


def test_the_whole_output_stays_under_the_cap_keeping_the_newest(world: SessionsApi) -> None:
    world.gate("p1", True)
    world.say("B", *[f"msg{i} " + "x" * 3_000 for i in range(12)])
    text = read(world, world.run("A"), "B")["result"]
    cap = world.service.settings.conversation_read_max_chars
    assert len(text) <= cap
    assert text.startswith("[Untrusted content]") and "msg11 " in text and "msg0 " not in text
    assert "earlier messages left out" in text


def test_search_stays_in_the_owners_scope(world: SessionsApi) -> None:
    world.create("Q", 17, title="other personal")
    world.say("Q", "Deploy the BILLING service")
    world.create("R", 18)
    world.say("R", "deploy billing for someone else")
    personal = world.tool(world.run("P"), "session_search", query="billing deploy")["result"]
    assert personal.startswith("[Untrusted content]")
    assert "conversation Q" in personal and "conversation R" not in personal
    # project scope: gate closed → only the conversation itself
    world.say("B", "billing in B")
    world.say("A", "billing in A")
    project_run = world.run("A")
    closed = world.tool(project_run, "session_search", query="billing")["result"]
    assert "conversation A" in closed and "conversation B" not in closed and "conversation Q" not in closed
    world.gate("p1", True)
    opened = world.tool(project_run, "session_search", query="billing")["result"]
    assert "conversation A" in opened and "conversation B" in opened and "conversation Q" not in opened
    assert world.patch("B", cross_private=True).status_code == 200
    assert "conversation B" not in world.tool(project_run, "session_search", query="billing")["result"]
    refused(world.tool(project_run, "session_search", query="   "), "invalid_arguments")


def test_search_caps_hits_per_conversation(world: SessionsApi) -> None:
    world.say("P", *[f"needle {i}" for i in range(9)])
    text = world.tool(world.run("P"), "session_search", query="NEEDLE")["result"]
    assert "1 conversation(s); 5 match(es)" in text
    assert "needle 8" in text and "needle 3" not in text  # newest first


def test_deleted_sessions_vanish_from_list_read_and_search(world: SessionsApi) -> None:
    world.gate("p1", True)
    run = world.run("A")
    world.create("E", 17, project="p1")
    world.say("E", "findme")
    assert "E" in listed(world, run)
    assert world.delete("E").status_code == 200
    assert "E" not in listed(world, run)
    not_found_like_unknown(world, run, "E")
    assert "(no matches)" in world.tool(run, "session_search", query="findme")["result"]
