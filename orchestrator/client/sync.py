"""`OrchestratorClient`: the API over a blocking `httpx.Client` (methods: `routes.ClientMethods`)."""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Any

import httpx

from orchestrator.client.errors import error_from_response
from orchestrator.client.models import ToolResult
from orchestrator.client.routes import DEFAULT_TIMEOUT_S, Call, ClientMethods
from orchestrator.client.streams import (
    EVENT_STREAM,
    FOLLOW_WAIT_S,
    OutputChunk,
    ShellEvent,
    SseParser,
    followed,
    output_arguments,
    shell_event,
    shell_stream_call,
)


class OrchestratorClient(ClientMethods):
    """One bot's connection to the orchestrator. `admin_token` is used for `/v1/admin/*`;
    `timeout` is the HTTP timeout of every call except tool calls (which follow the call)
    and inbox long polls (which add their `wait_s`)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        admin_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(transport=transport, **self._configure(base_url, token, admin_token, timeout))

    def __enter__(self) -> OrchestratorClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, call: Call[Any]) -> Any:
        try:
            response = self._http.send(call.build(self._http, self._admin_headers))
        except httpx.HTTPError as exc:
            raise call.failed(exc) from exc
        return call.finish(response)

    # --- streams (docs/processes.md) ------------------------------------------------------

    def stream_shell(
        self, run_id: str, command: str, *, timeout_s: float | None = None, tool_call_id: str | None = None
    ) -> Iterator[ShellEvent]:
        """`shell` streamed: `output` events as the command prints, then one `result` event
        with the `ToolResult` a plain `call_tool(run_id, "shell", ...)` returns."""
        call = shell_stream_call(run_id, command, timeout_s, tool_call_id, self._timeout_s)
        request = call.build(self._http, self._admin_headers)
        request.headers["Accept"] = EVENT_STREAM
        try:
            response = self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise call.failed(exc) from exc
        try:
            if response.status_code >= 400:
                response.read()
                raise error_from_response(response)
            parser = SseParser()
            for line in response.iter_lines():
                for event, data in parser.feed(line):
                    shown = shell_event(event, data)
                    if shown is not None:
                        yield shown
        except httpx.HTTPError as exc:
            raise call.failed(exc) from exc
        finally:
            response.close()

    def process_output(
        self,
        run_id: str,
        process_id: str,
        *,
        since: int = 0,
        wait_s: float | None = None,
        max_bytes: int | None = None,
        follow: bool = False,
    ) -> ToolResult | Iterator[OutputChunk]:
        """One `process_output` call (a `ToolResult`); with `follow`, an iterator of its
        output chunks from `since` until the process ended and all of it was read."""
        if not follow:
            return self.call_tool(run_id, "process_output", output_arguments(process_id, since, wait_s, max_bytes))
        return self._follow(run_id, process_id, since, wait_s or FOLLOW_WAIT_S, max_bytes)

    def _follow(self, run_id: str, process_id: str, since: int, wait_s: float, max_bytes: int | None) -> Iterator[OutputChunk]:
        while True:
            result = self.call_tool(run_id, "process_output", output_arguments(process_id, since, wait_s, max_bytes))
            chunks, since, complete = followed(result, since)
            yield from chunks
            if complete:
                return
