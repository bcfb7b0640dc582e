"""The agent's HTTP API (served on a Unix socket by `sandbox_agent.server`).

- `GET /health` answers without the token: it tells only the BUILD id, uptime, calls in
  flight and the instance id, and a liveness probe should not need a secret.
- `POST /v1/tools/{name}` with `{"arguments": {...}, "cwd": "/abs/workdir"}` and
  `Authorization: Bearer <token>` answers 200 `{"ok": true, "result": ...}` or
  200 `{"ok": false, "error": {"code", "message", "path"}}`. A missing or wrong token is 401,
  an unknown tool 404. An optional `"context": {"run_id", "session_id"}` names what the call
  is for; a call whose run or session was cancelled answers the error code `cancelled`.
- `POST /v1/calls/cancel` with `{"run_id": ..., "session_id": ...}` (token required) kills the
  process trees of the matching calls in flight (and, for a session, its background processes)
  and answers `{"cancelled": n}` once they ended.
- `POST /v1/tools/shell` with `Accept: application/x-ndjson` streams the call: one JSON line
  `{"event": "output", "stream", "text"}` per chunk as it is read (UTF-8 decoded without
  splitting a character, at most `shell_stream_max_bytes` in all), then one line
  `{"event": "result", "ok", ...}`: the envelope of the plain answer.
"""

from __future__ import annotations

import asyncio
import codecs
import hmac
import json
import logging
import os
import threading
import time
from functools import partial
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sandbox_agent.build import own_build_id
from sandbox_agent.calls import CallCancelled, CallRegistry, cancelled_message
from sandbox_agent.errors import AgentToolError
from sandbox_agent.loop_threads import LoopThreads
from sandbox_agent.names import escape_names
from sandbox_agent.path_sandbox import PathSandbox, os_error
from sandbox_agent.kernels import KernelTable
from sandbox_agent.processes import ProcessTable
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.registry import TOOLS
from sandbox_agent.wire import (
    RAW_RESULT_HEADER,
    STREAMED_TOOLS,
    AgentConfig,
    CancelRequest,
    CancelResult,
    Health,
    ReadBytesResult,
    ToolRequest,
)

OCTET_STREAM = "application/octet-stream"
NDJSON = "application/x-ndjson"
EVENT_FRAMING_BYTES = 64  # what one output line costs besides its text, against the stream's budget
CANCEL_BODY_MAX = 4096
# Cancels wait for calls to end: their own small pool, never queued behind the tools they stop.
_CANCEL_THREADS = anyio.CapacityLimiter(4)
TOOL_THREADS = 40

log = logging.getLogger("sandbox_agent")


class AgentState:
    def __init__(self, config: AgentConfig, sandbox: PathSandbox, token: str) -> None:
        self.config = config
        self.sandbox = sandbox
        self._token = token.encode()
        self.started = time.monotonic()
        self._busy = 0
        self._lock = threading.Lock()
        self.calls = CallRegistry()
        # When the last authenticated call ended (or the agent started): the dead-man switch's
        # clock. /health does not count: a probe must not keep an orphan alive.
        self.last_call = self.started
        limits = config.limits
        self.processes = ProcessTable(
            max_processes=limits.process_max_count,
            spool_bytes=limits.process_spool_bytes,
            max_runtime_s=limits.process_max_runtime_s,
        )
        self.kernels = KernelTable(max_kernels=limits.kernels_max, idle_s=limits.kernel_idle_s)
        # The tools' threads (a tool blocks: files, subprocesses), as many as anyio's default.
        self.tool_threads = LoopThreads(TOOL_THREADS, "tool")
        # Background processes keep the sandbox alive (the dead-man switch waits for them).
        self.has_running_processes: Callable[[], bool] = lambda: self.processes.running_count() > 0

    def token_ok(self, header: str | None) -> bool:
        if not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[7:].strip().encode(), self._token)

    @property
    def busy(self) -> int:
        return self._busy

    def enter(self) -> None:
        with self._lock:
            self._busy += 1

    def leave(self) -> None:
        with self._lock:
            self._busy -= 1
            self.last_call = time.monotonic()

    def idle_for(self, now: float) -> float | None:
        """Seconds without a call as of `now`, or None while something keeps it busy."""
        with self._lock:
            if self._busy:
                return None
            last = self.last_call
        return None if self.has_running_processes() else now - last


