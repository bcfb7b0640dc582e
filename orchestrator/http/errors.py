"""Mapping errors to HTTP: the one place that does it, so every non-2xx answer has one shape:

    {"error": {"code": "...", "message": "...", "field": "..."?, ...details}}

That holds for the typed errors, request validation, the framework's own routing errors
(404, 405, 400) and unexpected failures (500, whose body names the request id that is also in
the log line with the traceback). docs/api.md describes the shape and the codes.
"""

from __future__ import annotations

import re

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mounts.ids import InvalidIdentifier
from orchestrator.errors import OrchestratorError
from orchestrator.http.openapi import allowed_methods
from orchestrator.http.request_id import HEADER, request_id_of
from orchestrator.log import kv

log = logging.getLogger(__name__)

_LOCATIONS = {"body", "path", "query", "header"}

# The framework raises these itself (no route, wrong method, a body that is not JSON, ...).
HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    503: "unavailable",
}


# Pydantic names the member of a union that failed (`constrained-int`, `function-after[...]`):
# the caller's field is the same whichever member it was (a user id or a platform identity).
_UNION_MEMBER = re.compile(r"constrained-\w+|function-\w+\[.*\]")


def _field(loc: tuple | list) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in _LOCATIONS:
        parts = parts[1:]
    parts = [p for p in parts if not _UNION_MEMBER.fullmatch(p)]
    return ".".join(parts) or "body"


def validation_error(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """Pure: the error object for a failed request validation. The first failing field is
    `field`; the message names up to five failures."""
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    message = "; ".join(f"{_field(e['loc'])}: {e['msg']}" for e in errors[:5]) or "invalid request"
    return {"code": "invalid_request", "message": message, "field": _field(first["loc"])}


def http_error(status: int, detail: Any) -> dict[str, Any]:
    """Pure: the error object for one of the framework's own HTTP errors."""
    message = detail if isinstance(detail, str) and detail else f"HTTP {status}"
    return {"code": HTTP_CODES.get(status, "bad_request" if status < 500 else "internal_error"), "message": message}


def _json(error: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OrchestratorError)
    async def _orchestrator_error(_: Request, exc: OrchestratorError) -> JSONResponse:
        return _json(exc.body(), exc.status_code)

    @app.exception_handler(InvalidIdentifier)
    async def _invalid_id(_: Request, exc: InvalidIdentifier) -> JSONResponse:
        return _json({"code": "invalid_request", "message": exc.message, "field": exc.field}, 422)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _json(validation_error(list(exc.errors())), 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = exc.headers
        if exc.status_code == 405:
            methods = allowed_methods(app.openapi(), request.url.path)
            if methods:
                headers = {**(headers or {}), "Allow": ", ".join(methods)}
        return _json(http_error(exc.status_code, exc.detail), exc.status_code, headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette answers this one outside every middleware, so the id header is set here.
        request_id = request_id_of(request.scope) or "none"
        log.error(
            "unhandled error %s",
            kv(request_id=request_id, method=request.method, path=request.url.path, error=type(exc).__name__),
            exc_info=exc,
        )
        error = {
            "code": "internal_error",
            "message": f"internal server error; quote request id {request_id} when reporting it",
            "request_id": request_id,
        }
        return _json(error, 500, {HEADER.decode(): request_id})
