"""Mapping typed errors to HTTP: the one place that does it."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from mounts.ids import InvalidIdentifier
from orchestrator.errors import OrchestratorError

_LOCATIONS = {"body", "path", "query", "header"}


def _field(loc: tuple | list) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in _LOCATIONS:
        parts = parts[1:]
    return ".".join(parts) or "body"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OrchestratorError)
    async def _orchestrator_error(_: Request, exc: OrchestratorError) -> JSONResponse:
        return JSONResponse({"error": exc.body()}, status_code=exc.status_code)

    @app.exception_handler(InvalidIdentifier)
    async def _invalid_id(_: Request, exc: InvalidIdentifier) -> JSONResponse:
        error = {"code": "invalid_request", "message": exc.message, "field": exc.field}
        return JSONResponse({"error": error}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
        field = _field(first["loc"])
        message = "; ".join(f"{_field(e['loc'])}: {e['msg']}" for e in errors[:5])
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors]
        return JSONResponse(
            {"error": {"code": "invalid_request", "message": message, "field": field}, "detail": detail},
            status_code=422,
        )
