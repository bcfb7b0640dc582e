"""A Python client for chat bots and admins (docs/client.md, docs/bots.md), over httpx: `OrchestratorClient`
(blocking) and `AsyncOrchestratorClient` (asyncio) with the same methods.

It needs only httpx and pydantic and imports nothing else of the server: it installs alone as the
`sandbox-orchestrator-client` distribution (deploy/client/, docs/client.md), for a bot whose
framework cannot share the server's dependencies. Every method returns a typed model; an HTTP error
raises a typed `ApiError` subclass carrying the server's structured error (`code`,
`message`, `field`, details). A tool-level failure (200 with `ok: false`, an unknown tool
too) is not an exception: it is a `ToolResult` the model should see, with
`raise_for_error()` for callers that want one.

    with OrchestratorClient("http://127.0.0.1:8700", token="...") as bot:
        session = bot.create_session(owner_user_id=17, channel="feishu_group", group=("feishu", "oc_1"))
        run = bot.start_run(session.session_id, trigger="group_message", speaker_user_id=67)
        result = bot.call_tool(run.run_id, "read_file", {"path": "notes.md"}, tool_call_id="call-1")
"""

from orchestrator.client.aio import AsyncOrchestratorClient
from orchestrator.client.streams import OutputChunk, ShellEvent
from orchestrator.client.errors import (
    ApiError,
    BadRequestError,
    CleanupPendingError,
    ConflictError,
    ForbiddenError,
    GoneError,
    InvalidRequestError,
    InvalidResponseError,
    NotFoundError,
    ToolCallFailed,
    TransportError,
    UnauthorizedError,
    UnavailableError,
    error_from_response,
)
from orchestrator.client.models import *  # noqa: F403 - the models are the client's vocabulary
from orchestrator.client.models import IdentityMode, Trigger, skill_files_from_dir
from orchestrator.client.routes import routes_of, segment, tool_call_timeout_s
from orchestrator.client.sync import OrchestratorClient

__all__ = [
    "ApiError",
    "AsyncOrchestratorClient",
    "BadRequestError",
    "CleanupPendingError",
    "ConflictError",
    "ForbiddenError",
    "GoneError",
    "IdentityMode",
    "InvalidRequestError",
    "InvalidResponseError",
    "NotFoundError",
    "OrchestratorClient",
    "OutputChunk",
    "ShellEvent",
    "ToolCallFailed",
    "TransportError",
    "Trigger",
    "UnauthorizedError",
    "UnavailableError",
    "error_from_response",
    "routes_of",
    "segment",
    "skill_files_from_dir",
    "tool_call_timeout_s",
]
