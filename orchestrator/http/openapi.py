"""The OpenAPI document and the API docs pages (docs/api.md).

- Every operation lists its error responses in the one error shape (orchestrator/http/errors.py):
  the ones any route can give (below), plus what a route declares with `error_responses(...)`.
- A bearer `securityScheme` on the `/v1/` routes, so /docs has an Authorize button.
- `X-Acting-User` is an integer header parameter of the routes that read it (auth.acting_user).
- This instance's own limits: user ids stop at ORCH_MAX_USER_ID, not at the absolute cap.
- /docs and /redoc load their JavaScript and CSS from this server (the `fastapi-offline`
  package ships them), never from a CDN: the docs work on a machine without internet.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import HTMLResponse

from mounts import ids

DOCS_STATIC_URL = "/docs-static"
_DOCS_STATIC_DIR = Path(fastapi_offline.__file__).parent / "static"
SECURITY_SCHEME = "bearerAuth"
# A schema marked with this keeps the absolute user-id cap (see _instance_limits).
ABSOLUTE_CAP = "x-absolute-user-id-cap"


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")  # a code may carry details (limit, request_id, ...)

    code: str = Field(..., description="stable machine-readable code, e.g. not_found, invalid_request")
    message: str = Field(..., description="what went wrong, for a person")
    field: str | None = Field(None, description="the request field at fault, when there is one")


class ErrorOut(BaseModel):
    error: ErrorDetail


# What each status means here and the codes it carries (docs/api.md has the full list).
STATUS_CODES: dict[int, str] = {
    400: "`bad_request`: the body could not be parsed",
    401: "`unauthorized`: missing or wrong bearer token",
    403: "`forbidden`: the token or the acting user may not do this",
    404: "`not_found`: no such resource, or not visible to the acting user",
    405: "`method_not_allowed`",
    408: "`request_timeout`: the request body stalled or took too long",
    409: "`conflict`, `unsafe_directory`, `run_ended`, ...: the resource's state forbids it now",
    410: "`gone`: the resource was deleted",
    413: "`payload_too_large`: the body is larger than this route takes",
    422: "`invalid_request`: the request failed validation (`field` names the first bad field)",
    500: "`internal_error`: an unexpected failure; `request_id` is also in the server log",
    503: "`unavailable`, `session_cleanup_pending`: try again later",
}
# Every /v1/ route can give these: the guard (401, 408, 413), X-Acting-User and role checks
# (403, 422), lookups (404), state (409), the sandbox or a pending cleanup (503), and a bug (500).
V1_STATUSES = (400, 401, 403, 404, 408, 409, 410, 413, 422, 500, 503)
OPEN_STATUSES = (500,)
OPEN_WITH_PARAMETERS = (404, 422, 500)  # e.g. /uploads/{user_id}/{file_name}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route decorator: extra error statuses a route gives, in the one shape."""
    return {status: {"model": ErrorOut, "description": STATUS_CODES.get(status, "error")} for status in statuses}


def _instance_limits(node: Any, max_user_id: int) -> None:
    """In place: a user id's maximum is this instance's ORCH_MAX_USER_ID (a schema-valid id
    is then never refused)."""
    if isinstance(node, dict):
        if node.get(ABSOLUTE_CAP):
            return
        if node.get("maximum") == ids.MAX_USER_ID:
            node["maximum"] = max_user_id
        for value in node.values():
            _instance_limits(value, max_user_id)
    elif isinstance(node, list):
        for value in node:
            _instance_limits(value, max_user_id)


def _query_maxima(doc: dict[str, Any], maxima: dict[str, float]) -> None:
    """In place: query parameters whose upper bound is a setting (e.g. the inbox's wait_s)."""
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "query" and parameter["name"] in maxima:
                    parameter["schema"]["maximum"] = maxima[parameter["name"]]


def describe(app: FastAPI, *, max_user_id: int, query_maxima: dict[str, float] | None = None) -> dict[str, Any]:
    """Pure over the app's routes: the OpenAPI document with the additions above."""
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = doc.setdefault("components", {})
    components.setdefault("securitySchemes", {})[SECURITY_SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "ORCH_API_TOKEN (bot) or ORCH_ADMIN_TOKEN (admin, /v1/admin/*)",
    }
    schemas = components.setdefault("schemas", {})
    error_schema = ErrorOut.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(error_schema.pop("$defs", {}))
    schemas["ErrorOut"] = error_schema
    error_ref = {"$ref": "#/components/schemas/ErrorOut"}
    for path, operations in doc.get("paths", {}).items():
        for method, operation in operations.items():
            protected = path.startswith("/v1/")
            responses = operation.setdefault("responses", {})
            statuses = V1_STATUSES if protected else OPEN_WITH_PARAMETERS if "{" in path else OPEN_STATUSES
            for status in statuses:
                entry = responses.setdefault(str(status), {"description": STATUS_CODES[status]})
                entry["content"] = {"application/json": {"schema": error_ref}}
            if "422" in responses and "HTTPValidationError" in str(responses["422"]):
                responses["422"] = {
                    "description": STATUS_CODES[422],
                    "content": {"application/json": {"schema": error_ref}},
                }
            if protected:
                operation["security"] = [{SECURITY_SCHEME: []}]
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    _instance_limits(doc, max_user_id)
    _query_maxima(doc, query_maxima or {})
    return doc


def allowed_methods(doc: dict[str, Any], path: str) -> list[str]:
    """Pure: every method the document declares for a concrete request path. The router's own
    405 names only the first route whose path matched (one of several for the same path)."""
    methods: set[str] = set()
    for template, operations in doc.get("paths", {}).items():
        if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), path):
            methods.update(method.upper() for method in operations)
    return sorted(methods)


def install_docs(app: FastAPI, *, max_user_id: int, query_maxima: dict[str, float]) -> None:
    """The OpenAPI document (built once) and the offline /docs and /redoc pages."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = describe(app, max_user_id=max_user_id, query_maxima=query_maxima)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.mount(DOCS_STATIC_URL, StaticFiles(directory=_DOCS_STATIC_DIR), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{DOCS_STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_STATIC_URL}/favicon.png",
            swagger_ui_parameters={"persistAuthorization": True},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_STATIC_URL}/favicon.png",
            with_google_fonts=False,
        )