def _invalid_arguments(exc: ValidationError) -> dict[str, Any]:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()[:5]
    )
    return {"code": "invalid_arguments", "message": f"Invalid tool arguments: {problems}"}


def run_tool(
    state: AgentState,
    name: str,
    request: ToolRequest,
    on_output: Callable[[str, bytes], None] | None = None,
) -> dict[str, Any]:
    """One tool call → the response envelope (never raises for tool-level failures)."""
    model, function = TOOLS[name]
    if not request.cwd.startswith("/"):
        return {"ok": False, "error": {"code": "invalid_arguments", "message": "cwd must be absolute"}}
    try:
        arguments = model.model_validate(request.arguments)
    except ValidationError as exc:
        return {"ok": False, "error": _invalid_arguments(exc)}
    try:
        call = state.calls.begin(request.context)
    except CallCancelled as exc:
        return {"ok": False, "error": {"code": "cancelled", "message": str(exc)}}
    state.enter()
    try:
        context = ToolContext(state.sandbox, state.config, request.cwd, call, state.processes, on_output, state.kernels)
        result = function(context, arguments)
        if call.cancelled:  # what it did before it was stopped is not a result
            message = cancelled_message(call.context)
            return {"ok": False, "error": {"code": "cancelled", "message": message}}
        return {"ok": True, "result": result}
    except AgentToolError as exc:
        return {"ok": False, "error": exc.body()}
    except OSError as exc:
        return {"ok": False, "error": os_error(exc, getattr(arguments, "path", None) or request.cwd).body()}
    except Exception as exc:  # a bug must still answer in the envelope, and be logged
        log.exception("tool %s failed", name)
        return {
            "ok": False,
            "error": {"code": "internal_error", "message": f"The sandbox agent failed: {type(exc).__name__}: {exc}"},
        }
    finally:
        state.leave()
        state.calls.end(call)


