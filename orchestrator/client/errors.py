"""The client's exceptions. Named `...Error` so they never shadow the server's own error
classes (`orchestrator.errors.NotFound` and the like) in code that imports both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx


class ApiError(Exception):
    """The server refused a request; `code`, `message` and `field` come from its error body."""

    status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str = "error",
        status: int | None = None,
        field: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.message = message
        self.code = code
        if status is not None:
            self.status = status
        self.field = field
        self.details = dict(details or {})


class BadRequestError(ApiError):
    status = 400


class UnauthorizedError(ApiError):
    status = 401


class ForbiddenError(ApiError):
    status = 403


class NotFoundError(ApiError):
    status = 404


class ConflictError(ApiError):
    """409; `code` says which (e.g. `tool_call_id_reused`: the id was sent before with another call)."""

    status = 409


class GoneError(ApiError):
    status = 410


class InvalidRequestError(ApiError):
    status = 422


class UnavailableError(ApiError):
    status = 503


class CleanupPendingError(UnavailableError):
    """A session deletion is not finished yet: repeat the delete to continue it."""


class TransportError(ApiError):
    """The server could not be reached, or the connection broke. A tool call with a
    `tool_call_id` may be repeated with the same id: it will not run twice."""


class InvalidResponseError(ApiError):
    """The server's answer did not have the shape this client knows (a version mismatch)."""


class ToolCallFailed(ApiError):
    """A tool-level failure, raised only by `ToolResult.raise_for_error()`."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    422: InvalidRequestError,
    503: UnavailableError,
}


def error_from_response(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
        error = dict(body.get("error") or {})
    except (ValueError, AttributeError, TypeError):
        error = {}
    code = str(error.pop("code", "http_error"))
    message = str(error.pop("message", response.text[:500] or response.reason_phrase))
    field = error.pop("field", None)
    cls = CleanupPendingError if code == "session_cleanup_pending" else _BY_STATUS.get(response.status_code, ApiError)
    return cls(message, code=code, status=response.status_code, field=field, details=error)
