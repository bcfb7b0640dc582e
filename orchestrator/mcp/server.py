"""The MCP server of the runs: one SDK `Server` whose handlers act for the run named in the
request's path (`/v1/runs/{run_id}/mcp`, orchestrator/mcp/endpoint.py puts it into the scope).

Every tools/call goes through the dispatcher exactly like POST /v1/runs/{run_id}/tools/{name}
(identity, audit, limits, tool_call_id records); tools/list is the registry's one description,
the same GET /v1/tools answers. Skills are resources read in the runtime user's sandbox.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from starlette.concurrency import run_in_threadpool

from orchestrator import __version__
from orchestrator.errors import NotFound, OrchestratorError, RunEnded
from orchestrator.log import kv
from orchestrator.mcp.bounded_call import dispatch_whole
from orchestrator.mcp.caller import McpCaller, caller_of
from orchestrator.mcp.skill_reader import SkillReader
from orchestrator.mcp.tool_results import call_result, mcp_tools
from orchestrator.runs.records import RunRecord, RunStatus
from orchestrator.tools.kept_calls import keep_to_its_end
from sandbox_agent.wire import STREAMED_TOOLS

if TYPE_CHECKING:
    from orchestrator.runs.service import RunService
    from orchestrator.sessions.records import SessionRepository
    from orchestrator.tools.dispatch import ToolDispatcher
    from orchestrator.tools.registry import ToolRegistry

log = logging.getLogger(__name__)

SERVER_NAME = "sandbox-orchestrator"
# JSON-RPC server-defined codes (-32000..-32099): the run cannot be used; the data carries our
# structured error (`run_ended`, `not_found`, ...).
RUN_UNAVAILABLE = -32004
# The tools whose calls may run long: they report progress while they run.
LONG_TOOLS = frozenset({"shell", "run_code", "process_start", "process_output"})
# Of those, the ones whose output the agent streams as it comes (docs/processes.md): STREAMED_TOOLS.
# One progress notification carries at most this much output; more is split.
PROGRESS_TEXT_MAX = 4096
# A tool_call_id rides in the request's _meta under this key (MCP has no field for it).
TOOL_CALL_ID_META = "tool_call_id"
TOOL_CALL_ID_MAX = 200


def run_error(exc: OrchestratorError) -> MCPError:
    return MCPError(RUN_UNAVAILABLE, exc.message, data=exc.body())


def check_usable(run: RunRecord, session_deleted: bool) -> None:
    """Pure: refuse a run that cannot take calls, the way the dispatcher does."""
    if run.status is not RunStatus.RUNNING:
        raise RunEnded(f"run {run.run_id} has ended ({run.status.value}); start a new run to call tools")
    if session_deleted:
        raise NotFound(f"session {run.session_id} not found")


def tool_call_id_of(meta: Any) -> str | None:
    """Pure: the optional `_meta.tool_call_id` of a tools/call, bounded like the plain API's."""
    value = meta.get(TOOL_CALL_ID_META) if isinstance(meta, dict) else None
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= TOOL_CALL_ID_MAX:
        raise MCPError(types.INVALID_PARAMS, f"_meta.{TOOL_CALL_ID_META} must be a string of 1-{TOOL_CALL_ID_MAX} characters")
    return value


@dataclass(frozen=True)
class McpParts:
    """What the runs' MCP server uses of the orchestrator (the HTTP layer hands them in, from
    the parts its routes depend on: orchestrator/http/parts.py)."""

    runs: RunService  # the run a request names, its prompt's identity section
    session_repo: SessionRepository  # whether the run's session was deleted
    tools: ToolRegistry  # tools/list: the tools' names and descriptions
    dispatcher: ToolDispatcher  # tools/call, and the skills' files read in the sandbox


