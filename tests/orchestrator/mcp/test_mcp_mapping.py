"""The pure parts of the MCP surface: the annotation table, the result mapping, skill URIs and
SKILL.md front matter."""

from __future__ import annotations

import pytest

from orchestrator.mcp.annotations import TOOL_HINTS
from orchestrator.mcp.endpoint import wants_stream
from orchestrator.mcp.server import tool_call_id_of
from orchestrator.mcp.skill_resources import BadSkillUri, SkillFile, front_matter, parse_uri
from orchestrator.mcp.tool_results import call_result, mcp_tools
from orchestrator.service import OrchestratorService
from mcp.shared.exceptions import MCPError


def test_every_registered_tool_has_an_annotation_decision(service: OrchestratorService) -> None:
    described = service.tools.describe()
    missing = [tool["name"] for tool in described if tool["name"] not in TOOL_HINTS]
    assert missing == [], f"add a row to orchestrator/mcp/annotations.py for {missing}"
    assert [tool.name for tool in mcp_tools(described)] == [tool["name"] for tool in described]


def test_a_tool_without_a_decision_is_left_out_and_a_decision_without_a_tool_is_absent() -> None:
    described = [{"name": "brand_new", "description": "d", "parameters": {"type": "object"}, "acts_as": "runtime", "place": "host"}]
    assert mcp_tools(described) == []
    assert "process_start" in TOOL_HINTS  # decided before the tool exists: listed once registered


def test_hints_are_consistent() -> None:
    for name, hints in TOOL_HINTS.items():
        assert not (hints.read_only and hints.destructive), name
        annotations = hints.annotations()
        assert annotations.read_only_hint is hints.read_only
        assert annotations.destructive_hint is (None if hints.read_only else hints.destructive)


def test_results_map_to_text_plus_structured_content_and_failures_to_is_error() -> None:
    ok = call_result({"ok": True, "result": {"path": "/x", "bytes_written": 3}})
    assert ok.is_error is False and ok.structured_content == {"path": "/x", "bytes_written": 3}
    assert ok.content[0].text == '{"path": "/x", "bytes_written": 3}'
    listed = call_result({"ok": True, "result": [1, 2]})
    assert listed.structured_content == {"result": [1, 2]}
    error = {"code": "foreign_upload_path", "message": "Use http://h/uploads/5/a.png", "url": "http://h/uploads/5/a.png"}
    failed = call_result({"ok": False, "error": error})
    assert failed.is_error is True and failed.content[0].text == error["message"] and failed.structured_content == error


def test_skill_uris_round_trip_and_refuse_everything_else() -> None:
    file = SkillFile("pdf", "scripts/make table.py")
    assert file.uri == "skill://pdf/scripts/make%20table.py"
    assert parse_uri(file.uri) == file
    assert parse_uri("skill://pdf/文档/说明.md").path == "文档/说明.md"
    for bad in [
        "skill://pdf/../x", "skill://pdf/%2e%2e/x", "skill://pdf/a%2Fb", "skill://pdf/", "skill://pdf",
        "skill://../x", "skill://.hidden/x", "skill://pdf//x", "skill://pdf/x?y=1", "skill://pdf/x#f",
        "file:///etc/passwd", "skill://pdf/%00", "skill://pdf/%ff", "skill://-pdf/x", "skill://pdf/a/./b",
    ]:
        with pytest.raises(BadSkillUri):
            parse_uri(bad)


def test_front_matter_names_and_descriptions() -> None:
    assert front_matter("---\nname: pdf\ndescription: Make PDFs\n---\n# x").description == "Make PDFs"
    quoted = front_matter("---\nname: 'pdf: tools'\ndescription: \"a: b\"\n---\n")
    assert (quoted.name, quoted.description) == ("pdf: tools", "a: b")
    folded = front_matter("---\ndescription: >\n  one\n  two\nname: n\n---\n")
    assert (folded.name, folded.description) == ("n", "one two")
    literal = front_matter("---\ndescription: |\n  one\n  two\n---\n")
    assert literal.description == "one\ntwo"
    assert front_matter("# no front matter\nname: x").name is None
    assert front_matter("---\nname: never closed\n").name is None
    assert front_matter("---\n  name: indented\n---\n").name is None
    assert len(front_matter("---\ndescription: " + "x" * 5000 + "\n---\n").description or "") == 1024


def test_tool_call_ids_ride_in_meta_bounded() -> None:
    assert tool_call_id_of(None) is None and tool_call_id_of({}) is None
    assert tool_call_id_of({"tool_call_id": "c-1"}) == "c-1"
    for bad in ["", "x" * 201, 5]:
        with pytest.raises(MCPError):
            tool_call_id_of({"tool_call_id": bad})


def test_only_a_request_for_progress_is_answered_as_a_stream() -> None:
    assert wants_stream(b'{"params": {"_meta": {"progressToken": 1}}}')
    assert not wants_stream(b'{"method": "tools/call", "params": {"name": "read_file"}}')


def test_an_mcp_post_may_be_as_large_as_a_tool_call(service: OrchestratorService) -> None:
    from orchestrator.http.request_guard import body_limit
    from orchestrator.settings import ApiSettings

    settings = ApiSettings.of(service.settings)
    assert body_limit("POST", "/v1/runs/r-1/mcp", settings) == body_limit("POST", "/v1/runs/r-1/tools/write_file", settings)
    assert body_limit("POST", "/v1/runs/r-1/mcp/x", settings) == settings.http_body_max_bytes
