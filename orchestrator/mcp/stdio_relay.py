"""`orchestrator mcp`: a stdio MCP server for desktop clients (Claude Desktop, editors).

It starts a run against a running orchestrator (in a given session, or a new web session of
`--owner`), connects to that run's streamable-HTTP endpoint and relays every request to it: the
tools, the skill resources and the instructions are the endpoint's, unchanged, so both surfaces
cannot drift. Both sides are the official SDK; nothing here speaks the protocol by hand. When
the client closes stdin the relay ends the run (succeeded) and exits.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from orchestrator import __version__
from orchestrator.client import ApiError, AsyncOrchestratorClient, TransportError
from orchestrator.log import kv
from orchestrator.mcp.connect import run_session
from orchestrator.mcp.server import SERVER_NAME, TOOL_CALL_ID_META

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayOptions:
    url: str
    token: str | None
    session_id: str | None
    owner_user_id: int | None
    speaker_user_id: int | None
    trigger: str
    channel: str = "web"

    def problem(self) -> str | None:
        """Pure: what is wrong with the options, or None."""
        if (self.session_id is None) == (self.owner_user_id is None):
            return "give exactly one of --session (an existing session) or --owner (a new session of that user)"
        return None


def relay_server(upstream: ClientSession, instructions: str | None) -> Server[Any]:
    """A stdio-side server whose every handler asks the run's endpoint."""

    async def list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return await upstream.list_tools(params=params)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        async def progress(value: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(value, total, message)

        meta = ctx.meta if isinstance(ctx.meta, dict) else {}
        forwarded = {TOOL_CALL_ID_META: meta[TOOL_CALL_ID_META]} if TOOL_CALL_ID_META in meta else None
        result = await upstream.call_tool(
            params.name, params.arguments, progress_callback=progress, meta=forwarded  # type: ignore[arg-type]
        )
        assert isinstance(result, types.CallToolResult)
        return result

    async def list_resources(ctx: ServerRequestContext[Any], params: Any) -> types.ListResourcesResult:
        return await upstream.list_resources(params=params)

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        result = await upstream.read_resource(params.uri)
        assert isinstance(result, types.ReadResourceResult)
        return result

    return Server(
        SERVER_NAME,
        version=__version__,
        instructions=instructions,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )


@asynccontextmanager
async def started_run(bot: AsyncOrchestratorClient, options: RelayOptions) -> AsyncIterator[str]:
    """A run for the relay (its session made first with --owner), ended when the relay stops."""
    session_id = options.session_id
    if session_id is None:
        assert options.owner_user_id is not None
        session = await bot.create_session(owner_user_id=options.owner_user_id, channel=options.channel)
        session_id = session.session_id
    run = await bot.start_run(session_id, trigger=options.trigger, speaker_user_id=options.speaker_user_id)
    log.info("mcp relay run started %s", kv(run=run.run_id, session=session_id, runtime_user=run.runtime_user_id))
    try:
        yield run.run_id
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await bot.end_run(run.run_id)
                log.info("mcp relay run ended %s", kv(run=run.run_id))
            except Exception as exc:  # already ended (idle sweep, an admin): nothing left to do
                log.warning("mcp relay could not end its run %s", kv(run=run.run_id, error=exc))


async def relay(options: RelayOptions) -> None:
    async with AsyncOrchestratorClient(options.url, token=options.token) as bot:
        async with started_run(bot, options) as run_id, anyio.create_task_group() as tasks:
            # A client that stops the relay with SIGTERM (or ^C) instead of closing stdin: the
            # run is still ended (started_run's exit), then the relay exits.
            tasks.start_soon(_stop_on_signal, tasks.cancel_scope)
            async with run_session(options.url, run_id, options.token) as (upstream, initialized):
                server = relay_server(upstream, initialized.instructions)
                async with stdio_server() as (read, write):
                    # Returns when the client closes stdin.
                    await server.run(read, write, server.create_initialization_options())
            tasks.cancel_scope.cancel()


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for received in signals:
            log.info("mcp relay stopping %s", kv(signal=signal.Signals(received).name))
            scope.cancel()
            return


def main(options: RelayOptions) -> int:
    problem = options.problem()
    if problem is not None:
        print(f"orchestrator mcp: {problem}", file=sys.stderr)
        return 2
    try:
        anyio.run(relay, options)
    except (ApiError, TransportError) as exc:  # no run to relay to: one line, not a traceback
        print(f"orchestrator mcp: cannot start a run at {options.url}: {exc}", file=sys.stderr)
        return 1
    return 0
