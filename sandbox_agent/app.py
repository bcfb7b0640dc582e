"""The agent's HTTP API (served on a Unix socket by `sandbox_agent.server`).

- `GET /health` answers without the token: it tells only the BUILD id, uptime, calls in
  flight and the instance id, and a liveness probe should not need a secret.
- `POST /v1/tools/{name}` with `{"arguments": {...}, "cwd": "/abs/workdir"}` and
  `Authorization: Bearer <token>` answers 200 `{"ok": true, "result": ...}` or
  200 `{"ok": false, "error": {"code", "message", "path"}}`. A missing or wrong token is 401,
  an unknown tool 404. An optional `"context": {"run_id", "session_id"}` names what the call
  is for; a call whose run or session was cancelled answers the error code `cancelled`.
- `POST /v1/calls/cancel` with `{"run_id": ..., "session_id": ...}` (token required) kills the
  process trees of the matching calls in flight and answers `{"cancelled": n}` once they ended.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandbox_agent.build import own_build_id
from sandbox_agent.calls import CallCancelled, CallRegistry, cancelled_message
from sandbox_agent.errors import AgentToolError
from sandbox_agent.names import escape_names
from sandbox_agent.path_sandbox import PathSandbox, os_error
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.registry import TOOLS
from sandbox_agent.wire import (
    RAW_RESULT_HEADER,
    AgentConfig,
    CancelRequest,
    CancelResult,
    Health,
    ReadBytesResult,
    ToolRequest,
)

OCTET_STREAM = "application/octet-stream"
CANCEL_BODY_MAX = 4096
# Cancels wait for calls to end: their own small pool, never queued behind the tools they stop.
_CANCEL_THREADS = anyio.CapacityLimiter(4)

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
        # Agent-owned background processes (the processes issue) keep the sandbox alive: that
        # work replaces this with its own "any still running?".
        self.has_running_processes: Callable[[], bool] = lambda: False

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


def run_tool(state: AgentState, name: str, request: ToolRequest) -> dict[str, Any]:
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
        result = function(ToolContext(state.sandbox, state.config, request.cwd, call), arguments)
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


def _json(payload: dict[str, Any], status_code: int = 200) -> Response:
    try:
        body = json.dumps(payload, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        # A file name that is not valid UTF-8 (a lone surrogate after decoding): \xNN escapes
        # and a flag, which every JSON reader downstream can carry (names.py).
        body = json.dumps(escape_names(payload), ensure_ascii=False).encode()
    return Response(body, status_code=status_code, media_type="application/json")


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
        # Tools block (files, subprocesses): they run in the thread pool, never on the loop.
        envelope = await anyio.to_thread.run_sync(run_tool, state, name, body)
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