def _encode(payload: dict[str, Any]) -> bytes:
    try:
        return json.dumps(payload, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        # A file name that is not valid UTF-8 (a lone surrogate after decoding): \xNN escapes
        # and a flag, which every JSON reader downstream can carry (names.py).
        return json.dumps(escape_names(payload), ensure_ascii=False).encode()


def _json(payload: dict[str, Any], status_code: int = 200) -> Response:
    return Response(_encode(payload), status_code=status_code, media_type="application/json")


def _streamed(state: AgentState, name: str, body: ToolRequest) -> StreamingResponse:
    """The call in a worker thread; its output chunks, then its envelope, as JSON lines."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    budget = [state.config.limits.shell_stream_max_bytes]
    budget_lock = threading.Lock()
    decoders: dict[str, codecs.IncrementalDecoder] = {}

    def on_output(stream: str, data: bytes) -> None:  # in the stream's reader thread
        with budget_lock:
            piece = data[: max(0, budget[0] - EVENT_FRAMING_BYTES)]
            budget[0] -= len(piece) + EVENT_FRAMING_BYTES  # many tiny reads must not flood either
            last = budget[0] <= EVENT_FRAMING_BYTES
        if not piece:
            return
        decoder = decoders.setdefault(stream, codecs.getincrementaldecoder("utf-8")("replace"))
        event: dict[str, Any] = {"event": "output", "stream": stream, "text": decoder.decode(piece, final=last)}
        if last:
            event["stream_truncated"] = True  # the rest is only in the result (head, tail, spool file)
        loop.call_soon_threadsafe(queue.put_nowait, event)

    async def work() -> None:
        envelope = await state.tool_threads.run(partial(run_tool, state, name, body, on_output))
        result = envelope.get("result")
        if isinstance(result, ReadBytesResult):
            envelope["result"] = result.model_dump(mode="json")
        queue.put_nowait({"event": "result", **envelope})

    async def lines() -> AsyncIterator[bytes]:
        task = asyncio.create_task(work())
        try:
            while True:
                item = await queue.get()
                yield _encode(item) + b"\n"
                if item["event"] == "result":
                    break
        finally:
            if not task.done():  # the reader went away: the call still ends (its timeout)
                task.add_done_callback(lambda _: None)

    return StreamingResponse(lines(), media_type=NDJSON)


def create_app(state: AgentState) -> Starlette:
    """A plain Starlette app: two routes need no dependency injection or OpenAPI, and
    FastAPI's middleware and routing layers cost about 0.1 ms a call (and import time at
    every agent start)."""

    async def health(_: Request) -> Response:  # nothing here blocks: no thread pool hop
        body = Health(
            build=own_build_id(),
            uptime_s=round(time.monotonic() - state.started, 3),
            busy=state.busy,
            user_id=state.config.user_id,
            pid=os.getpid(),
            instance_id=state.config.instance_id,
            resolver=state.sandbox.resolver,
            processes=state.processes.running_count(),
        )
        return Response(body.model_dump_json(), media_type="application/json")

    async def call_tool(request: Request) -> Response:
        # The token is checked before the body is even read.
        if not state.token_ok(request.headers.get("authorization")):
            return _json({"error": {"code": "unauthorized", "message": "missing or wrong agent token"}}, 401)
        name = request.path_params["name"]
        if name not in TOOLS:
            return _json({"error": {"code": "unknown_tool", "message": f"unknown tool {name}"}}, 404)
        try:
            # json.loads, not pydantic's parser: a file name that is not UTF-8 travels as a
            # lone-surrogate escape, which only Python's json module accepts.
            body = ToolRequest.model_validate(json.loads(await request.body()))
        except (ValueError, ValidationError) as exc:
            return _json({"error": {"code": "invalid_request", "message": str(exc)}}, 422)
        if name in STREAMED_TOOLS and NDJSON in (request.headers.get("accept") or ""):
            return _streamed(state, name, body)
        # Tools block (files, subprocesses): they run in worker threads, never on the loop.
        envelope = await state.tool_threads.run(partial(run_tool, state, name, body))
        result = envelope.get("result")
        if isinstance(result, ReadBytesResult):
            if OCTET_STREAM in (request.headers.get("accept") or ""):
                # The bytes as they are; base64 in JSON cost ~19 ms per MiB here.
                return Response(result.data, media_type=OCTET_STREAM, headers={RAW_RESULT_HEADER: result.raw_header()})
            envelope["result"] = result.model_dump(mode="json")
        return _json(envelope)

    async def cancel_calls(request: Request) -> Response:
        if not state.token_ok(request.headers.get("authorization")):
            return _json({"error": {"code": "unauthorized", "message": "missing or wrong agent token"}}, 401)
        raw = await request.body()
        if len(raw) > CANCEL_BODY_MAX:
            return _json({"error": {"code": "invalid_request", "message": "the body is too large"}}, 413)
        try:
            body = CancelRequest.model_validate_json(raw)
        except ValidationError as exc:
            return _json({"error": {"code": "invalid_request", "message": str(exc)}}, 422)
        count = await anyio.to_thread.run_sync(
            state.calls.cancel, body.run_id, body.session_id, limiter=_CANCEL_THREADS
        )
        if body.session_id is not None:  # a deleted session: its background processes and kernels go too
            count += await anyio.to_thread.run_sync(
                state.processes.kill_session, body.session_id, limiter=_CANCEL_THREADS
            )
            count += await anyio.to_thread.run_sync(
                state.kernels.kill_session, body.session_id, limiter=_CANCEL_THREADS
            )
        log.info("calls cancelled run=%s session=%s count=%d", body.run_id, body.session_id, count)
        return Response(CancelResult(cancelled=count).model_dump_json(), media_type="application/json")

    async def unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unexpected agent error")
        return _json({"error": {"code": "internal_error", "message": str(exc)}}, 500)

    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/tools/{name}", call_tool, methods=["POST"]),
            Route("/v1/calls/cancel", cancel_calls, methods=["POST"]),
        ],
        exception_handlers={Exception: unexpected},
    )
    app.state.agent = state
    return app
