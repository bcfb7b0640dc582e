"""The one way a tool call goes to a sandbox, whatever its backend: ensure the user's agent,
count the call on it, send it within its deadline, and decide in one loop what a failure
means (`next_send`): a request that certainly never reached the agent is sent once more to a
fresh one; one that may have reached it is reported as "may have run", never sent again. The
agent's failures are worded as tool errors in one place (`agent_calls`, docs/backends.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from enum import Enum
from typing import Any

from orchestrator import metrics
from orchestrator.errors import ToolError
from orchestrator.log import kv
from orchestrator.call_ledger import SandboxPaused, on_sandbox
from orchestrator.sandboxes.agent_calls import call_failure, call_timeout_s
from orchestrator.sandboxes.base import LiveAgent, SandboxBackend, SandboxUser
from orchestrator.settings import CallSettings
from sandbox_agent.client import RawSpool
from sandbox_agent.errors import AgentTimedOut, AgentUnavailable, ContextRefused, ToolFailure
from sandbox_agent.wire import CallContext

log = logging.getLogger(__name__)

# A streamed call's output as it comes: (stream, text), on the event loop.
OutputSink = Callable[[str, str], None]

# Worker threads in which callers wait for a sandbox start (`ensure`), apart from the server's
# own pool: a burst of cold starts must not starve the host tools.
START_THREADS = 16


class Send(Enum):
    """What the caller does after a failed send."""

    AGAIN_WITHOUT_CONTEXT = "again_without_context"  # same agent: it refused only the context
    AGAIN_TO_FRESH_AGENT = "again_to_fresh_agent"  # it certainly never ran: once more, elsewhere
    FAIL = "fail"  # it may have run, or the one resend is spent


def next_send(failure: Exception, *, resent_to_fresh: bool) -> Send:
    """Pure: the one decision on a failed send. Only a request that certainly never reached
    the agent (not delivered, or handed to an agent the reaper had just paused) is sent once
    more, to a fresh agent; an agent of an earlier BUILD that refused only the call's context
    is asked again without it (nothing ran)."""
    if isinstance(failure, ContextRefused):
        return Send.AGAIN_WITHOUT_CONTEXT
    not_delivered = isinstance(failure, SandboxPaused) or (isinstance(failure, AgentUnavailable) and not failure.delivered)
    if not_delivered and not resent_to_fresh:
        return Send.AGAIN_TO_FRESH_AGENT
    return Send.FAIL


class SandboxCaller:
    def __init__(self, settings: CallSettings) -> None:
        self._settings = settings
        self._start_threads = _start_pool()

    async def call(
        self, backend: SandboxBackend, user: SandboxUser, tool: str, arguments: dict[str, Any], *, cwd: str,
        context: CallContext | None = None, on_output: OutputSink | None = None, spool: RawSpool | None = None,
    ) -> Any | ToolFailure:  # fmt: skip
        """The tool's result or its `ToolFailure`, as the agent answered; raises `ToolError`
        only for what the host decides (no sandbox, an agent that stopped answering). On any
        event loop: no thread is held while the agent works, only a start waits in a worker
        thread; the warm path hops no thread at all. `spool`: where a large raw read_bytes
        answer goes (`RawSpool`; it hands out an empty file for each send)."""
        with _recorded(backend, tool) as outcome:
            timeout = call_timeout_s(self._settings, tool, arguments)
            agent = backend.warm(user) or await self._started(_resumed_or_ready, backend, user)
            resent_to_fresh = False
            while True:
                try:
                    with on_sandbox(agent.count):
                        if on_output is not None:
                            result = await agent.calls.stream(
                                tool, arguments, cwd=cwd, context=context, timeout_s=timeout, on_output=on_output
                            )
                        else:
                            result = await agent.calls.call(tool, arguments, cwd=cwd, context=context, timeout_s=timeout, spool=spool)
                    return outcome.of(self._noted(agent, tool, result))
                except (AgentUnavailable, SandboxPaused, ContextRefused) as exc:
                    failure = exc
                if isinstance(failure, AgentUnavailable):
                    _forgotten(backend, agent, tool, failure)
                step = next_send(failure, resent_to_fresh=resent_to_fresh)
                if step is Send.AGAIN_WITHOUT_CONTEXT:
                    context = None
                elif step is Send.AGAIN_TO_FRESH_AGENT:
                    resent_to_fresh = True
                    agent = await self._started(backend.ensure, user)  # `ensure` thaws a paused sandbox
                else:
                    if isinstance(failure, SandboxPaused):
                        failure = AgentUnavailable("its sandbox was paused", delivered=False)
                    raise call_failure(agent.user_id, failure) from None

    def close(self) -> None:
        """Let the idle start threads go (a start under way finishes); a caller used after
        close() (tests do) gets new ones."""
        threads, self._start_threads = self._start_threads, _start_pool()
        threads.shutdown(wait=False)

    async def _started(self, start: Callable[..., LiveAgent], *args: Any) -> LiveAgent:
        return await asyncio.get_running_loop().run_in_executor(self._start_threads, start, *args)

    def _noted(self, agent: LiveAgent, tool: str, result: Any) -> Any:
        """Keep the count of background processes a process_* answer carries on the agent."""
        if isinstance(result, dict):
            count = result.get("running_processes")
            if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                started = self._settings.process_max_runtime_s if tool == "process_start" else None
                agent.count.note_processes(count, started_for_s=started)
        return result


def _start_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(START_THREADS, thread_name_prefix="sandbox-start")


@contextmanager
def _recorded(backend: SandboxBackend, tool: str) -> Iterator[_Outcome]:
    """The call on /metrics: its tool, backend, outcome (`ok` or the failure's code) and
    latency, whichever way it ends."""
    started, outcome = time.perf_counter(), _Outcome()
    try:
        yield outcome
    except ToolError as exc:
        outcome.code = exc.code
        raise
    finally:
        metrics.observe_tool_call(tool, backend.name, outcome.code, time.perf_counter() - started)


class _Outcome:
    code = "internal_error"  # until the call returns or raises a tool error

    def of(self, result: Any | ToolFailure) -> Any | ToolFailure:
        self.code = result.code if isinstance(result, ToolFailure) else "ok"
        return result


def _resumed_or_ready(backend: SandboxBackend, user: SandboxUser) -> LiveAgent:
    """Off the warm path: a paused sandbox is thawed (quick), anything else is `ensure`d."""
    return backend.resume(user) or backend.ensure(user)


def _forgotten(backend: SandboxBackend, agent: LiveAgent, tool: str, exc: AgentUnavailable) -> None:
    """An agent that stopped answering is never handed out again."""
    stalled = isinstance(exc, AgentTimedOut)
    backend.forget(agent.user_id, agent=agent, stalled=stalled)
    what = "missed a deadline" if stalled else "failed during a call" if exc.delivered else "was unreachable"
    log.warning(
        "sandbox agent %s; it is replaced %s",
        what,
        kv(user=agent.user_id, backend=backend.name, tool=tool, delivered=exc.delivered, error=exc.message),
    )
