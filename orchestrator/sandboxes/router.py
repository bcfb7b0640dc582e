"""Routing a user to their sandbox: the backend that runs it and the plan it runs with (the
user's groups, each with its own gid), where each call goes the one way of `SandboxCaller`;
and stopping the calls of an ended run or a deleted session
(`cancel_calls`), which no call for it may outrun."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import lru_cache
from typing import Any, BinaryIO, TypeVar

import anyio

from mounts.layout import DataLayout, GroupRef
from mounts.plan import MountPlan, plan_mounts
from orchestrator.call_ledger import CallLedger, RoutedCall
from orchestrator.sandboxes.agent_calls import tool_error, tool_failure
from orchestrator.sandboxes.base import LiveAgent, SandboxBackend, SandboxStatus, SandboxTemplate, SandboxUser
from orchestrator.sandboxes.calling import OutputSink, SandboxCaller
from orchestrator.errors import InvalidInput, ToolError
from orchestrator.users.group_gids import GroupGids, GroupGidsExhausted
from orchestrator.log import kv
from orchestrator.settings import CallSettings
from orchestrator.users.repository import UserRecord, UserRepository
from sandbox_agent.client import RawSpool, SinkSpool, blocking
from sandbox_agent.errors import ToolFailure
from sandbox_agent.wire import CallContext

# A call's backend and the sandbox it runs in.
Routed = tuple[SandboxBackend, SandboxUser]
B = TypeVar("B")

log = logging.getLogger(__name__)

CANCEL_DRAIN_S = 30.0  # how long a cancel waits for the calls it stopped to come back
_CANCEL_RETRY_S = 0.05


@lru_cache(maxsize=4096)
def _plan(layout: DataLayout, user_id: int, memberships: tuple[tuple[GroupRef, int], ...]) -> MountPlan:
    # Pure in its arguments, and memberships (with their gids) are read live for every call: a
    # plan cached under old memberships is simply never asked for again (no invalidation to
    # get wrong). Planning and hashing it cost more than that read.
    return plan_mounts(layout, user_id, [group for group, _ in memberships], dict(memberships))


# The isolation order (docs/decisions.md, "Backend overrides and the isolation floor"): a docker
# container (own mount, pid, network and user namespaces) > a process agent in a bwrap mount
# namespace > a plain process agent (only the uid and the PathSandbox).
_ISOLATION = {
    ("kubernetes", "none"): 2, ("kubernetes", "bwrap"): 2,
    ("docker", "none"): 2, ("docker", "bwrap"): 2,
    ("process", "bwrap"): 1, ("process", "none"): 0,
}  # fmt: skip


def isolation_rank(backend: str, process_sandbox: str) -> int:
    return _ISOLATION.get((backend, process_sandbox), 0)


def effective_backend(override: str | None, default: str, available: Collection[str], *, process_sandbox: str) -> str:
    """The backend a user runs on: its override when that backend is registered and isolates at
    least as much as the operator's default (the floor), else the default. Also applied to
    overrides stored before the floor existed."""
    if override in (None, "auto") or override not in available:
        return default
    if isolation_rank(override, process_sandbox) < isolation_rank(default, process_sandbox):
        return default
    return override


class BelowIsolationFloor(InvalidInput):
    code = "below_isolation_floor"


def _routed(user_id: int, context: CallContext | None) -> RoutedCall:
    if context is None:
        return RoutedCall(user_id)
    return RoutedCall(user_id, context.run_id, context.session_id)


class SandboxRouter:
    def __init__(
        self,
        calls: CallSettings,
        layout: DataLayout,
        users: UserRepository,
        group_gids: GroupGids,
        backends: Mapping[str, SandboxBackend],
        default_backend: str,
        *,
        process_sandbox: str = "none",
        call_guards: Sequence[Callable[[int, str, dict[str, Any]], None]] = (),
        call_hooks: Sequence[Callable[[int, CallContext | None], None]] = (),
        explain_no_space: Callable[[int, ToolError], ToolError] | None = None,
        resources_of: Callable[[int], tuple[float | None, int | None]] = lambda _user_id: (None, None),
        template_of: Callable[[int, tuple[str | None, str | None]], SandboxTemplate | None] | None = None,
        ledger: CallLedger | None = None,
    ) -> None:
        self._layout = layout
        self._users = users
        self._group_gids = group_gids
        self.backends = dict(backends)
        self.default_backend = default_backend
        self.process_sandbox = process_sandbox
        # The calls in flight (orchestrator/call_ledger.py): each is a `RoutedCall` from the
        # sandbox's choice to its answer, so a cancel refuses the next and waits for these.
        self.ledger = ledger if ledger is not None else CallLedger(user_max_calls=calls.user_max_concurrent_calls)
        self.caller = SandboxCaller(calls)
        # Disk quotas (orchestrator/quotas/): checks before a call (scan mode refuses an
        # over-quota user's writes; none on the kernel path) and the rewording of a no_space
        # answer so it names the quota.
        # Run before every call with (user, tool, arguments): a refusal raises (disk quotas).
        self.call_guards = list(call_guards)
        self.explain_no_space = explain_no_space
        # A user's CPU and memory override (cpus, memory_mb), None each for the default.
        self.resources_of = resources_of
        # Run before every call with (user, context): the egress proxy keeps its listener up.
        self.call_hooks = list(call_hooks)
        # The template a user's sandbox runs for a call made for (session, run), both None
        # outside a run (orchestrator/templates/); None: the default image.
        self.template_of = template_of

    def sandbox_user(self, user_id: int, context: CallContext | None = None) -> SandboxUser:
        return self._sandbox_user(user_id, context, self._users.get(user_id))

    def _sandbox_user(self, user_id: int, context: CallContext | None, record: UserRecord | None) -> SandboxUser:
        if self._users.purged.is_purged(user_id):  # a call that raced the purge starts nothing
            raise ToolError("user_purged", f"User {user_id} was purged; no sandbox starts for it. The tool did not run.")
        try:
            groups = self._group_gids.memberships_of(user_id)
        except GroupGidsExhausted as exc:
            raise ToolError(
                "sandbox_unavailable",
                f"The sandbox of user {user_id} cannot be planned ({exc}). The tool did not run; "
                "tell the user the sandbox service needs an operator.",
            ) from exc
        cpus, memory_mb = self.resources_of(user_id)
        facts = (context.session_id, context.run_id) if context is not None else (None, None)
        template = self.template_of(user_id, facts) if self.template_of is not None else None
        return SandboxUser(
            user_id, _plan(self._layout, user_id, tuple(groups.items())), cpus=cpus, memory_mb=memory_mb,
            template=template, display_name=record.display_name if record is not None else None,
        )  # fmt: skip

    def backend_name_for(self, user_id: int) -> str:
        return self._backend_name(self._users.get(user_id))

    def _backend_name(self, record: UserRecord | None) -> str:
        override = record.backend if record is not None else None
        return effective_backend(override, self.default_backend, self.backends.keys(), process_sandbox=self.process_sandbox)

    def check_override(self, backend: str | None) -> None:
        """Raises `BelowIsolationFloor` for an override that would isolate less than the default."""
        if backend in (None, "auto"):
            return
        if isolation_rank(backend, self.process_sandbox) < isolation_rank(self.default_backend, self.process_sandbox):
            raise BelowIsolationFloor(
                f"backend {backend} isolates less than this server's floor ({self.default_backend}"
                f"{', bwrap' if self.default_backend == 'process' and self.process_sandbox == 'bwrap' else ''}); "
                "the operator's ORCH_BACKEND is the least isolation any user gets",
                field="backend",
                floor=self.default_backend,
            )

    def backend_for(self, user_id: int) -> SandboxBackend:
        return self._registered(user_id, self.backend_name_for(user_id))

    def _backend_and_user(self, user_id: int, context: CallContext | None = None) -> Routed:
        """What a call needs, from one read of the user's row."""
        record = self._users.get(user_id)
        return self._registered(user_id, self._backend_name(record)), self._sandbox_user(user_id, context, record)

    def route(self, user_id: int, context: CallContext | None = None) -> Routed | Exception:
        """Blocking (a worker thread): the backend and the sandbox a call of `user_id` goes to
        (reads of the user's row and memberships, and a gid allocated when one is missing), or
        why none can be planned. For `call(routed=...)`, which raises that error after its
        guards, where it always came."""
        try:
            return self._backend_and_user(user_id, context)
        except Exception as failed:  # noqa: BLE001 - handed to `call`, which raises it
            return failed

    def _registered(self, user_id: int, name: str) -> SandboxBackend:
        backend = self.backends.get(name)
        if backend is None:
            raise ToolError(
                "sandbox_unavailable",
                f"No sandbox backend is available for user {user_id} (wanted: {name}). "
                "The tool cannot run now; tell the user the sandbox service is not ready.",
            )
        return backend

    def backend_named(self, name: str, kind: type[B]) -> B | None:
        """The registered backend `name` when it is a `kind` (for what only that backend
        reports, e.g. the process backend's isolation), else None."""
        backend = self.backends.get(name)
        return backend if isinstance(backend, kind) else None

    async def call(
        self, user_id: int, tool: str, arguments: dict[str, Any], *, cwd: str, context: CallContext | None = None,
        on_output: OutputSink | None = None, spool: RawSpool | None = None, routed: Routed | Exception | None = None,
    ) -> Any:  # fmt: skip
        """Run one tool in the user's sandbox on the event loop (`SandboxCaller.call`): its
        result or its `ToolFailure` (a host refusal raises `ToolError`); with
        `on_output`, streamed (its output as it comes); `spool`: where a large raw read_bytes
        answer goes. `routed`: `route()`'s answer, read in a worker thread the caller was in
        anyway (the tool dispatcher's admission); without it the reads are made here, on the
        loop (SQLite reads in WAL mode never wait for a writer)."""
        for guard in self.call_guards:
            guard(user_id, tool, arguments)
        if isinstance(routed, Exception):
            raise routed
        backend, user = routed if routed is not None else self._backend_and_user(user_id, context)
        for hook in self.call_hooks:
            hook(user_id, context)
        with self.ledger.holding(_routed(user_id, context)):
            result = await self.caller.call(
                backend, user, tool, arguments, cwd=cwd, context=context, on_output=on_output, spool=spool
            )
            if isinstance(result, ToolFailure) and result.code == "no_space" and self.explain_no_space is not None:
                # Naming who fills a shared place walks it: in a worker thread, not on the loop.
                explained = await anyio.to_thread.run_sync(self.explain_no_space, user_id, tool_error(result))
                return tool_failure(explained)
            return result

    def warm_agent(self, user_id: int) -> LiveAgent | None:
        """The user's agent when it can take a connection as it is (the event loop's path)."""
        backend, user = self._backend_and_user(user_id)
        return backend.warm(user)

    def live_agent(self, user_id: int) -> LiveAgent:
        """Blocking (a worker thread): the user's agent, its sandbox resumed when paused and
        started when stopped (a preview's visitor, docs/previews.md)."""
        backend, user = self._backend_and_user(user_id)
        return backend.warm(user) or backend.resume(user) or backend.ensure(user)

    def call_blocking(
        self, user_id: int, tool: str, arguments: dict[str, Any], *, cwd: str, context: CallContext | None = None,
        sink: BinaryIO | None = None,
    ) -> Any:  # fmt: skip
        """`call` for code running in a worker thread (host tools), through the agent client's
        sync façade: `sink` receives read_bytes' bytes as they arrive (a seekable file,
        emptied before each send). A host tool handles failures as exceptions: a
        `ToolFailure` is raised as the `ToolError` its answer will carry."""
        spool = SinkSpool(sink) if sink is not None else None
        result = blocking(self.call(user_id, tool, arguments, cwd=cwd, context=context, spool=spool))
        if isinstance(result, ToolFailure):
            raise tool_error(result)
        return result

    def cancel_calls(self, user_id: int, *, run_id: str | None = None, session_id: str | None = None) -> int:
        """Stop the user's calls for this run or session (whole process trees) and return how
        many the sandbox stopped, once every such call of this router came back. From now on a
        call for them is refused here. No-op (0) when the user has no live sandbox."""
        if run_id is None and session_id is None:
            raise ValueError("cancel_calls needs a run_id or a session_id")
        self.ledger.cancel(run_id, session_id)
        self._thaw(user_id)
        stopped = self._cancel_everywhere(user_id, run_id, session_id)
        # A call that was on its way (starting the sandbox, or on the wire) when the agent
        # answered: ask again until every such call came back, so none outlives the cancel.
        deadline = time.monotonic() + CANCEL_DRAIN_S
        while self.ledger.routed(user_id, run_id, session_id):
            if time.monotonic() > deadline:
                log.warning("calls still in flight after a cancel %s", kv(user=user_id, run=run_id, session=session_id))
                break
            time.sleep(_CANCEL_RETRY_S)
            stopped += self._cancel_everywhere(user_id, run_id, session_id)
        if stopped:
            log.info("calls cancelled %s", kv(user=user_id, run=run_id, session=session_id, count=stopped))
        return stopped

    def _thaw(self, user_id: int) -> None:
        """A paused sandbox cannot answer a cancel: asked while frozen, it was waited on until
        the call deadline and then stopped whole, the user's other sessions with it. Thawed,
        it stops exactly what the cancel names (the reaper pauses it again when idle)."""
        try:
            backend, user = self._backend_and_user(user_id)
        except ToolError:
            return  # no backend for the user: nothing of it runs here
        backend.resume(user)

    def _cancel_everywhere(self, user_id: int, run_id: str | None, session_id: str | None) -> int:
        # Every backend: the user's may have changed since the call started (an override).
        return sum(b.cancel_calls(user_id, run_id=run_id, session_id=session_id) for b in self.backends.values())

    def status(self) -> list[SandboxStatus]:
        return [status for backend in self.backends.values() for status in backend.status()]

    def close(self) -> None:
        self.caller.close()
        for backend in self.backends.values():
            backend.close()
