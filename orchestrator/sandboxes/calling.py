"""The one way a tool call goes to a sandbox, whatever its backend: ensure the user's agent,
count the call on it, send it within its deadline; when the request certainly never reached
the agent, forget that agent and send it once more to a fresh one; map the agent's failures
to tool errors in one place (docs/backends.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from anyio import CapacityLimiter, to_thread

from orchestrator import metrics
from orchestrator.errors import ToolError
from orchestrator.log import kv
from orchestrator.call_ledger import SandboxPaused, on_sandbox
from orchestrator.sandboxes.agent_calls import call_failure, call_timeout_s, tool_error
from orchestrator.sandboxes.base import LiveAgent, SandboxBackend, SandboxUser
from orchestrator.settings import Settings
from sandbox_agent.client import RawSpool
from sandbox_agent.errors import AgentTimedOut, AgentToolError, AgentUnavailable
from sandbox_agent.wire import CallContext

log = logging.getLogger(__name__)

# A streamed call's output as it comes: (stream, text), on the event loop.
OutputSink = Callable[[str, str], None]

# Worker threads in which event-loop callers wait for a sandbox start (`ensure`), apart from
# the server's own pool: a burst of cold starts must not starve the host tools.
START_THREADS = 16


class SandboxCaller:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._start_threads = CapacityLimiter(START_THREADS)

    async def call(
        self, backend: SandboxBackend, user: SandboxUser, tool: str, arguments: dict[str, Any], *, cwd: str,
        context: CallContext | None = None, on_output: OutputSink | None = None, spool: RawSpool | None = None,
    ) -> Any:  # fmt: skip
        """On the event loop: no thread is held while the agent works, only a start waits in
        a worker thread; the warm path hops no thread at all. `spool`: where a large raw
        read_bytes answer goes (`RawSpool`; it hands out an empty file for each attempt)."""
        streams = (on_output, spool)
        with _recorded(backend, tool):
            timeout = call_timeout_s(self._settings, tool, arguments)
            agent = backend.warm(user) or await to_thread.run_sync(_resumed_or_ready, backend, user, limiter=self._start_threads)
            with _attempt(backend, agent, tool, may_retry=True):
                return self._noted(agent, tool, await self._send(agent, tool, arguments, cwd, context, timeout, *streams))
            agent = await to_thread.run_sync(backend.ensure, user, limiter=self._start_threads)
            with _attempt(backend, agent, tool, may_retry=False):
                return self._noted(agent, tool, await self._send(agent, tool, arguments, cwd, context, timeout, *streams))
            raise AssertionError("unreachable: a last attempt answers or raises")

    def _noted(self, agent: LiveAgent, tool: str, result: Any) -> Any:
        """Keep the count of background processes a process_* answer carries on the agent."""
        if isinstance(result, dict):
            count = result.get("running_processes")
            if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                started = self._settings.process_max_runtime_s if tool == "process_start" else None
                agent.count.note_processes(count, started_for_s=started)
        return result

    @staticmethod
    async def _send(
        agent: LiveAgent, tool: str, arguments: dict[str, Any], cwd: str, context: CallContext | None, timeout: float,
        on_output: OutputSink | None, spool: RawSpool | None,
    ) -> Any:  # fmt: skip
        if on_output is not None:
            return await agent.calls.stream(tool, arguments, cwd=cwd, context=context, timeout_s=timeout, on_output=on_output)
        return await agent.calls.call(tool, arguments, cwd=cwd, context=context, timeout_s=timeout, spool=spool)

    def call_blocking(
        self, backend: SandboxBackend, user: SandboxUser, tool: str, arguments: dict[str, Any], *, cwd: str,
        context: CallContext | None = None, sink: BinaryIO | None = None,
    ) -> Any:  # fmt: skip
        """`call` for a worker thread, on the agent's blocking client: the same deadline, retry
        and errors. `sink`: read_bytes' bytes are written there as they arrive (a seekable
        file, emptied before each attempt)."""
        with _recorded(backend, tool):
            timeout = call_timeout_s(self._settings, tool, arguments)
            agent = backend.warm(user) or _resumed_or_ready(backend, user)
            with _attempt(backend, agent, tool, may_retry=True):
                return self._noted(agent, tool, agent.blocking.call(tool, arguments, cwd=cwd, context=context, timeout_s=timeout, sink=_emptied(sink)))
            agent = backend.ensure(user)
            with _attempt(backend, agent, tool, may_retry=False):
                return self._noted(agent, tool, agent.blocking.call(tool, arguments, cwd=cwd, context=context, timeout_s=timeout, sink=_emptied(sink)))
            raise AssertionError("unreachable: a last attempt answers or raises")


def _emptied(sink: BinaryIO | None) -> BinaryIO | None:
    if sink is not None:  # nothing of a failed attempt stays in it
        sink.seek(0)
        sink.truncate()
    return sink


@contextmanager
def _recorded(backend: SandboxBackend, tool: str) -> Iterator[None]:
    """The call on /metrics: its tool, backend, outcome (`ok` or the tool error's code) and
    latency, whichever way it ends."""
    started, outcome = time.perf_counter(), "internal_error"
    try:
        yield
        outcome = "ok"
    except ToolError as exc:
        outcome = exc.code
        raise
    finally:
        metrics.observe_tool_call(tool, backend.name, outcome, time.perf_counter() - started)


def _resumed_or_ready(backend: SandboxBackend, user: SandboxUser) -> LiveAgent:
    """Off the warm path: a paused sandbox is thawed (quick), anything else is `ensure`d."""
    return backend.resume(user) or backend.ensure(user)


@contextmanager
def _attempt(backend: SandboxBackend, agent: LiveAgent, tool: str, *, may_retry: bool) -> Iterator[None]:
    """One attempt of a call on `agent`: counted on it while it runs, its failures mapped to
    tool errors. When the agent stopped answering it is never handed out again; a request that
    certainly never reached it is let through (the caller sends it once more, to a fresh
    agent: it cannot run twice) when `may_retry`."""
    try:
        with on_sandbox(agent.count):
            yield
    except SandboxPaused:
        if not may_retry:
            raise call_failure(agent.user_id, AgentUnavailable("its sandbox was paused", delivered=False)) from None
        return  # the caller's next attempt resumes it (`ensure` thaws a paused sandbox)
    except AgentToolError as exc:
        raise tool_error(exc) from None
    except AgentUnavailable as exc:
        stalled = isinstance(exc, AgentTimedOut)
        backend.forget(agent.user_id, agent=agent, stalled=stalled)
        what = "missed a deadline" if stalled else "failed during a call" if exc.delivered else "was unreachable"
        log.warning(
            "sandbox agent %s; it is replaced %s",
            what,
            kv(user=agent.user_id, backend=backend.name, tool=tool, delivered=exc.delivered, error=exc.message),
        )
        if exc.delivered or not may_retry:
            raise call_failure(agent.user_id, exc) from None
