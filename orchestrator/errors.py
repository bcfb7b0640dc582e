"""Typed errors with stable codes. `orchestrator/http/errors.py` maps them to HTTP in one place."""

from __future__ import annotations

from typing import Any


class OrchestratorError(Exception):
    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        error.update(self.details)
        return error


class InvalidInput(OrchestratorError):
    status_code = 422
    code = "invalid_request"


class Unauthorized(OrchestratorError):
    status_code = 401
    code = "unauthorized"


class Forbidden(OrchestratorError):
    status_code = 403
    code = "forbidden"


class NotFound(OrchestratorError):
    status_code = 404
    code = "not_found"


class Conflict(OrchestratorError):
    status_code = 409
    code = "conflict"


class RunEnded(Conflict):
    """A tool call on a run that has ended: a bot can tell this from other conflicts."""

    code = "run_ended"


class Gone(OrchestratorError):
    status_code = 410
    code = "gone"


class CleanupPending(OrchestratorError):
    status_code = 503
    code = "session_cleanup_pending"


class Unavailable(OrchestratorError):
    status_code = 503
    code = "unavailable"


class ToolError(OrchestratorError):
    """A tool-level failure the model should see: HTTP 200 with `{"ok": false, "error": ...}`.

    Codes: path_escape, foreign_runtime_path, foreign_upload_path, read_only,
    not_found, too_large, timeout, invalid_arguments, forbidden, and a few more named where
    they are raised (sandbox_unavailable, conflict, ...).
    """

    status_code = 200

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.code = code
