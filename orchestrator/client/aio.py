"""`AsyncOrchestratorClient`: the same methods as `OrchestratorClient` over an
`httpx.AsyncClient`, for async bot frameworks; each method returns an awaitable of the same
model (requests and parsing are shared: `routes.ClientMethods`)."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

from orchestrator.client.routes import DEFAULT_TIMEOUT_S, Call, ClientMethods


class AsyncOrchestratorClient(ClientMethods):
    """`async with AsyncOrchestratorClient(url, token=...) as bot: await bot.call_tool(...)`."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        admin_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(transport=transport, **self._configure(base_url, token, admin_token, timeout))

    async def __aenter__(self) -> AsyncOrchestratorClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _run(self, call: Call[Any]) -> Any:  # type: ignore[override]  # the awaitable form
        try:
            response = await self._http.send(call.build(self._http, self._admin_headers))
        except httpx.HTTPError as exc:
            raise call.failed(exc) from exc
        return call.finish(response)
