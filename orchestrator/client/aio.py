"""`AsyncOrchestratorClient`: the same methods as `OrchestratorClient` over an
`httpx.AsyncClient`, for async bot frameworks; each method returns an awaitable of the same
model (requests and parsing are shared: `routes.ClientMethods`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
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


class AsyncOrchestratorClient(ClientMethods):
    """`async with AsyncOrchestratorClient(url, token=...) as bot: await bot.call_tool(...)`."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        admin_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(transport=transport, **self._configure(base_url, token, admin_token, timeout))

    async def __aenter__(self) -> AsyncOrchestratorClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _run(self, call: Call[Any]) -> Any:  # type: ignore[override]  # the awaitable form
        try:
            response = await self._http.send(call.build(self._http, self._admin_headers))
        except httpx.HTTPError as exc:
            raise call.failed(exc) from exc
        return call.finish(response)

    # --- streams (docs/processes.md) ------------------------------------------------------

    async def stream_shell(
        self, run_id: str, command: str, *, timeout_s: float | None = None, tool_call_id: str | None = None
    ) -> AsyncIterator[ShellEvent]:
        """`async for event in bot.stream_shell(...)`: as `OrchestratorClient.stream_shell`."""
        call = shell_stream_call(run_id, command, timeout_s, tool_call_id, self._timeout_s)
        request = call.build(self._http, self._admin_headers)
        request.headers["Accept"] = EVENT_STREAM
        try:
            response = await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise call.failed(exc) from exc
        try:
            if response.status_code >= 400:
                await response.aread()
                raise error_from_response(response)
            parser = SseParser()
            async for line in response.aiter_lines():
                for event, data in parser.feed(line):
                    shown = shell_event(event, data)
                    if shown is not None:
                        yield shown
        except httpx.HTTPError as exc:
            raise call.failed(exc) from exc
        finally:
            await response.aclose()

    def process_output(  # type: ignore[override]
        self,
        run_id: str,
        process_id: str,
        *,
        since: int = 0,
        wait_s: float | None = None,
        max_bytes: int | None = None,
        follow: bool = False,
    ) -> Awaitable[ToolResult] | AsyncIterator[OutputChunk]:
        """Awaitable of one call's `ToolResult`; with `follow`, an async iterator of chunks."""
        if not follow:
            return self.call_tool(run_id, "process_output", output_arguments(process_id, since, wait_s, max_bytes))
        return self._follow(run_id, process_id, since, wait_s or FOLLOW_WAIT_S, max_bytes)

    async def _follow(
        self, run_id: str, process_id: str, since: int, wait_s: float, max_bytes: int | None
    ) -> AsyncIterator[OutputChunk]:
        while True:
            result = await self.call_tool(run_id, "process_output", output_arguments(process_id, since, wait_s, max_bytes))
            chunks, since, complete = followed(result, since)
            for chunk in chunks:
                yield chunk
            if complete:
                return
