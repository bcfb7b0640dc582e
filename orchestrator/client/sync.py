"""`OrchestratorClient`: the API over a blocking `httpx.Client` (methods: `routes.ClientMethods`)."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

from orchestrator.client.routes import DEFAULT_TIMEOUT_S, Call, ClientMethods


class OrchestratorClient(ClientMethods):
    """One bot's connection to the orchestrator. `admin_token` is used for `/v1/admin/*`;
    `timeout` is the HTTP timeout of every call except tool calls (which follow the call)
    and inbox long polls (which add their `wait_s`)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        admin_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(transport=transport, **self._configure(base_url, token, admin_token, timeout))

    def __enter__(self) -> OrchestratorClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, call: Call[Any]) -> Any:
        try:
            response = self._http.send(call.build(self._http, self._admin_headers))
        except httpx.HTTPError as exc:
            raise call.failed(exc) from exc
        return call.finish(response)
