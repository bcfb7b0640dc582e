"""Dispatching one tool call of a run: validate, pick the acting identity from
the table, run it in the sandbox or on the host, audit it.

A call is awaited on the event loop. Its blocking parts (SQLite, host tools) run in worker
threads of the dispatcher's own executor, never in the server's default pool, so health and
admin routes never queue behind tool calls; a container tool holds no thread while its sandbox
works. Each acting user may have `ORCH_USER_MAX_CONCURRENT_CALLS` calls running; more answer
`busy` at once. The audit row is written before the call runs (outcome `started`) and
completed, with the run's last activity, in the transaction after it: a crash mid-call still
leaves the row of every call that ran.

Whether a call runs is decided in one place (`tools/admission.py`, pure); a call with a
`tool_call_id` is idempotent within its run by the wrapper around that decision
(`Repeats`, orchestrator/tools/call_records.py): its record is written with the `started`
audit row and completed with it; a repeat answers the recorded body, or waits (bounded) for
the running call. An unknown tool name is a tool-level result (`unknown_tool`, listing the
tools), as models do invent names. The calls in flight are counted in the call ledger
(orchestrator/call_ledger.py): the run's for the whole call, the acting user's slot while it
runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from functools import lru_cache, partial
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel

from mounts.fs.spool import SpoolWriteFailed
from mounts.layout import DataLayout
from orchestrator import audit, metrics
from orchestrator.call_ledger import CallLedger, Held, RunCall, UserCall
from orchestrator.clock import now_iso
from orchestrator.errors import ToolError
from orchestrator.log import kv, run_logger
from orchestrator.runs.records import RunRecord, RunRepository
from orchestrator.sandboxes.calling import OutputSink
from orchestrator.sandboxes.router import Routed, SandboxRouter
from orchestrator.sessions.records import SessionRecord, SessionRepository
from orchestrator.state_store import StateStore
from orchestrator.users.repository import UserRepository
from orchestrator.tools.admission import Admitted, Refused, Repeat, admit, person_refusal
from orchestrator.tools.call_records import CallRecords, Repeats, interrupted_body, utc_now
from orchestrator.tools.read_bytes_stream import ReadBytesSpool, StreamedReadBytes, spool_failed
from orchestrator.tools.transfer_slots import TransferSlots
from orchestrator.tools.process_audit import process_events
from orchestrator.tools.registry import ToolCall, ToolPlace, ToolRegistry, ToolSpec
from sandbox_agent.errors import ToolFailure
from sandbox_agent.loop_threads import LoopThreads
from sandbox_agent.wire import CallContext, ReadBytesResult

log = logging.getLogger(__name__)

# Worker threads for the dispatcher's SQLite work and host tools. A user holds at most
# `user_max_concurrent_calls` of them for long (a host tool waiting for its sandbox), so only
# many hostile users at once could make another user's call wait for one.
TOOL_THREADS = 64
STARTED = "started"
_T = TypeVar("_T")


@dataclass(frozen=True)
class ToolOutcome:
    ok: bool
    result: Any = None
    error: dict[str, Any] | None = None
    # A large read_bytes for a caller that streams (the HTTP route): its verified bytes are in
    # a spool file and `result` holds the other fields. The caller sends it, then closes it.
    stream: StreamedReadBytes | None = None

    def body(self) -> dict[str, Any]:
        assert self.stream is None, "a streamed outcome has no body in memory"
        return {"ok": True, "result": self.result} if self.ok else {"ok": False, "error": self.error}

    def recorded_body(self, max_bytes: int) -> dict[str, Any]:
        return self.body() if self.stream is None else self.stream.recorded_body(max_bytes)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()

    @classmethod
    def of_body(cls, body: dict[str, Any]) -> ToolOutcome:
        return cls(ok=True, result=body.get("result")) if body.get("ok") else cls(ok=False, error=body.get("error"))


@dataclass(frozen=True)
class _Call:
    """A call past admission, with its audit row: one that runs (the acting user's `slot`
    held) or one answered without running (`refused`: unknown, invalid, busy)."""

    run: RunRecord
    session: SessionRecord
    tool: str
    spec: ToolSpec | None  # None: an unknown tool, refused
    acting_user: int
    workdir: str
    arguments: BaseModel | None
    entry_id: int
    started: float
    refused: ToolOutcome | None = None  # audited already
    tool_call_id: str | None = None  # set when the call has a record to complete
    actor: str = ""
    slot: Held | None = None
    # A container call's context and where it goes, read in the admission's thread.
    context: CallContext | None = None
    routed: Routed | Exception | None = None


@dataclass(frozen=True)
class _RuntimePaths:
    workdir: str  # the session's runtime dir: a call's working directory
    output_dir: str  # where a long shell output is spooled
    outputs_dir: str  # a session's results (run_code's images)


@lru_cache(maxsize=4096)
def _runtime_paths(layout: DataLayout, user_id: int, session_id: str) -> _RuntimePaths:
    """A session's runtime directories as strings, pure in its arguments: built once per
    (user, session) instead of three `Path`s from the validated ids on every call."""
    return _RuntimePaths(
        str(layout.runtime_dir(user_id, session_id)),
        str(layout.shell_output_dir(user_id, session_id)),
        str(layout.outputs_dir(user_id, session_id)),
    )


def _context(run: RunRecord, paths: _RuntimePaths) -> CallContext:
    # The runtime dir is mounted at its host path: the sandbox sees the same one.
    return CallContext(run_id=run.run_id, session_id=run.session_id, output_dir=paths.output_dir, outputs_dir=paths.outputs_dir)


class ToolDispatcher:
    def __init__(
        self,
        *,
        layout: DataLayout,
        store: StateStore,
        registry: ToolRegistry,
        runs: RunRepository,
        sessions: SessionRepository,
        sandboxes: SandboxRouter,
        ledger: CallLedger,
        call_records: CallRecords,
        repeat_wait_s: Callable[[str, dict[str, Any]], float] = lambda tool, arguments: 60.0,
        transfers: TransferSlots | None = None,
    ) -> None:
        self._layout = layout
        self._store = store
        self._registry = registry
        self._runs = runs
        self._sessions = sessions
        self._sandboxes = sandboxes
        self._ledger = ledger
        self.call_records = call_records
        self._repeats = Repeats(call_records)
        self._repeat_wait_s = repeat_wait_s
        self._transfers = transfers  # None: read_bytes is never streamed
        # Two hops a call (admission, completion): sandbox_agent/loop_threads.py's are the cheapest.
        self._threads = LoopThreads(TOOL_THREADS, "tool-call")

    def close(self) -> None:
        """Let the idle worker threads go; a service used after close() (tests do) gets new ones."""
        threads, self._threads = self._threads, LoopThreads(TOOL_THREADS, "tool-call")
        threads.close()

    def dispatch(
        self, run_id: str, name: str, raw_arguments: dict[str, Any], *, tool_call_id: str | None, actor: str
    ) -> ToolOutcome:
        """The blocking form, for in-process callers without an event loop (benches, tests)."""
        return anyio.run(
            partial(self.dispatch_async, run_id, name, raw_arguments, tool_call_id=tool_call_id, actor=actor)
        )

    async def dispatch_async(
        self, run_id: str, name: str, raw_arguments: dict[str, Any], *, tool_call_id: str | None, actor: str,
        on_output: OutputSink | None = None, stream: bool = False, person: int | None = None,
    ) -> ToolOutcome:  # fmt: skip
        """One call; with `on_output` a container tool streams its output as it comes (the
        outcome is the same; a repeat answered from its record streams nothing). With
        `stream`, a large read_bytes may answer a streamed outcome (`ToolOutcome.stream`): the
        caller sends it and must `close()` it. `person`: the request's `X-Acting-User`, who
        must be the run's person (`admission.person_refusal`, checked on the admission's read)."""
        # Under way from before the run is read: the idle-run sweeper never ends a run mid-call.
        with self._ledger.holding(RunCall(run_id)):
            answer = await self._repeats.answer(
                run_id, tool_call_id, partial(self._repeat_wait_s, name, raw_arguments),
                partial(self._dispatch_once, run_id, name, raw_arguments, tool_call_id=tool_call_id, actor=actor,
                        on_output=on_output, stream=stream, person=person),
            )  # fmt: skip
        if isinstance(answer, ToolOutcome):
            return answer
        repeated = ToolOutcome.of_body(answer)
        log.info("tool call repeat %s", kv(run=run_id, tool=name, tool_call_id=tool_call_id, outcome=_code(repeated)))
        return repeated

    async def _dispatch_once(
        self, run_id: str, name: str, raw_arguments: dict[str, Any], *, tool_call_id: str | None, actor: str,
        on_output: OutputSink | None = None, stream: bool = False, person: int | None = None,
    ) -> ToolOutcome | Repeat:  # fmt: skip
        spec = self._registry.get(name)
        if spec is not None and spec.place is ToolPlace.HOST:
            # A host tool blocks anyway: its checks, its work and its audit in one thread.
            host_call = partial(
                self._dispatch_host, run_id, name, raw_arguments, tool_call_id=tool_call_id, actor=actor, person=person
            )
            return await self._in_thread(host_call)
        admitted = await self._in_thread(
            partial(
                self._admit, run_id, name, raw_arguments, tool_call_id=tool_call_id, actor=actor, person=person, route=True
            )
        )
        if isinstance(admitted, Repeat):
            return admitted
        if admitted.refused is not None:
            self._log(admitted, admitted.refused, 0.0)
            return admitted.refused
        recorded = False
        outcome = None
        try:
            try:
                outcome = await self._run_in_sandbox(admitted, on_output, stream)
            finally:
                assert admitted.slot is not None
                admitted.slot.release()
            duration_ms = round((time.perf_counter() - admitted.started) * 1000, 3)
            await self._in_thread(partial(self._complete, admitted, outcome, duration_ms))
            recorded = True
        except BaseException:
            if outcome is not None:  # a streamed outcome nobody will send: its spool and slot go back
                outcome.close()
            raise
        finally:
            if admitted.tool_call_id is not None and not recorded:  # a broken call: record it as such
                await self._in_thread(partial(self._settle, admitted, recorded))
            elif admitted.tool_call_id is not None:  # recorded: wake its repeats, no thread hop
                self._repeats.completed(admitted.run.run_id, admitted.tool_call_id)
        self._log(admitted, outcome, duration_ms)
        return outcome

    def _in_thread(self, work: Callable[[], _T]) -> asyncio.Future[_T]:
        return self._threads.run(work)

    def _dispatch_host(
        self, run_id: str, name: str, raw_arguments: dict[str, Any], *, tool_call_id: str | None, actor: str,
        person: int | None = None,
    ) -> ToolOutcome | Repeat:
        admitted = self._admit(run_id, name, raw_arguments, tool_call_id=tool_call_id, actor=actor, person=person)
        if isinstance(admitted, Repeat):
            return admitted
        if admitted.refused is not None:
            self._log(admitted, admitted.refused, 0.0)
            return admitted.refused
        recorded = False
        try:
            try:
                outcome = self._run_on_host(admitted, tool_call_id)
            finally:
                assert admitted.slot is not None
                admitted.slot.release()
            duration_ms = round((time.perf_counter() - admitted.started) * 1000, 3)
            metrics.observe_tool_call(admitted.tool, "host", _code(outcome), duration_ms / 1000)
            self._complete(admitted, outcome, duration_ms)
            recorded = True
        finally:
            self._settle(admitted, recorded)
        self._log(admitted, outcome, duration_ms)
        return outcome

    def _admit(
        self, run_id: str, name: str, raw_arguments: dict[str, Any], *, tool_call_id: str | None, actor: str,
        person: int | None = None, route: bool = False,
    ) -> _Call | Repeat:
        """Decide (`admit`, with its repeats), take a slot of the acting user, and write the
        audit row and the call's record, in one transaction (a worker thread). A refusal that
        is not a tool result (the run gone or ended, the session deleted) raises: an HTTP
        error, not audited. With `route`, an admitted call also learns where it goes (the
        router's reads, made in this thread rather than on the event loop)."""
        started = time.perf_counter()
        with self._store.write() as tx:
            # The run and its session read live on every call: an ended run or a deleted
            # session refuses at once.
            run = RunRepository.get_in(tx, run_id)
            session = SessionRepository.get_in(tx, run.session_id) if run is not None else None
            if person is not None:
                is_member = partial(UserRepository.is_group_member_in, tx)
                refused_person = person_refusal(run_id, run, session, person, is_member)
                if refused_person is not None:
                    raise refused_person
            spec = self._registry.get(name)
            decision = self._repeats.admit(
                tx, admit(run_id, run, session, name, spec, raw_arguments, tool_names=self._registry.names),
                run_id=run_id, name=name, raw_arguments=raw_arguments, tool_call_id=tool_call_id,
            )  # fmt: skip
            if isinstance(decision, Repeat):
                return decision
            if isinstance(decision, Refused) and not decision.is_tool_result:
                raise decision.error
            assert run is not None and session is not None and decision.acting_user is not None
            slot: Held | None = None
            if isinstance(decision, Admitted):
                try:
                    slot = self._ledger.take(UserCall(decision.acting_user))
                except ToolError as busy:
                    decision = Refused(busy, decision.acting_user)
            acting_user = decision.acting_user
            refused = ToolOutcome(ok=False, error=decision.error.body()) if isinstance(decision, Refused) else None
            try:
                entry_id = audit.record(
                    tx,
                    actor=actor,
                    action="tool.call",
                    session_id=run.session_id,
                    owner_user_id=run.owner_user_id,
                    runtime_user_id=run.runtime_user_id,
                    **_detail(run, name, acting_user, STARTED if refused is None else _code(refused), 0.0),
                )
                if refused is not None:  # its only row: the run's activity goes with it
                    RunRepository.touch_in(tx, run.run_id, now_iso())
                elif isinstance(decision, Admitted) and decision.tool_call_id is not None:
                    self._repeats.started(tx, run_id, decision)
            except BaseException:
                if slot is not None:
                    slot.release()
                if isinstance(decision, Admitted) and decision.tool_call_id is not None:
                    self._repeats.completed(run_id, decision.tool_call_id)
                raise
        paths = _runtime_paths(self._layout, run.runtime_user_id, run.session_id)
        admitted = decision if isinstance(decision, Admitted) else None
        context = _context(run, paths) if route and admitted is not None else None
        return _Call(
            run, session, name, spec, acting_user, paths.workdir, admitted.arguments if admitted else None, entry_id,
            started, refused, admitted.tool_call_id if admitted else None, actor, slot, context,
            self._sandboxes.route(acting_user, context) if context is not None else None,
        )  # fmt: skip

    async def _run_in_sandbox(
        self, call: _Call, on_output: OutputSink | None = None, stream: bool = False
    ) -> ToolOutcome:
        assert call.arguments is not None and call.spec is not None
        spool = None
        if stream and call.spec.name == "read_bytes" and self._transfers is not None:
            spool = ReadBytesSpool(self._transfers, call.acting_user, self._layout.state_dir, self.call_records.copies)
        try:
            result = await self._sandboxes.call(
                call.acting_user,
                call.spec.name,
                call.arguments.model_dump(mode="json", exclude_none=True),
                cwd=call.workdir,
                context=call.context,
                on_output=on_output,
                spool=spool,
                routed=call.routed,
            )
        except (ToolError, SpoolWriteFailed) as exc:
            if spool is not None:
                spool.close()
            if isinstance(exc, SpoolWriteFailed):  # its words may read the state store: not on the loop
                exc = await self._in_thread(partial(spool_failed, exc))
            return ToolOutcome(ok=False, error=exc.body())
        except BaseException:
            if spool is not None:
                spool.close()
            raise
        if isinstance(result, ToolFailure):  # the sandbox's answer, carried as it is
            if spool is not None:
                spool.close()
            return ToolOutcome(ok=False, error=result.body())
        if spool is not None:
            if spool.file is not None and isinstance(result, ReadBytesResult):
                try:
                    streamed = StreamedReadBytes.of(result, spool)
                except BaseException:  # nobody else holds the spool yet: its slot must not stay taken
                    spool.close()
                    raise
                return ToolOutcome(ok=True, result=streamed.summary(), stream=streamed)
            spool.close()  # a small answer: it came whole, today's path
        if isinstance(result, BaseModel):  # a typed wire result (read_bytes): its JSON form
            result = result.model_dump(mode="json")
        return ToolOutcome(ok=True, result=result)

    def _run_on_host(self, call: _Call, tool_call_id: str | None) -> ToolOutcome:
        assert call.arguments is not None and call.spec is not None and call.spec.handler is not None
        tool_call = ToolCall(
            run=call.run,
            session=call.session,
            acting_user_id=call.acting_user,
            workdir=call.workdir,
            arguments=call.arguments,
            tool_call_id=tool_call_id,
        )
        try:
            return ToolOutcome(ok=True, result=call.spec.handler(tool_call))
        except ToolError as exc:
            return ToolOutcome(ok=False, error=exc.body())

    def _complete(self, call: _Call, outcome: ToolOutcome, duration_ms: float) -> None:
        events = process_events(call.tool, call.arguments.model_dump(mode="json") if call.arguments else {}, outcome.result)
        with self._store.write() as tx:
            audit.complete(tx, call.entry_id, **_detail(call.run, call.tool, call.acting_user, _code(outcome), duration_ms))
            for event in events:  # a background process started, signalled or seen ended
                audit.record(
                    tx,
                    # An exit is seen, not asked for: the sandbox reports it.
                    actor="sandbox" if event.action == "process.exit" else call.actor,
                    action=event.action,
                    session_id=call.run.session_id,
                    owner_user_id=call.run.owner_user_id,
                    runtime_user_id=call.run.runtime_user_id,
                    run_id=call.run.run_id,
                    acting_user_id=call.acting_user,
                    **event.detail,
                )
            RunRepository.touch_in(tx, call.run.run_id, now_iso())  # the run's last activity, same write
            if call.tool_call_id is not None:
                body = outcome.recorded_body(self.call_records.max_result_bytes)
                self.call_records.complete_in(
                    tx, call.run.run_id, call.tool_call_id, body, utc_now(), user_id=call.run.runtime_user_id
                )

    def _settle(self, call: _Call, recorded: bool) -> None:
        """Wake the call's waiting repeats. A call that broke before its outcome was recorded
        is recorded as interrupted, so a repeat never runs it a second time."""
        if call.tool_call_id is None:
            return
        key = (call.run.run_id, call.tool_call_id)
        try:
            if not recorded:
                with self._store.write() as tx:
                    self.call_records.complete_in(
                        tx, key[0], key[1], interrupted_body(key[1]), utc_now(), user_id=call.run.runtime_user_id
                    )
        finally:
            self._repeats.completed(*key)

    def _log(self, call: _Call, outcome: ToolOutcome, duration_ms: float) -> None:
        run = call.run
        run_logger(log, session=run.session_id, owner=run.owner_user_id, runtime_user=run.runtime_user_id).info(
            "tool call %s",
            kv(run=run.run_id, tool=call.tool, acting_user=call.acting_user, outcome=_code(outcome), ms=duration_ms),
        )


def _code(outcome: ToolOutcome) -> str:
    return "ok" if outcome.ok else outcome.error["code"]  # type: ignore[index]


def _detail(run: RunRecord, tool: str, acting_user: int, outcome: str, duration_ms: float) -> dict[str, Any]:
    return {"run_id": run.run_id, "tool": tool, "acting_user_id": acting_user, "outcome": outcome, "duration_ms": duration_ms}
