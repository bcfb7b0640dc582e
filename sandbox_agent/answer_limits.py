"""How much the orchestrator accepts from an agent, and the output caps re-applied on the host.

An agent runs next to code the host does not trust and can be made to lie on its socket, so
nothing it answers is read unbounded: a JSON answer may be as large as the agent's own caps
allow in the worst case (every text field at the output cap, each byte JSON-escaped, plus the
listings' paths), a raw `read_bytes` answer `read_bytes_max` plus a margin. Pure: values in,
values out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sandbox_agent.tools.output import truncation_marker
from sandbox_agent.wire import TOOL_PATH_MAX, AgentLimits

# A JSON string may cost 6 bytes a byte (`\u00XX`); a shell answer has two capped fields.
_JSON_ESCAPE = 6
_TEXT_FIELDS = 2
RAW_MARGIN_BYTES = 64 * 1024
HEADER_MAX_BYTES = 64 * 1024  # the status line and headers of one answer


@dataclass(frozen=True)
class AnswerLimits:
    output_cap_bytes: int
    max_json_bytes: int
    max_raw_bytes: int
    max_stream_bytes: int = 0  # the output events of one streamed shell, JSON-escaped

    @classmethod
    def of(cls, limits: AgentLimits) -> AnswerLimits:
        listed = max(limits.list_max_entries, limits.glob_max_results, limits.grep_max_matches)
        return cls(
            output_cap_bytes=limits.output_cap_bytes,
            max_json_bytes=_JSON_ESCAPE * _TEXT_FIELDS * limits.output_cap_bytes + listed * 2 * TOOL_PATH_MAX,
            max_raw_bytes=limits.read_bytes_max + RAW_MARGIN_BYTES,
            # Each event's few framing bytes are paid for by the minimum the agent reads at once.
            max_stream_bytes=_JSON_ESCAPE * limits.shell_stream_max_bytes + RAW_MARGIN_BYTES,
        )


DEFAULT_ANSWER_LIMITS = AnswerLimits.of(AgentLimits())


def cap_text_fields(value: Any, cap: int) -> tuple[Any, bool]:
    """`value` with every string longer than `cap` UTF-8 bytes cut to `cap` and marked the way
    the agent marks its own cuts; and whether anything was cut."""
    if isinstance(value, str):
        if len(value) * 4 <= cap:  # cannot exceed the cap in UTF-8: no encoding needed
            return value, False
        data = value.encode("utf-8", "surrogatepass")
        if len(data) <= cap:
            return value, False
        kept = data[:cap].decode("utf-8", "ignore")  # "ignore": the last character may be split
        return kept + truncation_marker(len(data) - cap), True
    if isinstance(value, dict):
        cut_any = False
        out: dict[Any, Any] = {}
        for key, item in value.items():
            out[key], cut = cap_text_fields(item, cap)
            cut_any |= cut
        if cut_any and "truncated" in out:
            out["truncated"] = True
        return out, cut_any
    if isinstance(value, list):
        items = [cap_text_fields(item, cap) for item in value]
        return [item for item, _ in items], any(cut for _, cut in items)
    return value, False
