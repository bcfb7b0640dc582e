"""What the clients' iterators yield, and the parsing they share (sync and async alike):
`stream_shell` (the Server-Sent Events of `POST /v1/runs/{run_id}/tools/shell` with
`Accept: text/event-stream`) and `process_output(..., follow=True)` (long polls of
`process_output` from cursor to cursor until the process is complete). docs/processes.md."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.client.errors import ApiError, InvalidResponseError
from orchestrator.client.models import ToolResult
from orchestrator.client.routes import Call, Request, segment, tool_call_timeout_s

FOLLOW_WAIT_S = 30.0  # each long poll of a followed process
EVENT_STREAM = "text/event-stream"


@dataclass(frozen=True)
class ShellEvent:
    """One event of a streamed shell: `output` (stream and text as they came) or the final
    `result` (the same `ToolResult` a plain call returns)."""

    kind: Literal["output", "result"]
    stream: str | None = None
    text: str = ""
    result: ToolResult | None = None


@dataclass(frozen=True)
class OutputChunk:
    """A piece of a background process's output: its stream (stdout, stderr, pty), the byte
    cursor where it starts, and its text."""

    stream: str
    cursor: int
    text: str


@dataclass
class SseParser:
    """Server-Sent Events, line by line: yields (event, data) when an event is complete."""

    _event: str = "message"
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> Iterator[tuple[str, str]]:
        if line == "":
            if self._data:
                yield self._event, "\n".join(self._data)
            self._event, self._data = "message", []
        elif line.startswith("event:"):
            self._event = line[6:].strip()
        elif line.startswith("data:"):
            self._data.append(line[5:].removeprefix(" "))


def shell_event(event: str, data: str) -> ShellEvent | None:
    """The event as the iterator yields it; an `error` event raises the server's error."""
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise InvalidResponseError(f"a streamed event that is not JSON: {exc}", code="invalid_response") from exc
    if event == "output" and isinstance(body, dict):
        return ShellEvent("output", stream=str(body.get("stream")), text=str(body.get("text", "")))
    if event == "result" and isinstance(body, dict):
        return ShellEvent("result", result=ToolResult.of("shell", body))
    if event == "error" and isinstance(body, dict):  # the call failed after the stream began
        error = dict(body.get("error") or {})
        code, message = str(error.pop("code", "stream_error")), str(error.pop("message", "the streamed call failed"))
        raise ApiError(message, code=code, status=200, field=error.pop("field", None), details=error)
    return None  # an event this client does not know: skipped


def shell_stream_call(
    run_id: str, command: str, timeout_s: float | None, tool_call_id: str | None, default_timeout_s: float
) -> Call[None]:
    """The request of a streamed shell (the client adds `Accept: text/event-stream`)."""
    arguments: dict[str, Any] = {"command": command}
    if timeout_s is not None:
        arguments["timeout_s"] = timeout_s
    body: dict[str, Any] = {"arguments": arguments}
    if tool_call_id is not None:
        body["tool_call_id"] = tool_call_id
    timeout = tool_call_timeout_s("shell", arguments, default_timeout_s)
    return Call("POST", f"/v1/runs/{segment(run_id)}/tools/shell", Request(lambda _: None, json=body, timeout_s=timeout))


def output_arguments(process_id: str, since: int, wait_s: float | None, max_bytes: int | None) -> dict[str, Any]:
    arguments: dict[str, Any] = {"process_id": process_id, "since": since}
    if wait_s is not None:
        arguments["wait_s"] = wait_s
    if max_bytes is not None:
        arguments["max_bytes"] = max_bytes
    return arguments


def followed(result: ToolResult, since: int) -> tuple[list[OutputChunk], int, bool]:
    """One long poll's chunks, the next cursor and whether the process is complete; a tool
    error (the process is not found) raises it."""
    if not result.ok:
        result.raise_for_error()
    body: Mapping[str, Any] = result.result if isinstance(result.result, Mapping) else {}
    try:
        chunks = [OutputChunk(str(c["stream"]), int(c["cursor"]), str(c["text"])) for c in body["chunks"]]
        cursor, complete = int(body["next"]), bool(body["complete"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidResponseError(f"a process_output answer this client does not know: {exc!r}", code="invalid_response") from exc
    if cursor < since:
        raise InvalidResponseError(f"process_output went back from cursor {since} to {cursor}", code="invalid_response")
    return chunks, cursor, complete