class RunMcpServer:
    """Builds the SDK server; its handlers find the run through the request (see McpCaller)."""

    def __init__(self, parts: McpParts, *, progress_interval_s: float, shell_timeout_max_s: float) -> None:
        self._parts = parts
        self._progress_interval_s = progress_interval_s
        self._shell_timeout_max_s = shell_timeout_max_s  # the largest shell timeout tools/list declares
        self._skills = SkillReader(parts.dispatcher)
        self._listed: tuple[tuple[str, ...], list[types.Tool]] | None = None
        self.server: Server[Any] = Server(
            SERVER_NAME,
            version=__version__,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_read_resource=self._read_resource,
        )
        # No OpenTelemetry here (the SDK's default middleware): a span per message for nothing.
        self.server.middleware[:] = [self._instructions]
        discover = self.server.get_request_handler("server/discover")
        assert discover is not None
        self._discover = discover.handler
        self.server.add_request_handler("server/discover", types.RequestParams, self._discover_run)

    # The run, checked: an ended run or a deleted session is a clear MCP error.
    async def _usable_run(self, caller: McpCaller) -> RunRecord:
        def read() -> RunRecord:
            run = self._parts.runs.get(caller.run_id)
            session = self._parts.session_repo.get(run.session_id)
            check_usable(run, session is None or session.deleted)
            return run

        try:
            return await run_in_threadpool(read)
        except OrchestratorError as exc:
            raise run_error(exc) from None

    async def _instructions_for(self, caller: McpCaller) -> str | None:
        run = await self._usable_run(caller)
        try:
            return await run_in_threadpool(self._parts.runs.identity_section_of, run)
        except OrchestratorError as exc:
            raise run_error(exc) from None

    async def _instructions(self, ctx: ServerRequestContext[Any], call_next: Any) -> Any:
        """initialize: the run is checked first, and its answer carries the run's prompt identity
        section (only when the runtime user is not the owner, as in a prompt)."""
        if ctx.method != "initialize":
            return await call_next(ctx)
        instructions = await self._instructions_for(caller_of(ctx))
        result = await call_next(ctx)
        if instructions is not None and isinstance(result, dict):
            result["instructions"] = instructions
        return result

    async def _discover_run(self, ctx: ServerRequestContext[Any], params: types.RequestParams) -> Any:
        # The newer protocol has no initialize: its discovery answer carries the instructions.
        instructions = await self._instructions_for(caller_of(ctx))
        result = await self._discover(ctx, params)
        return result.model_copy(update={"instructions": instructions})

    async def _list_tools(self, ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        caller = caller_of(ctx)
        await self._usable_run(caller)
        tools = self._tools()
        if caller.tools is not None:
            tools = [tool for tool in tools if tool.name in caller.tools]
        return types.ListToolsResult(tools=tools)

    def _tools(self) -> list[types.Tool]:
        """The registry's description as MCP tools, built once per set of registered tools:
        the SDK client lists the tools before its first call, and building every JSON schema
        again each time cost milliseconds."""
        names = tuple(self._parts.tools.names())
        if self._listed is None or self._listed[0] != names:
            described = self._parts.tools.describe(shell_timeout_max_s=self._shell_timeout_max_s)
            self._listed = (names, mcp_tools(described))
        return list(self._listed[1])

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        caller = caller_of(ctx)
        tool_call_id = tool_call_id_of(ctx.meta)
        # A task of its own, kept until it ends: a client that goes away (a closed connection, a
        # cancel) does not stop the call, which ends, is audited and recorded as over the plain
        # API, so a retry with the same tool_call_id gets its result.
        progress = params.name in LONG_TOOLS and _progress_token(ctx.meta) is not None
        # With progress, shell's output comes as it is produced (the agent streams it), each
        # piece a progress notification; the result is the same as without.
        output: OutputQueue | None = OutputQueue() if progress and params.name in STREAMED_TOOLS else None
        task = keep_to_its_end(
            asyncio.ensure_future(
                dispatch_whole(
                    self._parts.dispatcher, caller.run_id, params.name, dict(params.arguments or {}), tool_call_id=tool_call_id,
                    actor=caller.actor, on_output=output.put if output is not None else None,
                )
            ),
            _ended,
        )  # fmt: skip
        try:
            if progress:
                outcome = await self._with_progress(ctx, params.name, task, output)
            else:
                outcome = await asyncio.shield(task)
        except OrchestratorError as exc:  # the run ended or its session went: not a tool result
            raise run_error(exc) from None
        return call_result(outcome.body())

    async def _with_progress(
        self, ctx: ServerRequestContext[Any], tool: str, task: asyncio.Future[Any], output: OutputQueue | None
    ) -> Any:
        """Wait for `task`, sending a progress notification for each piece of output as it comes
        (shell) and a heartbeat every interval without any, and one when it is done: a client
        with a progress token sees a long call alive (and may keep its request timeout from
        firing)."""
        started = anyio.current_time()
        beat = 0
        while True:
            waiting: set[asyncio.Future[Any]] = {task}
            arrived = asyncio.ensure_future(output.wait()) if output is not None else None
            if arrived is not None:
                waiting.add(arrived)
            done, _ = await asyncio.wait(waiting, timeout=self._progress_interval_s, return_when=asyncio.FIRST_COMPLETED)
            if arrived is not None and not arrived.done():
                arrived.cancel()
            for piece in output.take() if output is not None else []:
                beat += 1
                await self._progress(ctx, beat, piece)
            if task in done:
                break
            if not done:
                beat += 1
                await self._progress(ctx, beat, f"{tool} running, {anyio.current_time() - started:.1f} s")
        outcome = task.result()
        await self._progress(ctx, beat + 1, f"{tool} done in {anyio.current_time() - started:.1f} s")
        return outcome

    async def _progress(self, ctx: ServerRequestContext[Any], progress: float, message: str) -> None:
        try:
            await ctx.session.report_progress(progress, None, message)
        except Exception as exc:  # a progress line that cannot be sent never fails the call
            log.info("mcp progress not sent %s", kv(error=type(exc).__name__))

    async def _list_resources(self, ctx: ServerRequestContext[Any], params: Any) -> types.ListResourcesResult:
        caller = caller_of(ctx)
        run = await self._usable_run(caller)
        try:
            resources = await self._skills.list(run, actor=caller.actor)
        except OrchestratorError as exc:
            raise run_error(exc) from None
        return types.ListResourcesResult(resources=resources)

    async def _read_resource(self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        caller = caller_of(ctx)
        run = await self._usable_run(caller)
        try:
            return await self._skills.read(run, str(params.uri), actor=caller.actor)
        except OrchestratorError as exc:
            raise run_error(exc) from None


class OutputQueue:
    """Output pieces from the dispatcher's `on_output` (on the loop), taken as progress texts:
    stderr marked as such, each at most PROGRESS_TEXT_MAX characters. What the agent streams is
    bounded already (the agent limits' `shell_stream_max_bytes` of one call), so the queue is too."""

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self._event = asyncio.Event()

    def put(self, stream: str, text: str) -> None:
        shown = text if stream == "stdout" else f"[stderr] {text}"
        self._pieces.extend(shown[i : i + PROGRESS_TEXT_MAX] for i in range(0, len(shown), PROGRESS_TEXT_MAX))
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()

    def take(self) -> list[str]:
        pieces, self._pieces = self._pieces, []
        self._event.clear()
        return pieces


def _ended(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None and not isinstance(task.exception(), OrchestratorError):
        log.warning("mcp tool call failed %s", kv(error=type(task.exception()).__name__))


def _progress_token(meta: Any) -> Any:
    if not isinstance(meta, dict):
        return None
    return meta.get("progressToken", meta.get("progress_token"))
