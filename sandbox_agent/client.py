"""The orchestrator's client of one agent: HTTP over the agent's Unix socket via
`httpx.HTTPTransport(uds=...)`. Thread-safe (one pooled httpx client)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from sandbox_agent.errors import AgentToolError, AgentUnavailable
from sandbox_agent.wire import Health

_BASE_URL = "http://sandbox-agent"  # the host part is ignored on a Unix socket


class AgentClient:
    def __init__(
        self,
        socket_path: str | Path,
        token: str,
        *,
        timeout_s: float = 660.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.socket_path = str(socket_path)
        self._client = httpx.Client(
            transport=httpx.HTTPTransport(uds=self.socket_path),
            base_url=_BASE_URL,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            headers={"Authorization": f"Bearer {token}"},
        )

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _send(self, method: str, url: str, *, body: bytes | None = None, timeout_s: float | None = None) -> httpx.Response:
        extra: dict[str, Any] = {}
        if timeout_s is not None:
            extra["timeout"] = httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0))
        try:
            if body is None:
                return self._client.request(method, url, **extra)
            return self._client.request(
                method, url, content=body, headers={"Content-Type": "application/json"}, **extra
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise AgentUnavailable(f"agent socket {self.socket_path} does not answer: {exc}", delivered=False) from exc
        except httpx.TransportError as exc:
            raise AgentUnavailable(f"agent at {self.socket_path} failed mid-request: {exc!r}", delivered=True) from exc

    def health(self, *, timeout_s: float | None = None) -> Health:
        response = self._send("GET", "/health", timeout_s=timeout_s)
        if response.status_code != 200:
            raise AgentUnavailable(f"agent health answered {response.status_code}", delivered=True)
        return Health.model_validate_json(response.content)

    def call(self, tool: str, arguments: dict[str, Any], *, cwd: str, timeout_s: float | None = None) -> Any:
        """The tool's result; raises `AgentToolError` for a tool-level failure and
        `AgentUnavailable` when the agent could not be reached."""
        body = json.dumps({"arguments": arguments, "cwd": cwd}).encode()
        response = self._send("POST", f"/v1/tools/{tool}", body=body, timeout_s=timeout_s)
        try:
            payload = response.json()
        except ValueError:
            raise AgentUnavailable(
                f"agent answered {response.status_code} with a body that is not JSON", delivered=True
            ) from None
        if response.status_code == 200 and isinstance(payload, dict) and "ok" in payload:
            if payload["ok"]:
                return payload.get("result")
            error = dict(payload.get("error") or {})
            code = str(error.pop("code", "agent_error"))
            message = str(error.pop("message", "the sandbox agent reported an error"))
            path = error.pop("path", None)
            raise AgentToolError(code, message, path, **error)
        error = payload.get("error", {}) if isinstance(payload, dict) else {}
        if response.status_code == 401:
            raise AgentUnavailable("the agent rejected the token", delivered=False)
        if response.status_code == 404:
            raise AgentToolError("unknown_tool", f"The sandbox agent has no tool {tool}.")
        if response.status_code == 422:
            raise AgentToolError("invalid_arguments", f"The sandbox agent refused the request: {error or payload}")
        raise AgentToolError(
            "agent_error", f"The sandbox agent answered {response.status_code}: {error.get('message', payload)}"
        )
