"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from orchestrator import __version__
from orchestrator.http import (
    routes_admin_users,
    routes_collaboration,
    routes_core,
    routes_disk,
    routes_credentials,
    routes_egress,
    routes_templates,
    routes_files,
    routes_identities,
    routes_lookups,
    routes_metrics,
    routes_mcp,
    routes_previews,
    routes_sessions,
    routes_skills,
    routes_uploads,
)
from orchestrator.console.routes import install_console
from orchestrator.http.access_log import AccessLog
from orchestrator.http.auth import has_valid_token
from orchestrator.http.errors import install_error_handlers
from orchestrator.http.openapi import install_docs
from orchestrator.http.parts import ApiParts
from orchestrator.http.request_guard import RequestGuard
from orchestrator.http.request_id import RequestId
from orchestrator.http.tool_call_fast_path import ToolCallFastPath
from orchestrator.service import OrchestratorService
from orchestrator.throttled_log import ThrottledLog, budget_loop_accept_errors


# The framework's own OpenTelemetry hooks (FastAPI 0.16x asks the global tracer, meter and logger
# providers on every request whether one is configured); this server configures none.
_NO_TELEMETRY = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def create_app(service: OrchestratorService) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # The server's accept() out of descriptors: a line per interval, not a traceback a second.
        budget_loop_accept_errors(asyncio.get_running_loop(), ThrottledLog(logging.getLogger("orchestrator.http")))
        service.start()
        try:
            async with mcp.running():
                yield
        finally:
            service.close()

    app = FastAPI(
        title="Sandbox Orchestrator",
        version=__version__,
        description="Per-user sandboxes for multi-user AI agents (docs/api.md).",
        lifespan=lifespan,
        docs_url=None,  # served offline by install_docs
        redoc_url=None,
        **_NO_TELEMETRY,
    )
    parts = ApiParts.of(service)  # what routes depend on (orchestrator/http/parts.py)
    app.state.parts = parts
    api = parts.api  # the HTTP layer's settings section, built once
    install_error_handlers(app)
    app.add_middleware(RequestGuard, settings=api, authorized=lambda authorization: has_valid_token(api, authorization))
    if api.access_log:
        app.add_middleware(AccessLog)  # outside the guard: its refusals are logged too
    app.add_middleware(RequestId)  # added last, so outermost: the access log and the guard see its id
    app.include_router(routes_core.router)
    app.include_router(routes_disk.router)
    app.include_router(routes_admin_users.router)
    app.include_router(routes_sessions.router)
    app.include_router(routes_collaboration.router)
    app.include_router(routes_files.router)
    app.include_router(routes_uploads.router)
    app.include_router(routes_skills.router)
    app.include_router(routes_egress.router)
    app.include_router(routes_templates.router)
    app.include_router(routes_credentials.router)
    app.include_router(routes_previews.router)
    app.include_router(routes_lookups.router)
    app.include_router(routes_identities.router)
    app.include_router(routes_metrics.router)
    install_console(app, parts.api)  # /admin: the web console (docs/admin-console.md)
    mcp = routes_mcp.mount_mcp(app, parts)  # the SDK's transport: not an OpenAPI route
    install_docs(
        app,
        max_user_id=api.max_user_id,
        query_maxima={"wait_s": api.collaboration_inbox_wait_max_s},
    )
    # Before every route: a well-formed tool call skips the framework's matching and dependencies.
    app.router.routes.insert(0, ToolCallFastPath(parts, app.router))
    return app
