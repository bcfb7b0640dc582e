"""A tool call answered as Server-Sent Events (`Accept: text/event-stream`, docs/processes.md):
`output` events (`{"stream", "text"}`) as the sandbox produces them, then exactly one `result`
event whose data is the very body the plain JSON answer would have had.

The call runs as a task of its own, so a bot that disconnects mid-stream does not stop it (it
ends, is audited and recorded like any call). A failure before anything was streamed (the run
is unknown or ended) is the ordinary HTTP error; one after that is an `error` event, since the
status line has gone out already. The queue between the call and a slow bot is bounded by
what the agent streams at most (`shell_stream_max_bytes` of output per call).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from orchestrator.descriptors.budget import DescriptorHold

from orchestrator.errors import OrchestratorError
from orchestrator.log import kv
from orchestrator.sandboxes.calling import OutputSink
from orchestrator.tools.dispatch import ToolOutcome
from orchestrator.tools.kept_calls import keep_to_its_end

EVENT_STREAM = "text/event-stream"
FIRST_EVENT_WAIT_S = 0.5

log = logging.getLogger(__name__)


def wants_events(accept: str | None) -> bool:
    return EVENT_STREAM in (accept or "").lower()


def sse_event(event: str, data: Any) -> bytes:
    # As JSONResponse renders it, so a result event carries the identical JSON.
    body = json.dumps(data, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
    return f"event: {event}\ndata: {body}\n\n".encode()


async def stream_tool_call(run: Callable[[OutputSink], Awaitable[ToolOutcome]], hold: DescriptorHold | None) -> Response:
    """`hold`: the stream's descriptors, given back when it ends (however it ends); None for
    a run that is not there (the call refuses it)."""
    release = hold.release if hold is not None else lambda: None
    try:
        return await _stream(run, release)
    except BaseException:
        release()
        raise


async def _stream(run: Callable[[OutputSink], Awaitable[ToolOutcome]], release: Callable[[], None]) -> Response:
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def on_output(stream: str, text: str) -> None:
        queue.put_nowait(("output", {"stream": stream, "text": text}))

    async def call() -> None:
        try:
            outcome = await run(on_output)
        except OrchestratorError as exc:
            queue.put_nowait(("error", exc))
        except Exception as exc:  # noqa: BLE001 - reported as an event once streaming began
            log.exception("streamed tool call failed %s", kv(error=type(exc).__name__))
            queue.put_nowait(("error", exc))
        else:
            queue.put_nowait(("result", outcome.body()))

    task = asyncio.create_task(call())
    getter = asyncio.ensure_future(queue.get())
    # A refusal (unknown or ended run) comes within milliseconds: wait that long for it, so
    # it is still an HTTP error; a command silent for longer gets its headers meanwhile.
    await asyncio.wait({getter}, timeout=FIRST_EVENT_WAIT_S)
    if getter.done() and getter.result()[0] == "error":
        raise getter.result()[1]  # nothing streamed yet: the ordinary HTTP error

    async def events() -> AsyncIterator[bytes]:
        try:
            if not getter.done():
                yield b": running\n\n"  # an SSE comment: the stream is open, the command runs
            item = await getter
            while True:
                kind, data = item
                if kind == "error":
                    body = data.body() if isinstance(data, OrchestratorError) else {"code": "internal_error", "message": "the call failed"}
                    yield sse_event("error", {"error": body})
                    return
                yield sse_event(kind, data)
                if kind == "result":
                    return
                item = await queue.get()
        finally:  # the bot read the end, or went away
            release()

    response = StreamingResponse(
        events(), media_type=EVENT_STREAM, headers={"Cache-Control": "no-cache"},
        background=BackgroundTask(release),  # also when the stream never started
    )  # fmt: skip
    keep_to_its_end(task)
    return response
